"""Helpers shared by the model tests: random batches in the docs/batch_format.md layout,
padding, the tiny config and a single-thread fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from protdp.config import load_config, read_yaml
from protdp.model import ModelConfig
from protdp.paths import REPO_ROOT

CONFIG_DIR = REPO_ROOT / "configs" / "model"


@pytest.fixture(autouse=True)
def one_thread():
    """Run each model test single-threaded: on the shared 2-core machine intra-op threads
    contend with other processes and small ops get ~10-40x slower. Import this name into a test
    module to apply it there."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_config(**overrides) -> ModelConfig:
    data = read_yaml(CONFIG_DIR / "tiny.yaml")
    data.update(overrides)
    return load_config(ModelConfig, data)


def random_backbone(L: int, generator: torch.Generator) -> torch.Tensor:
    """A chain-like random backbone [L, 5, 3]: CA random walk with 3.8 Å steps, other atoms
    offset around it (only needs to be a valid, non-degenerate geometry)."""
    steps = torch.randn(L, 3, generator=generator)
    steps = 3.8 * steps / steps.norm(dim=-1, keepdim=True)
    ca = torch.cumsum(steps, dim=0)
    offsets = torch.randn(L, 5, 3, generator=generator) * 0.8 + torch.tensor(
        [[-0.5, 1.4, 0.0], [0, 0, 0], [1.5, 0.0, 0.0], [2.2, 1.0, 0.0], [-0.5, -0.8, -1.2]])
    offsets[:, 1] = 0.0
    return ca[:, None, :] + offsets


def random_batch(L: int = 22, N: int = 13, B: int | None = 2, seed: int = 0) -> dict:
    """A batch in the docs/batch_format.md layout with random (but valid) content."""
    g = torch.Generator().manual_seed(seed)
    lead = () if B is None else (B,)
    n_ex = 1 if B is None else B
    msa = torch.randint(0, 21, (n_ex, N, L), generator=g)
    bert = (torch.rand(n_ex, N, L, generator=g) < 0.15).float()
    batch = {
        "aatype": msa[:, 0].clone(),
        "residue_index": torch.arange(L).expand(n_ex, L).clone(),
        "seq_mask": torch.ones(n_ex, L),
        "msa": torch.where(bert > 0, torch.full_like(msa, 22), msa),
        "msa_mask": torch.ones(n_ex, N, L),
        "has_deletion": (torch.rand(n_ex, N, L, generator=g) < 0.1).float(),
        "deletion_value": torch.rand(n_ex, N, L, generator=g) * 0.5,
        "true_msa": msa,
        "bert_mask": bert,
        "backbone_positions": torch.stack([random_backbone(L, g) for _ in range(n_ex)]),
        "backbone_mask": torch.ones(n_ex, L, 5),
        "resolution": torch.full((n_ex,), 2.0),
        "num_residues": torch.full((n_ex,), L),
    }
    if B is None:
        batch = {k: v[0] for k, v in batch.items()}
    batch["family_id"] = [f"fam{i}" for i in range(n_ex)] if B is not None else "fam0"
    return batch


MSA_KEYS = ("msa", "msa_mask", "has_deletion", "deletion_value", "true_msa", "bert_mask")
RESIDUE_KEYS = ("aatype", "residue_index", "seq_mask", "backbone_positions", "backbone_mask")


def pad_batch(batch: dict, L_pad: int, N_pad: int) -> dict:
    """Pad an unbatched example to L_pad residues and N_pad MSA rows with zeros (masks 0)."""
    L, N = batch["aatype"].shape[0], batch["msa"].shape[0]
    out = dict(batch)
    for key in RESIDUE_KEYS:
        value = batch[key]
        out[key] = torch.cat([value, value.new_zeros((L_pad - L,) + value.shape[1:])])
    for key in MSA_KEYS:
        value = torch.cat([batch[key], batch[key].new_zeros(N_pad - N, L)])
        out[key] = torch.cat([value, value.new_zeros(N_pad, L_pad - L)], dim=1)
    return out


AF2_CASES = ("2p90_A02", "2jp1_A", "synthetic_L40")


@pytest.fixture(scope="session")
def af2_reference():
    """DeepMind's JAX AlphaFold fixture (params, processed features, outputs; its README):
    $PROTDP_AF2_REFERENCE or af2_reference/ beside the data corpus."""
    import os

    from protdp.paths import data_root

    env = os.environ.get("PROTDP_AF2_REFERENCE")
    root = Path(env) if env else data_root().parent / "af2_reference"
    assert (root / "params" / "params_model_3_ptm_small.npz").is_file(), (
        f"AlphaFold reference fixture not found at {root}; set PROTDP_AF2_REFERENCE")
    return root
