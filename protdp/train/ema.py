"""Exponential moving average of model weights (AF2 supplement 1.11.7: decay 0.999).

The average is what AF2 evaluates and ships. It is kept in fp32 on every rank (after the
optimizer's param all-gather every rank holds identical full weights, so every rank's EMA is
identical too and needs no communication). Buffers are copied, not averaged.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class EMA:
    """shadow <- decay * shadow + (1 - decay) * param, after every optimizer step."""

    def __init__(self, model: nn.Module, decay: float = 0.999):
        self.decay = decay
        self.shadow = {k: v.detach().to(torch.float32).clone()
                       for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        for name, value in model.state_dict().items():
            if name not in self.shadow:
                continue
            if name in params:
                self.shadow[name].lerp_(value.to(torch.float32), 1.0 - self.decay)
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
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.shadow) ^ set(state["shadow"])
        if missing:
            raise KeyError(f"EMA state does not match the model: differing keys {sorted(missing)[:5]}")
        self.decay = state["decay"]
        self.shadow = {k: v.to(torch.float32).clone() for k, v in state["shadow"].items()}
