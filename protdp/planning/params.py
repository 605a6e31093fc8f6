"""Parameter counts of `protdp.model.AlphaFoldModel` from a ModelConfig: the real model built on
PyTorch's meta device (shapes only, no memory, no initialisation), so the planner can never
disagree with the model it plans for.
"""

from __future__ import annotations

import functools
import json

import torch

from protdp.config import to_dict
from protdp.model.config import ModelConfig
from protdp.model.embedders import MSA_FEAT_DIM  # noqa: F401  (re-exported for the memory model)


@functools.lru_cache(maxsize=32)
def _breakdown(config_json: str) -> tuple[tuple[str, int], ...]:
    from protdp.model.model import AlphaFoldModel

    with torch.device("meta"):
        model = AlphaFoldModel(ModelConfig(**json.loads(config_json)))
    return tuple((name, sum(p.numel() for p in child.parameters()))
                 for name, child in model.named_children())


def parameter_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per top-level component (AlphaFoldModel's attributes)."""
    return dict(_breakdown(json.dumps(to_dict(cfg), sort_keys=True)))


def parameter_count(cfg: ModelConfig) -> int:
    return sum(parameter_breakdown(cfg).values())
