"""What one rank computes per micro-batch, for measurements before a run (`protdp preflight`).

A `Workload` builds the model (seeded: identical on every rank and every call) and runs one
micro-batch forward + loss. `af2_workload` is pretraining's micro-batch on the real model
(`protdp.model`, AF2 supplement Algorithm 2 with recycling) fed by the training featurizer
(`protdp.data.features`: crop, MSA row sampling, BERT masking) from a synthetic family of the
crop length and MSA depth, so its cost is that of a training example that fills the crop; no
store is needed. The parameter list for the engine's bucket layout comes from a build on the
meta device (shapes only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from protdp.data.residues import GAP_ID, NUM_AA


@dataclass
class Workload:
    """`build()` -> a freshly initialised module; `loss(module)` -> one micro-batch's loss."""

    name: str
    build: Callable[[], nn.Module]
    loss: Callable[[nn.Module], torch.Tensor]
    description: dict = field(default_factory=dict)

    def param_shapes(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of the trainable parameters, built on the meta device."""
        with torch.device("meta"):
            module = self.build()
        return [(n, tuple(p.shape), str(p.dtype).removeprefix("torch."))
                for n, p in module.named_parameters() if p.requires_grad]


def synthetic_family(length: int, rows: int, seed: int) -> dict:
    """A family in the store's layout (`FamilyStore.read`): random sequence and MSA (10 %
    gaps, a few deletions), a chain-like backbone (3.8 A CA steps), every atom observed."""
    rng = np.random.default_rng(seed)
    msa = rng.integers(0, NUM_AA, size=(rows, length)).astype(np.uint8)          # [N, L]
    msa[1:][rng.random((rows - 1, length)) < 0.1] = GAP_ID
    deletions = (rng.random((rows, length)) < 0.02) * rng.integers(1, 5, (rows, length))
    steps = rng.normal(size=(length, 3))
    ca = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True), axis=0)
    backbone = ca[:, None, :] + rng.normal(scale=0.8, size=(length, 5, 3))       # [L, 5, 3]
    backbone[:, 1] = ca
    return {"msa": msa, "deletion_matrix": deletions.astype(np.float32),
            "backbone_positions": backbone.astype(np.float32),
            "backbone_mask": np.ones((length, 5), np.float32),
            "residue_index": np.arange(length, dtype=np.int64), "resolution": 2.0,
            "family_id": f"synthetic_{length}x{rows}"}


def af2_workload(model_config, *, micro_batch_size: int, crop_size: int, msa_rows: int,
                 num_recycles: int | None, device: torch.device, seed: int = 0) -> Workload:
    """Pretraining's micro-batch: `micro_batch_size` examples of `crop_size` residues and
    `msa_rows` MSA rows; `num_recycles` None = the training mean (max_recycles / 2)."""
    from protdp.config import load_config
    from protdp.data.features import collate, featurize
    from protdp.model import ModelConfig, build_model
    from protdp.model.losses import compute_loss

    cfg = load_config(ModelConfig, model_config)
    recycles = cfg.max_recycles // 2 if num_recycles is None else num_recycles
    examples = [featurize(synthetic_family(crop_size, msa_rows, seed + k), crop_size=crop_size,
                          max_msa_rows=msa_rows, seed=seed + k) for k in range(micro_batch_size)]
    batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
             for k, v in collate(examples).items()}

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return build_model(cfg, verbose=False)

    def loss(module: nn.Module) -> torch.Tensor:
        return compute_loss(module(batch, num_recycles=recycles), batch, cfg)[0]

    return Workload("af2", build, loss, {
        "micro_batch_size": micro_batch_size, "crop_size": crop_size, "msa_rows": msa_rows,
        "num_recycles": recycles})
