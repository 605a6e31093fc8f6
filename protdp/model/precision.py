"""bf16 autocast policy of the model (where AlphaFold/OpenFold keep fp32).

AlphaFold was trained with bfloat16 activations, and OpenFold runs its trunk under autocast with these regions kept in fp32, which protdp follows:

- attention logits and softmax: fp32 (protdp.model.attention: explicit/lowmem compute them in
  fp32; the fused SDPA kernels accumulate in fp32 internally);
- LayerNorm: statistics in fp32 (autocast runs layer_norm in fp32 on CUDA and CPU);
- the structure module, the heads' probabilities and the losses: fp32 — the model leaves the
  autocast region after the trunk and casts m, z, s back to the parameter dtype.

`trunk_autocast` is the one place that opens the region.
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

