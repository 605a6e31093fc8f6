"""Megatron-style data parallelism on torch.distributed (gloo on CPU, NCCL on CUDA).

Public interface (what a training loop uses, as with Megatron core)::

    from protdp.parallel import (init_distributed, ParallelConfig, DataParallel,
                                 DistributedOptimizer, save_checkpoint, load_checkpoint)
    init_distributed(timeout=600)
    cfg = ParallelConfig(micro_batch_size=2, global_batch_size=16, use_distributed_optimizer=True)
    model = DataParallel(net, cfg); model.broadcast_params()
    opt = DistributedOptimizer(model, cfg, lr=1e-3, weight_decay=0.0, clip_grad=1.0)
    for step in ...:
        opt.zero_grad()
        for i, mb in enumerate(micro_batches):          # cfg.num_micro_batches of them
            ctx = model.no_sync() if i < cfg.num_micro_batches - 1 else nullcontext()
            with ctx:
                (loss_fn(model(mb)) / cfg.num_micro_batches).backward()
        model.finish_grad_sync()                         # optional: step() calls it
        applied = opt.step()                             # False when skipped (NaN/Inf)
"""

from protdp.parallel.checkpoint import consolidate_optimizer, load_checkpoint, save_checkpoint
from protdp.parallel.config import ParallelConfig
from protdp.parallel.ddp import DataParallel
from protdp.parallel.env import LaunchEnv, detect_launch_env, init_distributed
from protdp.parallel.optimizer import DistributedOptimizer, NonFiniteGradientError

__all__ = [
    "init_distributed", "detect_launch_env", "LaunchEnv", "ParallelConfig", "DataParallel",
    "DistributedOptimizer", "NonFiniteGradientError", "save_checkpoint", "load_checkpoint",
    "consolidate_optimizer",
]
