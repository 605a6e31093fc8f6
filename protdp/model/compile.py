"""`torch.compile` of the Evoformer blocks (`--compile`, issue 29 D4).

Each block (Alg. 6 / 18) is compiled in place with `nn.Module.compile`, so parameter names and
checkpoints are unchanged and recompute (torch.utils.checkpoint) wraps the compiled block as
before. Off by default: on CPU (benchmarks/results/compile.json, small widths, L = 64) a
compiled step takes 0.65x eager's time with the same numerics, but the first call compiles for
minutes and every new crop size / MSA depth compiles again; on GPU it is not measured yet.
"""

from __future__ import annotations

import torch.nn as nn

from protdp.model.evoformer import EvoformerBlock


def compile_evoformer_blocks(model: nn.Module, **compile_kwargs) -> int:
    """Compile every EvoformerBlock inside `model` in place; returns how many."""
    count = 0
    for sub in model.modules():
        if isinstance(sub, EvoformerBlock):
            sub.compile(**compile_kwargs)
            count += 1
    return count
