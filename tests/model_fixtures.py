"""Helpers shared by the model tests: random batches in the docs/batch_format.md layout,
padding, the tiny config, a single-thread fixture, and the overfit of a small model on one
real chain (`overfitted_2p90`, shared by the overfit and the relaxation tests)."""

from __future__ import annotations

import functools
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


def real_chain_batch(path: Path, chain_id: str = "A") -> dict:
    """One real chain as the model sees it at evaluation: single-sequence MSA, no crop, no
    BERT masking (`featurize(training=False)`), coordinates centred on the Cα centroid."""
    import numpy as np

    from protdp.data.features import featurize
    from protdp.data.parse import parse_structure
    from protdp.data.residues import sequence_to_ids

    chain = parse_structure(path, chain_id)
    L = len(chain.sequence)
    family = {"family_id": f"{Path(path).stem}_{chain_id}",
              "msa": sequence_to_ids(chain.sequence)[None],
              "deletion_matrix": np.zeros((1, L), np.int32), "backbone_positions": chain.positions,
              "backbone_mask": chain.mask, "residue_index": chain.residue_index,
              "resolution": chain.resolution}
    batch = featurize(family, crop_size=None, max_msa_rows=1, seed=0, training=False)
    ca_mask = batch["backbone_mask"][:, 1].bool()
    centre = batch["backbone_positions"][ca_mask, 1].mean(0)
    batch["backbone_positions"] = (batch["backbone_positions"] - centre) * batch["backbone_mask"][..., None]
    return batch


def overfit_config(name: str) -> ModelConfig:
    """configs/model/<name>.yaml with the usual overfit overrides: dropout off and unclamped
    FAPE (AF2 trains 10 % of batches unclamped; clamped FAPE alone needs far more steps to
    escape a mirrored-topology minimum on a small chain); the full AF2 loss otherwise."""
    data = read_yaml(CONFIG_DIR / f"{name}.yaml")
    data.update(msa_dropout=0.0, pair_dropout=0.0, sm_dropout=0.0, loss={"fape_clamp": None})
    return load_config(ModelConfig, data)


def overfit(cfg: ModelConfig, batch: dict, *, lr: float, max_steps: int, target_lddt: float,
            check_every: int = 50, seed: int = 0):
    """Train `cfg` from a seeded init on one example (`real_chain_batch`, no recycling) with
    Adam, gradient clipping at 1.0 and a 20-step warm-up then cosine decay over `max_steps`,
    until its eval-mode Cα lDDT against the experimental chain reaches `target_lddt`
    (checked every `check_every` steps). Returns (model in eval mode, its eval outputs at the
    last check, history [(step, lDDT-Cα, RMSD-Cα, seconds)]); the caller asserts the target."""
    import math
    import time

    from protdp.metrics import lddt_ca, rmsd_ca
    from protdp.model import build_model
    from protdp.model.losses import compute_loss

    torch.manual_seed(seed)
    model = build_model(cfg, verbose=False)
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / max_steps)))
    true_ca, ca_mask = batch["backbone_positions"][:, 1], batch["backbone_mask"][:, 1]
    start, history, out = time.time(), [], None
    for step in range(1, max_steps + 1):
        model.train()
        loss, _ = compute_loss(model(batch, num_recycles=0), batch, cfg)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % check_every == 0:
            model.eval()
            with torch.no_grad():
                out = model(batch, num_recycles=0)
            pred_ca = out["final_atom_positions"][:, 1]
            history.append((step, round(lddt_ca(pred_ca, true_ca, ca_mask), 3),
                            round(rmsd_ca(pred_ca, true_ca, ca_mask), 2), round(time.time() - start)))
            if history[-1][1] >= target_lddt:
                break
    return model.eval(), out, history


OVERFIT_LR = 2e-3
OVERFIT_MAX_STEPS = 600
OVERFIT_TARGET_LDDT = 0.85


@functools.cache
def overfitted_2p90(structures_dir: Path) -> dict:
    """configs/model/small.yaml overfitted on the real chain 2p90_A02 (45 residues) until its
    Cα lDDT reaches OVERFIT_TARGET_LDDT (`overfit`, single-threaded), computed once per test
    session: test_model_overfit checks the training, test_relax relaxes the prediction.
    {"cfg", "batch", "sequence", "model", "out" (eval outputs), "history"}."""
    from protdp.data.residues import RESTYPES

    batch = real_chain_batch(Path(structures_dir) / "2p90_A02.pdb")
    cfg = overfit_config("small")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, out, history = overfit(cfg, batch, lr=OVERFIT_LR, max_steps=OVERFIT_MAX_STEPS,
                                      target_lddt=OVERFIT_TARGET_LDDT)
    finally:
        torch.set_num_threads(threads)
    return {"cfg": cfg, "batch": batch, "model": model, "out": out, "history": history,
            "sequence": "".join(RESTYPES[i] for i in batch["aatype"].tolist())}


def tiny_predictor(tmp_path: Path, max_msa_rows: int = 16):
    """A `Predictor` of a freshly initialised tiny model (release gate off), writing to
    `tmp_path / "out"`; close it after use."""
    import yaml

    from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
    from protdp.inference.predictor import PredictConfig, Predictor
    from protdp.model.model import build_model

    torch.manual_seed(0)
    tiny = yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())
    ckpt = save_model_checkpoint(build_model(tiny, verbose=False), None, tmp_path / "m.pt",
                                 max_msa_rows=max_msa_rows)
    return Predictor(load_model_checkpoint(ckpt, device="cpu"), tmp_path / "out",
                     release_gate="off",
                     config=PredictConfig(max_msa_rows=max_msa_rows, plots=False))
