"""Ranking an ensemble of predictions of one target (checkpoints x seeds), as AlphaFold does.

AlphaFold (`run_alphafold.py`, v2.3) scores every model with its ranking confidence: the mean
pLDDT for monomer models, `0.8 ipTM + 0.2 pTM` for multimer models; sorts them best first;
writes `ranked_K.pdb` for the K-th best and `ranking_debug.json`:

    {"plddts": {"model_1_seed_000": 91.2345, ...}, "order": ["model_3_seed_000", ...]}
    ({"iptm+ptm": {...}, "order": [...]} for multimer; full floats; protdp adds "ptm" and,
    for complexes, "iptm" per model, as AlphaPulldown does)

The spread across the ensemble (largest Cα RMSD of the top-ranked model to any other, after
superposition) is gate evidence: models that disagree send the target to review.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from protdp.inference.recycling import CA_INDEX
from protdp.metrics import rmsd_ca


def prediction_name(model_index: int, seed: int) -> str:
    """`model_<i>_seed_<sss>` (i 1-based, ColabFold's naming of (model, seed) pairs)."""
    return f"model_{model_index + 1}_seed_{seed:03d}"


def model_numbers(paths: list) -> list[int]:
    """1-based model number of each checkpoint in the names: AlphaFold's own number for
    imported AlphaFold weights (the import's provenance names `params_model_3_ptm.npz`:
    `model_3_seed_*`, whatever the folder is called, `model_names.alphafold_model_name`) or
    for `model_N[_ptm]` folders / files, else the position in `--checkpoint` order (also
    whenever two checkpoints would share a number)."""
    from protdp.inference.model_names import alphafold_model_name, alphafold_model_number

    found = []
    for p in paths:
        p = Path(p)
        imported = alphafold_model_name(p)
        if imported is not None:
            found.append(alphafold_model_number(imported))
            continue
        m = next((re.fullmatch(r"model_(\d+)(_\w+)?", n) for n in (p.stem, p.parent.name)
                  if re.fullmatch(r"model_(\d+)(_\w+)?", n)), None)
        found.append(int(m.group(1)) if m and int(m.group(1)) > 0 else None)
    if None in found or len(set(found)) != len(found):
        return list(range(1, len(paths) + 1))
    return found


def ranking_confidence(pred: dict) -> float:
    """AF2: 0.8 ipTM + 0.2 pTM when the model predicts ipTM (complexes), else mean pLDDT."""
    if pred.get("iptm") is not None and pred.get("ptm") is not None:
        return 0.8 * float(pred["iptm"]) + 0.2 * float(pred["ptm"])
    return float(np.mean(pred["plddt"]))


def rank(preds: dict[str, dict]) -> tuple[list[str], dict]:
    """Names best first (ties: name order) and `ranking_debug.json` in AlphaFold's shape, at
    full float precision as AlphaFold writes it, plus each model's pTM (and ipTM) as
    AlphaPulldown's ranking_debug.json carries them (read by alphajudge)."""
    multimer = all(p.get("iptm") is not None for p in preds.values())
    conf = {name: ranking_confidence(p) for name, p in preds.items()}
    order = sorted(conf, key=lambda n: (-conf[n], n))
    debug = {"iptm+ptm" if multimer else "plddts": conf}
    for key in ("ptm", "iptm"):
        if all(p.get(key) is not None for p in preds.values()):
            debug[key] = {name: float(p[key]) for name, p in preds.items()}
    return order, {**debug, "order": order}


def member_failure(pred: dict) -> str | None:
    """Why one prediction of the ensemble is unusable (None: it is usable): NaN/Inf in its
    pLDDT, its scores (pTM, ipTM, PAE) or the positions of its present atoms - a model with
    overflowing weights or a diverged seed (issue 47). Such a member is a failed member: it is
    recorded, not ranked, and the others are ranked without it."""
    plddt = np.asarray(pred["plddt"], np.float64)
    if not np.isfinite(plddt).all():
        return "pLDDT holds NaN/Inf"
    for key in ("ptm", "iptm", "pae"):
        if pred.get(key) is not None and not np.isfinite(np.asarray(pred[key], np.float64)).all():
            return f"{key} holds NaN/Inf"
    pos = np.asarray(pred["positions"], np.float64)
    mask = np.asarray(pred.get("atom_mask", np.ones(pos.shape[:-1])), bool)
    if not np.isfinite(pos[mask]).all():
        return "atom positions hold NaN/Inf"
    return None


def split_failed(preds: dict[str, dict]) -> tuple[dict[str, dict], dict[str, str]]:
    """(usable members, {failed member: reason}); when every member failed they are all kept
    (the gate then rejects the target as invalid, as before)."""
    failed = {n: why for n, p in preds.items() if (why := member_failure(p))}
    if len(failed) == len(preds):
        return preds, failed
    return {n: p for n, p in preds.items() if n not in failed}, failed


def ensemble_spread(preds: dict[str, dict], order: list[str]) -> dict:
    """Cα RMSD (Å, Kabsch-superposed) of the top-ranked model to every other, its maximum, and
    the range of mean pLDDT; `max_ca_rmsd` is None for a single prediction."""
    top = preds[order[0]]["positions"][:, CA_INDEX]                          # [L, 3]
    rmsd = {n: round(rmsd_ca(preds[n]["positions"][:, CA_INDEX], top), 3) for n in order[1:]
            if np.isfinite(preds[n]["positions"][:, CA_INDEX]).all() and np.isfinite(top).all()}
    means = [float(np.mean(p["plddt"])) for p in preds.values()]
    return {"ca_rmsd_to_top": rmsd, "max_ca_rmsd": max(rmsd.values()) if rmsd else None,
            "mean_plddt_range": round(max(means) - min(means), 2)}
