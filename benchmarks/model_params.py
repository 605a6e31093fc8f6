"""Parameter count of each packaged model config, shared by `benchmarks/model.py` and
`benchmarks/model_af2.py` (their results files carry it as "parameters")."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def param_counts() -> dict:
    """Parameter count of each configs/model/*.yaml (built on the meta device: no memory)."""
    import torch

    from protdp.config import load_config, read_yaml
    from protdp.model import AlphaFoldModel, ModelConfig

    counts = {}
    for path in sorted((ROOT / "configs" / "model").glob("*.yaml")):
        if set(read_yaml(path)) <= {"loss"}:     # loss weights only (af2_finetune_loss.yaml)
            continue
        with torch.device("meta"):
            counts[path.stem] = AlphaFoldModel(load_config(ModelConfig, path)).num_parameters()
    return counts
