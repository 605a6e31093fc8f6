"""DeepSpeed as the second data-parallel engine (`--engine deepspeed`): ZeRO stage 1 or 2 through
DeepSpeed's own engine and optimizer, behind the trainer's step.

Why: the project brief advises DeepSpeed's ZeRO below about 100 GPUs, where it is simpler to run
than Megatron's engine; protdp's own engine stays the default. Install with
`pip install 'protdp[deepspeed]'` (CPU: `DS_BUILD_OPS=0`, ops are compiled on first use; on a
CPU-only machine DeepSpeed picks its CPU accelerator, whose collectives are torch's gloo plus a
shared-memory all-reduce between ranks of one host, compiled once into ~/.cache/torch_extensions).

The Megatron flags map onto DeepSpeed's config (`deepspeed_config`):

    --micro-batch-size           train_micro_batch_size_per_gpu
    --global-batch-size          train_batch_size (= micro x dp x accumulation)
    accumulation (derived)       gradient_accumulation_steps
    --clip-grad                  gradient_clipping
    --bucket-size                zero_optimization.reduce_bucket_size and allgather_bucket_size
    --overlap-grad-reduce        zero_optimization.overlap_comm
    --use-distributed-optimizer  ZeRO stage 1 (DeepSpeed always shards: --zero-stage 1 or 2)
    --lr, --adam-*, --weight-decay   optimizer AdamW (torch's, torch_adam) params; the trainer's
                                 schedule sets the lr every step

`DeepSpeedModel` and `DeepSpeedOptimizer` give the trainer the calls it makes on protdp's
`DataParallel` / `DistributedOptimizer`: DeepSpeed counts micro-batches itself (every backward
goes through `engine.backward`, which scales the loss by 1 / accumulation, followed by
`engine.step()`, which updates only at the accumulation boundary), so `no_sync` and
`finish_grad_sync` have nothing to do (the reduction happens inside the boundary backward and
is timed as backward). A step with non-finite gradients is skipped by DeepSpeed's ZeRO
optimizer on every rank (`overflow`), as protdp's vote does. Checkpoints are DeepSpeed's own
(`engine.save_checkpoint` under `engine/deepspeed/`), plus protdp's `model.pt` written by rank 0
so prediction reads them like any training checkpoint; ZeRO checkpoints load only at the
data-parallel size they were saved with.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch

from protdp.errors import ConfigError
from protdp.model.weight_checks import check_weights
from protdp.parallel import NonFiniteGradientError
from protdp.parallel.checkpoint import MODEL_FILE
from protdp.parallel.config import default_bucket_size
from protdp.parallel.env import detect_launch_env

TAG = "deepspeed"          # DeepSpeed's checkpoint tag: engine/deepspeed/...
ZERO_STAGES = (1, 2)


def deepspeed_config(args, dp: int) -> dict:
    """DeepSpeed's config for TrainArgs `args` at data-parallel size `dp` (pure)."""
    if args.zero_stage not in ZERO_STAGES:
        raise ConfigError(f"--zero-stage {args.zero_stage!r}: DeepSpeed ZeRO stage 1 or 2")
    bucket = args.bucket_size if args.bucket_size is not None else default_bucket_size(dp)
    accumulation = args.global_batch_size // (args.micro_batch_size * dp)
    return {
        "train_batch_size": args.global_batch_size,
        "train_micro_batch_size_per_gpu": args.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": float(args.clip_grad),
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW", "params": {
            "lr": args.lr, "betas": [args.adam_beta1, args.adam_beta2], "eps": args.adam_eps,
            "weight_decay": args.weight_decay, "torch_adam": True, "adam_w_mode": True}},
        "zero_optimization": {
            "stage": args.zero_stage, "overlap_comm": bool(args.overlap_grad_reduce),
            "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
            "contiguous_gradients": True, "reduce_scatter": True},
    }


def _import_deepspeed():
    try:
        import deepspeed
    except ImportError as exc:
        raise ConfigError(f"--engine deepspeed needs DeepSpeed ({exc}): pip install "
                          "'protdp[deepspeed]' (on CPU with DS_BUILD_OPS=0)") from None
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)   # its per-step INFO lines would drown the trainer's
    return deepspeed


class DeepSpeedModel:
    """The trainer's view of the model engine (what it calls on `DataParallel`)."""

    def __init__(self, engine):
        self.engine = engine
        self.module = engine.module
        self.last_grad_sync = {"wait_s": 0.0, "comm_s": 0.0}   # inside backward: not separable

    def __call__(self, *args, **kwargs):
        return self.engine(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """One micro-batch: DeepSpeed's backward (loss / accumulation; reduces at the boundary),
        then its step, which only counts the micro-batch unless it is the boundary's."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.backward(loss)
        if not boundary:
            self.engine.step()

    def no_sync(self):
        return contextlib.nullcontext()   # DeepSpeed knows the boundary from its own count

    def finish_grad_sync(self) -> None:
        pass

    def zero_grad_buffer(self) -> None:
        pass                               # DeepSpeed clears gradients in its step

    def finish_param_sync(self, keys=None) -> None:
        pass                               # ZeRO-1/2 gather the updated params inside step


class DeepSpeedOptimizer:
    """The trainer's view of the optimizer (what it calls on `DistributedOptimizer`)."""

    def __init__(self, engine, max_consecutive_skipped_steps: int):
        self.engine = engine
        self.limit = max_consecutive_skipped_steps
        self.consecutive_skips = self.skipped_steps = 0
        self.last_grad_norm: float | None = None

    def set_lr(self, lr: float) -> None:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> bool:
        """The boundary step; False (on every rank) when DeepSpeed skipped it (NaN/Inf)."""
        self.engine.step()
        applied = bool(self.engine.was_step_applied())
        norm = self.engine.get_global_grad_norm()
        self.last_grad_norm = None if norm is None else float(norm)
        if applied:
            self.consecutive_skips = 0
            return True
        self.skipped_steps += 1
        self.consecutive_skips += 1
        if self.limit and self.consecutive_skips >= self.limit:
            raise NonFiniteGradientError(
                f"{self.consecutive_skips} consecutive DeepSpeed steps skipped for non-finite "
                "gradients; aborting. Lower the learning rate or check the data")
        return False


def build(model: torch.nn.Module, args, dp: int) -> tuple[DeepSpeedModel, DeepSpeedOptimizer]:
    """DeepSpeed's engine and ZeRO optimizer over `model` on the initialized process group."""
    deepspeed = _import_deepspeed()
    # DeepSpeed places each rank by LOCAL_RANK, which only torchrun exports: mpirun, srun and a
    # world of 1 get it from the same launcher variables init_distributed read
    os.environ.setdefault("LOCAL_RANK", str(detect_launch_env().local_rank))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=deepspeed_config(args, dp),
                                           dist_init_required=False)
    return DeepSpeedModel(engine), DeepSpeedOptimizer(engine, args.max_consecutive_skipped_steps)


def save(path: Path, model: DeepSpeedModel, opt: DeepSpeedOptimizer) -> None:
    """Collective: DeepSpeed's checkpoint in `path/deepspeed`, protdp's model.pt by rank 0."""
    import torch.distributed as dist

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.engine.save_checkpoint(str(path), tag=TAG, save_latest=False)
    if dist.get_rank() == 0:
        tmp = path / (MODEL_FILE + ".partial")
        torch.save({"model": model.module.state_dict(), "extra": {"engine": "deepspeed"}}, tmp)
        tmp.replace(path / MODEL_FILE)


def load(path: Path, model: DeepSpeedModel, opt: DeepSpeedOptimizer) -> None:
    """Model, ZeRO optimizer shards and DeepSpeed's step counters from `path/deepspeed`."""
    import torch.distributed as dist

    folder = Path(path) / TAG
    if not folder.is_dir():
        raise ConfigError(f"{path}: no DeepSpeed checkpoint here (written by --engine protdp?); "
                          "resume with the engine that wrote it")
    saved = len(list(folder.glob("zero_pp_rank_*_optim_states.pt")))
    world = dist.get_world_size()
    if saved != world:
        raise ConfigError(f"{folder}: DeepSpeed ZeRO checkpoint of {saved} data-parallel ranks; "
                          f"it loads only at that size, not at {world} (protdp's engine "
                          "checkpoints reshard)")
    loaded, _ = model.engine.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True,
                                             load_lr_scheduler_states=False)
    if loaded is None:
        raise ConfigError(f"{folder}: DeepSpeed could not load this checkpoint")
    # the weights DeepSpeed read from its own files, checked before any step uses them: the
    # module's and ZeRO's fp32 master partitions (copied into the module at the next step)
    check_weights(model.module.state_dict(), folder, "model")
    masters = getattr(model.engine.optimizer, "single_partition_of_fp32_groups", None) or []
    check_weights({f"fp32 master partition {i} (rank {dist.get_rank()})": t.detach()
                   for i, t in enumerate(masters)}, folder, "optimizer")
