"""`ParallelConfig`: Megatron-core's distributed-data-parallel knobs under Megatron's names.

Megatron concept: `DistributedDataParallelConfig` + the batch arithmetic of
`megatron/training/arguments.py` (global_batch_size = micro_batch_size × data_parallel_size ×
num_micro_batches). Only data parallelism exists here; tensor/pipeline sizes are accepted so that a
Megatron-style command line maps 1:1, and anything > 1 is rejected with what to use instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from protdp.errors import ConfigError

GRAD_REDUCE_COLLECTIVES = ("auto", "all_reduce", "ring_all_reduce", "reduce_scatter",
                           "ring_reduce_scatter")
PARAM_GATHER_COLLECTIVES = ("auto", "all_gather", "ring_all_gather")


def default_bucket_size(data_parallel_size: int) -> int:
    """Megatron's default bucket size in elements: max(40M, 1M × dp)."""
    return max(40_000_000, 1_000_000 * data_parallel_size)


def _world_size_hint() -> int:
    """World size from an initialized process group, else from the launcher environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    from protdp.parallel.env import detect_launch_env

    return detect_launch_env(os.environ).world_size


@dataclass
class ParallelConfig:
    """Data-parallel configuration (Megatron names); validated in `__post_init__`."""

    data_parallel_size: int | None = None
    """Number of data-parallel ranks; None = the world size of the process group / launcher."""
    micro_batch_size: int = 1
    """Samples per rank per forward/backward (one micro-batch)."""
    global_batch_size: int | None = None
    """Samples per optimizer step over all ranks; None = micro_batch_size × data_parallel_size."""
    overlap_grad_reduce: bool = True
    """Launch each bucket's reduction as soon as its grads are ready (overlaps backward)."""
    use_distributed_optimizer: bool = False
    """Shard fp32 master params + optimizer state over DP ranks (ZeRO-1 / Megatron dist-opt)."""
    overlap_param_gather: bool = False
    """Overlap the post-step param all-gather with the next forward (needs the dist optimizer)."""
    bucket_size: int | None = None
    """Elements per gradient bucket; None = Megatron's default max(40M, 1M × dp)."""
    tensor_model_parallel_size: int = 1
    """Tensor parallelism is not implemented: must be 1."""
    pipeline_model_parallel_size: int = 1
    """Pipeline parallelism is not implemented: must be 1."""
    grad_reduce_collective: str = "auto"
    """Gradient-bucket collective; 'auto' picks the faster one per backend: nccl all_reduce
    (reduce_scatter with the distributed optimizer); gloo ring_all_reduce (ring_reduce_scatter),
    point-to-point rings on a comm thread (protdp.parallel.ring)."""
    param_gather_collective: str = "auto"
    """Distributed optimizer's param gather; 'auto': nccl all_gather, gloo ring_all_gather."""
    param_align: int = 64
    """Every parameter starts at a multiple of this many elements in the buffers."""
    check_for_nan_in_grad: bool = True
    """Check each bucket for NaN/Inf on the local rank before its collective."""
    max_consecutive_skipped_steps: int = 10
    """Abort with an error after this many consecutive skipped (non-finite) steps; 0 = never."""
    allow_unused_parameters: bool = False
    """Treat params that got no gradient as zero-gradient instead of raising an error."""

    def __post_init__(self):
        if self.tensor_model_parallel_size != 1:
            raise ConfigError(
                f"tensor_model_parallel_size={self.tensor_model_parallel_size}: tensor parallelism "
                "is not implemented; use data parallelism (data_parallel_size) with "
                "use_distributed_optimizer=True to shard optimizer state, and activation "
                "checkpointing / smaller micro_batch_size to fit memory")
        if self.pipeline_model_parallel_size != 1:
            raise ConfigError(
                f"pipeline_model_parallel_size={self.pipeline_model_parallel_size}: pipeline "
                "parallelism is not implemented; use data parallelism with gradient accumulation "
                "(global_batch_size > micro_batch_size × data_parallel_size) instead")
        if self.data_parallel_size is None:
            self.data_parallel_size = _world_size_hint()
        for name in ("data_parallel_size", "micro_batch_size", "param_align"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: expected a positive integer")
        if self.global_batch_size is None:
            self.global_batch_size = self.micro_batch_size * self.data_parallel_size
        per_step = self.micro_batch_size * self.data_parallel_size
        if (not isinstance(self.global_batch_size, int) or self.global_batch_size < 1
                or self.global_batch_size % per_step):
            raise ConfigError(
                f"global_batch_size={self.global_batch_size!r} must be a positive multiple of "
                f"micro_batch_size × data_parallel_size = {self.micro_batch_size} × "
                f"{self.data_parallel_size} = {per_step} (global = micro × dp × accumulation steps)")
        if self.bucket_size is not None and (not isinstance(self.bucket_size, int)
                                             or self.bucket_size < 1):
            raise ConfigError(f"bucket_size={self.bucket_size!r}: expected a positive integer or None")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ConfigError("overlap_param_gather=True requires use_distributed_optimizer=True "
                              "(without it every rank already holds the updated params)")
        if self.grad_reduce_collective not in GRAD_REDUCE_COLLECTIVES:
            raise ConfigError(f"grad_reduce_collective={self.grad_reduce_collective!r}: expected "
                              f"one of {GRAD_REDUCE_COLLECTIVES}")
        if self.param_gather_collective not in PARAM_GATHER_COLLECTIVES:
            raise ConfigError(f"param_gather_collective={self.param_gather_collective!r}: "
                              f"expected one of {PARAM_GATHER_COLLECTIVES}")
        if (self.grad_reduce_collective.endswith("reduce_scatter")
                and not self.use_distributed_optimizer):
            raise ConfigError(f"grad_reduce_collective={self.grad_reduce_collective!r} leaves each "
                              "rank with only its shard of the gradient: it requires "
                              "use_distributed_optimizer=True")
        if self.max_consecutive_skipped_steps < 0:
            raise ConfigError("max_consecutive_skipped_steps must be >= 0")

    @property
    def num_micro_batches(self) -> int:
        """Gradient-accumulation steps per optimizer step: global / (micro × dp)."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)

    @property
    def resolved_bucket_size(self) -> int:
        return self.bucket_size if self.bucket_size is not None else default_bucket_size(
            self.data_parallel_size)
