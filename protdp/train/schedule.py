"""Learning-rate schedule: linear warmup, then constant / linear / cosine decay to `min_lr`.

Megatron's `OptimizerParamScheduler` as a pure function of the step index. AF2 (supplement
1.11.3) warms up linearly over the first 1000 steps to 1e-3; the decay after that is
configurable here. Step `i` (0-based) of warmup uses `lr * (i + 1) / warmup` so the first
update is not wasted at lr 0.
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup_iters: int, decay_iters: int,
          style: str) -> float:
    """Learning rate for optimizer step `step` (0-based).

    >>> lr_at(0, lr=1.0, min_lr=0.0, warmup_iters=4, decay_iters=10, style="linear")
    0.25
    >>> lr_at(10, lr=1.0, min_lr=0.1, warmup_iters=0, decay_iters=10, style="cosine")
    0.1
    """
    if step < warmup_iters:
        return lr * (step + 1) / warmup_iters
    if style == "constant":
        return lr
    span = max(1, decay_iters - warmup_iters)
    frac = min(1.0, (step - warmup_iters) / span)  # 0 at end of warmup, 1 at decay_iters
    if style == "linear":
        coeff = 1.0 - frac
    elif style == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * frac))
    else:
        raise ValueError(f"unknown lr decay style '{style}'")
    return min_lr + coeff * (lr - min_lr)


def lr_for_args(step: int, args) -> float:
    """`lr_at` with the schedule options of `TrainArgs`."""
    return lr_at(step, lr=args.lr, min_lr=args.min_lr, warmup_iters=args.lr_warmup_iters,
                 decay_iters=args.decay_iters, style=args.lr_decay_style)
