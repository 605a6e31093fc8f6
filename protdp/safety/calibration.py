"""Calibration report: does pLDDT mean what it says? (`protdp calibrate`)

pLDDT (AF2 supplement §1.9.6, Algorithm 29) is the model's prediction of its own per-residue
lDDT-Cα. On held-out families of the HDF5 store this runs the model, scores each prediction
against the experimental structure (`protdp.metrics.per_residue_lddt_ca` / `lddt_ca`) and
reports:

- per AFDB band (very high > 90, confident 70-90, low 50-70, very low < 50) the count, mean
  pLDDT and mean true lDDT-Cα (x100), per residue and per target (band of the mean pLDDT);
- Spearman rank correlation of pLDDT with true lDDT, per residue and per target (mean pLDDT vs
  global lDDT-Cα); `null` when either side is constant;
- a reliability plot (PNG): mean true lDDT per pLDDT bin against the diagonal, plus targets,
  and the expected calibration error (ECE) over those bins;
- the gate threshold on mean pLDDT that keeps the accepted set's mean true lDDT-Cα at or above
  the target: the lowest threshold t such that for every threshold >= t the targets with mean
  pLDDT >= t have mean lDDT >= target (so raising it never breaks the promise).

`calibration.json` goes next to the checkpoint (or --out); `protdp.gating.load_calibrated_policy`
turns it into a `GatePolicy` for `protdp.gating.route`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from protdp.errors import InputError
from protdp.fileio import atomic_write_json
from protdp.gating import AFDB_BANDS, band_of
from protdp.gating.policy import CALIBRATION_FORMAT

RELIABILITY_BINS = np.arange(0, 101, 10)            # pLDDT bin edges for the plot
MIN_TARGETS = 30                                    # fewer held-out targets -> a warning


# ------------------------------------------------------------------------------ pure statistics

def band_table(plddt: np.ndarray, true_lddt: np.ndarray) -> dict[str, dict]:
    """Residue-level accuracy per AFDB band. plddt [N] in 0-100, true_lddt [N] in 0-1."""
    bands = np.array([band_of(float(p)) for p in plddt]) if len(plddt) else np.array([])
    out = {}
    for name in AFDB_BANDS:
        sel = bands == name
        n = int(sel.sum())
        out[name] = {"residues": n,
                     "mean_plddt": float(plddt[sel].mean()) if n else None,
                     "mean_true_lddt": float(100 * true_lddt[sel].mean()) if n else None}
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rho (scipy); None when fewer than 3 points or either side is constant."""
    from scipy.stats import spearmanr
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    rho = spearmanr(x, y).statistic
    return None if not math.isfinite(rho) else float(rho)


def gate_threshold(mean_plddt: np.ndarray, true_lddt: np.ndarray, target: float) -> dict:
    """Lowest mean-pLDDT threshold t such that for every t' >= t among the observed values, the
    targets with mean_plddt >= t' have mean true lDDT >= `target` (0-1 scale).

    Returns {'accept_mean_plddt', 'achievable', 'n_accepted', 'coverage', 'accepted_mean_lddt'};
    when no threshold works, 'achievable' is False and the threshold is 100 (accept only a
    perfect mean pLDDT, i.e. effectively send everything to review)."""
    p, t = np.asarray(mean_plddt, float), np.asarray(true_lddt, float)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError("mean_plddt and true_lddt must be 1-D arrays of equal length")
    n = len(p)
    best = None
    for thr in sorted(set(p.tolist()), reverse=True):       # from strict to lenient
        acc = p >= thr
        if t[acc].mean() >= target:
            best = thr
        else:
            break
    if best is None:
        return {"accept_mean_plddt": 100.0, "achievable": False, "n_accepted": 0,
                "coverage": 0.0, "accepted_mean_lddt": None}
    acc = p >= best
    return {"accept_mean_plddt": float(best), "achievable": True, "n_accepted": int(acc.sum()),
            "coverage": float(acc.sum() / n), "accepted_mean_lddt": float(t[acc].mean())}


def reliability_curve(plddt: np.ndarray, true_lddt: np.ndarray) -> list[dict]:
    """Mean true lDDT (x100) per 10-wide pLDDT bin (residue level); empty bins omitted."""
    idx = np.clip(np.digitize(plddt, RELIABILITY_BINS[1:-1]), 0, len(RELIABILITY_BINS) - 2)
    out = []
    for b in range(len(RELIABILITY_BINS) - 1):
        sel = idx == b
        if sel.any():
            out.append({"lo": float(RELIABILITY_BINS[b]), "hi": float(RELIABILITY_BINS[b + 1]),
                        "residues": int(sel.sum()), "mean_plddt": float(plddt[sel].mean()),
                        "mean_true_lddt": float(100 * true_lddt[sel].mean())})
    return out


def expected_calibration_error(reliability: list[dict]) -> float | None:
    """ECE of pLDDT on the 0-1 scale: residue-weighted mean |mean pLDDT - mean true lDDT-Cα|
    over the reliability bins (10 pLDDT units wide)."""
    n = sum(b["residues"] for b in reliability)
    if not n:
        return None
    return sum(b["residues"] * abs(b["mean_plddt"] - b["mean_true_lddt"])
               for b in reliability) / n / 100.0


def summarize(per_target: list[dict], target_lddt: float) -> dict:
    """The report's statistics from per-target records (each with 'plddt' [L] 0-100,
    'true_lddt' [L] 0-1 on observed residues, 'mean_plddt', 'lddt_ca')."""
    if not per_target:
        raise InputError("no targets to calibrate on")
    res_p = np.concatenate([np.asarray(r["plddt"], float) for r in per_target])
    res_t = np.concatenate([np.asarray(r["true_lddt"], float) for r in per_target])
    mean_p = np.array([r["mean_plddt"] for r in per_target])
    glob_t = np.array([r["lddt_ca"] for r in per_target])
    target_bands = band_table(mean_p, glob_t)
    for b in target_bands.values():
        b["targets"] = b.pop("residues")
    out = {
        "n_targets": len(per_target), "n_residues": int(len(res_p)),
        "bands": band_table(res_p, res_t),
        "bands_by_target": target_bands,
        "spearman": {"residue": spearman(res_p, res_t), "target": spearman(mean_p, glob_t)},
        "reliability": reliability_curve(res_p, res_t),
        "ece": expected_calibration_error(reliability_curve(res_p, res_t)),
        "threshold": {"target_lddt": target_lddt, **gate_threshold(mean_p, glob_t, target_lddt)},
        "mean_abs_error": float(np.mean(np.abs(res_p - 100 * res_t))),
    }
    if len(per_target) < MIN_TARGETS:
        out["warning"] = (f"only {len(per_target)} targets: the threshold is a rough estimate "
                          f"(use >= {MIN_TARGETS} held-out families)")
    return out


def plot_reliability(report: dict, per_target: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    ax.plot([0, 100], [0, 100], "--", color="grey", label="perfect calibration")
    rel = report["reliability"]
    ax.plot([r["mean_plddt"] for r in rel], [r["mean_true_lddt"] for r in rel], "o-",
            label="residues (10-pLDDT bins)")
    ax.scatter([r["mean_plddt"] for r in per_target], [100 * r["lddt_ca"] for r in per_target],
               marker="x", color="black", label="targets (mean pLDDT vs lDDT-Cα)")
    thr = report["threshold"]
    ax.axvline(thr["accept_mean_plddt"], color="red", lw=1,
               label=f"gate threshold {thr['accept_mean_plddt']:.1f}")
    ax.axhline(100 * thr["target_lddt"], color="red", lw=0.5, ls=":")
    ax.set(xlim=(0, 100), ylim=(0, 100), xlabel="predicted pLDDT", ylabel="true lDDT-Cα x 100",
           title=f"pLDDT reliability ({report['n_targets']} targets)")
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ------------------------------------------------------------------------------ model run

def evaluate_families(loaded, store, families: list[str], max_msa_rows: int,
                      num_recycles: int | None = None) -> list[dict]:
    """Predict each family (no crop, first MSA rows) and score it against its structure."""
    import torch
    from tqdm import tqdm

    from protdp.data.features import collate, featurize
    from protdp.metrics import lddt_ca, per_residue_lddt_ca

    out = []
    for fid in tqdm(families, desc="calibrate", disable=len(families) < 5):
        fam = store.read(fid)
        batch = collate([featurize(fam, crop_size=None, max_msa_rows=max_msa_rows, seed=0,
                                   training=False)])
        with torch.no_grad():
            pred = loaded.model(batch, num_recycles=num_recycles)
        plddt = pred["plddt"][0].double().numpy()                                   # [L]
        pred_ca = pred["final_atom_positions"][0, :, 1].double().numpy()            # [L, 3]
        true_ca = np.asarray(fam["backbone_positions"], float)[:, 1]                 # [L, 3]
        mask = np.asarray(fam["backbone_mask"])[:, 1].astype(float)                  # [L]
        if not np.all(np.isfinite(plddt)) or not np.all(np.isfinite(pred_ca)):
            raise InputError(f"non-finite prediction for family '{fid}'", path=store.path)
        per_res = per_residue_lddt_ca(pred_ca, true_ca, mask)                        # [L]
        obs = mask > 0
        out.append({"family_id": fid, "length": int(len(plddt)), "observed": int(obs.sum()),
                    "mean_plddt": float(plddt.mean()), "lddt_ca": lddt_ca(pred_ca, true_ca, mask),
                    "plddt": plddt[obs].round(3).tolist(), "true_lddt": per_res[obs].round(4).tolist()})
    return out


def calibrate(checkpoint: str | Path, data: str | Path, out_dir: str | Path | None = None, *,
              families: list[str] | None = None, target_lddt: float = 0.7,
              max_msa_rows: int = 128, num_recycles: int | None = None) -> Path:
    """Run the whole report; returns the path of calibration.json."""
    from protdp.data.store import FamilyStore
    from protdp.inference.checkpoint import checkpoint_home, load_model_checkpoint

    if not 0.0 < target_lddt <= 1.0:
        raise InputError(f"target lDDT must be in (0, 1], got {target_lddt}", field="--target-lddt")
    loaded = load_model_checkpoint(checkpoint)
    if families is None:     # a training run: its validation split, as `protdp release` uses
        from protdp.safety.heldout import held_out
        from protdp.train.checkpointing import read_any_weights
        meta = read_any_weights(checkpoint).meta
        if (meta.get("config") or {}).get("data"):
            families = held_out(meta, data, None)[1]
    with FamilyStore(data) as store:
        fams = list(store.family_ids) if families is None else families
        missing = [f for f in fams if f not in store]
        if missing:
            raise InputError(f"families not in the store: {missing}", path=data, field="--families")
        if not fams:
            raise InputError("the store has no families", path=data)
        per_target = evaluate_families(loaded, store, fams, max_msa_rows, num_recycles)
    report = summarize(per_target, target_lddt)
    if out_dir is None:
        out_dir = checkpoint_home(loaded.path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "calibration.png"
    plot_reliability(report, per_target, png)
    doc = {"format": CALIBRATION_FORMAT,
           "checkpoint": {"path": str(loaded.path), "sha256": loaded.sha256, "weights": loaded.weights},
           "data": str(Path(data).resolve()), "families": fams, "num_recycles": num_recycles,
           **report, "plot": png.name,
           "per_target": [{k: v for k, v in r.items() if k not in ("plddt", "true_lddt")}
                          for r in per_target]}
    return atomic_write_json(out_dir / "calibration.json", doc, allow_nan=True)
