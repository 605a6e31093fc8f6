"""bf16 autocast policy of the model (where AlphaFold/OpenFold keep fp32).

AlphaFold was trained with bfloat16 activations, and OpenFold runs its trunk under autocast with these regions kept in fp32, which protdp follows:

- attention logits and softmax: fp32 (protdp.model.attention: explicit/lowmem compute them in
  fp32; the fused SDPA kernels accumulate in fp32 internally);
- LayerNorm: statistics in fp32 (autocast runs layer_norm in fp32 on CUDA and CPU);
- the structure module, the heads' probabilities and the losses: fp32 — the model leaves the
  autocast region after the trunk and casts m, z, s back to the parameter dtype.

`trunk_autocast` is the one place that opens the region. The memory-saving autograd functions
(`_LayerNormLinear`, the gated triangle product, the outer product, "recompute" attention) run
under it too: LayerNorm statistics in fp32, projections and products in the autocast dtype, and
their backward replays the forward's autocast state (`active_autocast_dtype`, `replay_autocast`).
"""

from __future__ import annotations

import contextlib

import torch

COMPUTE_DTYPE = torch.bfloat16
"""Autocast dtype of the trunk when ModelConfig.bf16 is set."""


def trunk_autocast(device: torch.device | str, enabled: bool):
    """The trunk's bf16 autocast context on `device` (a no-op when not enabled)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=COMPUTE_DTYPE)



def active_autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for `device_type` ("cpu", "cuda"), None outside autocast."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def replay_autocast(device_type: str, dtype: torch.dtype | None):
    """A custom autograd function's backward under its forward's autocast state (`dtype` from
    `active_autocast_dtype` in forward; None: autocast off), so recomputed values equal the
    forward's and gradients run in the same dtypes as the unfused modules' backward."""
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=dtype is not None)
