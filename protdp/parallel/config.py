"""`ParallelConfig`: Megatron-core's distributed-data-parallel knobs under Megatron's names.

Megatron concept: `DistributedDataParallelConfig` + the batch arithmetic of
`megatron/training/arguments.py` (global_batch_size = micro_batch_size × data_parallel_size ×
num_micro_batches). Only data parallelism exists here; tensor/pipeline sizes are accepted so that a
Megatron-style command line maps 1:1, and anything > 1 is rejected with what to use instead.

Every field carries its flag's help text (`metadata["help"]`): `protdp.train.args.TrainArgs`
extends this dataclass, so each engine knob is defined once, is a `--flag` of the trainer, and is
validated here only. `batch_arithmetic` is the one place that computes and checks
micro × dp × accumulation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from protdp.errors import ConfigError

GRAD_REDUCE_COLLECTIVES = ("auto", "all_reduce", "ring_all_reduce", "reduce_scatter",
                           "ring_reduce_scatter")
PARAM_GATHER_COLLECTIVES = ("auto", "all_gather", "ring_all_gather")


def default_bucket_size(data_parallel_size: int) -> int:
    """Megatron's default bucket size in elements: max(40M, 1M × dp)."""
    return max(40_000_000, 1_000_000 * data_parallel_size)


def knob(name: str) -> str:
    """A config field as users meet it: `micro_batch_size (--micro-batch-size)`."""
    return f"{name} (--{name.replace('_', '-')})"


def batch_arithmetic(micro_batch_size: int, data_parallel_size: int,
                     global_batch_size: int | None) -> tuple[int, int]:
    """(global batch, accumulation steps) from micro × dp × accumulation; the only validator."""
    per_step = micro_batch_size * data_parallel_size
    gbs = per_step if global_batch_size is None else global_batch_size
    if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1 or gbs % per_step:
        near = per_step * max(1, round(gbs / per_step)) if isinstance(gbs, int) else per_step
        raise ConfigError(
            f"--global-batch-size {gbs!r} is not divisible by --micro-batch-size {micro_batch_size} "
            f"x --data-parallel-size {data_parallel_size} = {per_step}: global_batch_size must be "
            f"a positive multiple of micro_batch_size × data_parallel_size (global = micro × dp × "
            f"accumulation steps); use e.g. {near}")
    return gbs, gbs // per_step


def _world_size_hint() -> int:
    """World size from an initialized process group, else from the launcher environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    from protdp.parallel.env import detect_launch_env

    return detect_launch_env(os.environ).world_size


def _f(default, help_text: str):
    """A config field carrying its flag's help text."""
    return field(default=default, metadata={"help": help_text})


@dataclass
class ParallelConfig:
    """Data-parallel configuration (Megatron names); validated in `validate()`."""

    tensor_model_parallel_size: int = _f(1, "tensor model parallel size (only 1: an Evoformer is "
                                            "split by --dap-size instead)")
    pipeline_model_parallel_size: int = _f(1, "pipeline model parallel size (only 1: an Evoformer is "
                                              "split by --dap-size instead)")
    dap_size: int = _f(1, "dynamic axial parallelism: ranks that share one sample, its MSA and pair "
                          "representations split along one axis (FastFold); world = dp x dap")
    data_parallel_size: int | None = _f(None, "data-parallel ranks; default: the launcher's world "
                                              "size / --dap-size")
    micro_batch_size: int = _f(1, "examples per forward/backward on one rank")
    global_batch_size: int | None = _f(None, "examples per optimizer step = micro x dp x accumulation")
    overlap_grad_reduce: bool = _f(True, "launch each gradient bucket's reduction as soon as its "
                                         "grads are ready (overlaps backward)")
    use_distributed_optimizer: bool = _f(False, "shard fp32 master params + optimizer state over DP "
                                                "ranks (ZeRO-1 / Megatron distributed optimizer)")
    overlap_param_gather: bool = _f(False, "overlap the distributed optimizer's param all-gather "
                                           "with the next forward")
    bucket_size: int | None = _f(None, "elements per gradient bucket; default Megatron's "
                                       "max(40M, 1M x dp)")
    grad_reduce_collective: str = _f("auto", "gradient-bucket collective: " + "|".join(
        GRAD_REDUCE_COLLECTIVES) + "; auto: nccl all_reduce (reduce_scatter with the distributed "
        "optimizer), gloo ring_all_reduce (ring_reduce_scatter): point-to-point rings on a comm "
        "thread (protdp.parallel.ring)")
    param_gather_collective: str = _f("auto", "distributed optimizer's param gather: " + "|".join(
        PARAM_GATHER_COLLECTIVES) + "; auto: nccl all_gather, gloo ring_all_gather")
    param_align: int = _f(64, "every parameter starts at a multiple of this many buffer elements")
    check_for_nan_in_grad: bool = _f(True, "check each bucket for NaN/Inf on the local rank before "
                                           "its collective")
    max_consecutive_skipped_steps: int = _f(10, "abort after this many consecutive skipped "
                                                "(non-finite) steps; 0 = never")
    allow_unused_parameters: bool = _f(False, "treat params that got no gradient as zero-gradient "
                                              "instead of raising an error")

    def __post_init__(self):
        if self.data_parallel_size is None:
            dap = self.dap_size if isinstance(self.dap_size, int) and self.dap_size > 0 else 1
            self.data_parallel_size = max(1, _world_size_hint() // dap)
        self.validate()

    def validate(self) -> None:
        """Every engine rule; the batch arithmetic too once data_parallel_size is known."""
        if self.tensor_model_parallel_size != 1:
            raise ConfigError(
                f"{knob('tensor_model_parallel_size')}={self.tensor_model_parallel_size}: tensor "
                "parallelism is not implemented (an Evoformer's activations, not its ~93M "
                "parameters, outgrow a device): use data parallelism (data_parallel_size) with each "
                "sample split over dap_size ranks (--dap-size), use_distributed_optimizer=True to "
                "shard optimizer state, and activation "
                "checkpointing / smaller micro_batch_size to fit memory")
        if self.pipeline_model_parallel_size != 1:
            raise ConfigError(
                f"{knob('pipeline_model_parallel_size')}={self.pipeline_model_parallel_size}: "
                "pipeline parallelism is not implemented (48 identical blocks with recycling leave "
                "pipeline bubbles and no memory win over splitting activations); use dap_size "
                "(--dap-size) and data parallelism with gradient accumulation (global_batch_size > "
                "micro_batch_size × data_parallel_size) instead")
        for name in ("micro_batch_size", "param_align", "dap_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{knob(name)}={value!r}: expected a positive integer")
        for name in ("data_parallel_size", "bucket_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"{knob(name)}={value!r}: expected a positive integer or None")
        if self.data_parallel_size is not None:
            self.global_batch_size, _ = batch_arithmetic(
                self.micro_batch_size, self.data_parallel_size, self.global_batch_size)
        elif self.global_batch_size is not None and (not isinstance(self.global_batch_size, int)
                                                     or self.global_batch_size < 1):
            raise ConfigError(f"{knob('global_batch_size')}={self.global_batch_size!r}: "
                              "expected a positive integer or None")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ConfigError("overlap_param_gather=True requires use_distributed_optimizer=True "
                              "(--overlap-param-gather needs --use-distributed-optimizer: without it "
                              "every rank already holds the updated params)")
        if self.grad_reduce_collective not in GRAD_REDUCE_COLLECTIVES:
            raise ConfigError(f"{knob('grad_reduce_collective')}={self.grad_reduce_collective!r}: "
                              f"expected one of {GRAD_REDUCE_COLLECTIVES}")
        if self.param_gather_collective not in PARAM_GATHER_COLLECTIVES:
            raise ConfigError(f"{knob('param_gather_collective')}={self.param_gather_collective!r}"
                              f": expected one of {PARAM_GATHER_COLLECTIVES}")
        if (self.grad_reduce_collective.endswith("reduce_scatter")
                and not self.use_distributed_optimizer):
            raise ConfigError(f"grad_reduce_collective={self.grad_reduce_collective!r} leaves each "
                              "rank with only its shard of the gradient: it requires "
                              "use_distributed_optimizer=True")
        if self.max_consecutive_skipped_steps < 0:
            raise ConfigError(f"{knob('max_consecutive_skipped_steps')} must be >= 0")

    @property
    def num_micro_batches(self) -> int:
        """Gradient-accumulation steps per optimizer step: global / (micro × dp)."""
        return batch_arithmetic(self.micro_batch_size, self.data_parallel_size,
                                self.global_batch_size)[1]

    @property
    def resolved_bucket_size(self) -> int:
        return self.bucket_size if self.bucket_size is not None else default_bucket_size(
            self.data_parallel_size)
