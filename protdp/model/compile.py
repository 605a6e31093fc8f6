"""`torch.compile` of the Evoformer blocks (`--compile`, issue 29 D4).

Each block (Alg. 6 / 18) is compiled in place with `nn.Module.compile`, so parameter names and
checkpoints are unchanged and recompute (torch.utils.checkpoint) wraps the compiled block as
before. Off by default: on CPU (benchmarks/results/compile.json, small widths, L = 64) a
compiled step takes the same time as eager (1.01x, same numerics) since eager's attention and
fused projections are autograd functions the compiler runs as they are (a data-dependent mask
check breaks the graph there), and the first call compiles for about a minute, again for every
new crop size / MSA depth; on GPU it is not measured yet.
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
