"""Exponential moving average of model weights (AF2 supplement 1.11.7: decay 0.999).

The average is what AF2 evaluates and ships. It is kept in fp32 on every rank (after the
optimizer's param all-gather every rank holds identical full weights, so every rank's EMA is
identical too and needs no communication). Buffers are copied, not averaged.

Like `tf.train.ExponentialMovingAverage(num_updates=...)`, the decay of update n is
min(decay, (1 + n) / (10 + n)): early on the average follows the weights closely instead of
staying ~ the random initialisation for the first thousand steps (with 0.999 alone, a
60-step run's EMA is still 94 % initial weights); after ~10k steps it is AF2's 0.999.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class EMA:
    """shadow <- d * shadow + (1 - d) * param after every optimizer step, d = min(decay, (1+n)/(10+n))."""

    def __init__(self, model: nn.Module, decay: float = 0.999):
        self.decay = decay
        self.num_updates = 0
        self.shadow = {k: v.detach().to(torch.float32).clone()
                       for k, v in model.state_dict().items() if v.is_floating_point()}

    def current_decay(self) -> float:
        return min(self.decay, (1.0 + self.num_updates) / (10.0 + self.num_updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = self.current_decay()
        self.num_updates += 1
        params = dict(model.named_parameters())
        for name, value in model.state_dict().items():
            if name not in self.shadow:
                continue
            if name in params:
                self.shadow[name].lerp_(value.to(torch.float32), 1.0 - decay)
            else:  # buffer
                self.shadow[name].copy_(value)

    @contextlib.contextmanager
    def swapped_into(self, model: nn.Module):
        """Temporarily load the EMA weights into `model` (e.g. for validation)."""
        backup = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict({**backup, **{k: v.to(backup[k].dtype) for k, v in self.shadow.items()}})
        try:
            yield model
        finally:
            model.load_state_dict(backup)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.shadow) ^ set(state["shadow"])
        if missing:
            raise KeyError(f"EMA state does not match the model: differing keys {sorted(missing)[:5]}")
        self.decay = state["decay"]
        self.num_updates = int(state["num_updates"])
        # onto the device of this model's shadow: a checkpoint is read onto the CPU, and the rank
        # that saved it may have run on another GPU
        self.shadow = {k: v.to(device=self.shadow[k].device, dtype=torch.float32, copy=True)
                       for k, v in state["shadow"].items()}
