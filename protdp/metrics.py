"""Structure-comparison metrics on Cα traces: lDDT-Cα (Mariani et al. 2013; AF2 supplement
§1.9.6 / Alg. 29), Kabsch-superposed RMSD and GDT-TS.

Inputs are torch tensors or numpy arrays of shape [L, 3] (lDDT also accepts leading batch
dims) plus an optional residue mask [L] (1 = present). lDDT-Cα and GDT-TS are fractions in
[0, 1]; RMSD is in the input unit (Å).

lDDT-Cα: pairs (i, j), i != j, both present, with distance < 15 Å in the TRUE structure are
scored by the fraction of the thresholds 0.5, 1, 2, 4 Å that |d_pred - d_true| stays under.
The global score is normalised over all scored pairs (not a mean of per-residue scores).
"""

from __future__ import annotations

import numpy as np
import torch

LDDT_CUTOFF = 15.0
LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)
GDT_CUTOFFS = (1.0, 2.0, 4.0, 8.0)


def _as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64)
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def _mask_or_ones(mask, like: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return torch.ones(like.shape[:-1], dtype=like.dtype, device=like.device)
    return _as_tensor(mask).to(like.device)


def _check(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor) -> None:
    if pred.shape != true.shape or pred.shape[-1] != 3:
        raise ValueError(f"pred {tuple(pred.shape)} and true {tuple(true.shape)} must both be [..., L, 3]")
    if mask.shape != pred.shape[:-1]:
        raise ValueError(f"mask {tuple(mask.shape)} must be {tuple(pred.shape[:-1])}")


def lddt_ca_tensor(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor,
                   per_residue: bool = False, cutoff: float = LDDT_CUTOFF,
                   eps: float = 1e-10) -> torch.Tensor:
    """Batched torch lDDT-Cα (AF2 `lddt` formula). pred/true [*, L, 3], mask [*, L] ->
    [*] (global) or [*, L] (per residue; residues without scored pairs get 1, as in AF2)."""
    d_true = torch.sqrt(eps + ((true[..., :, None, :] - true[..., None, :, :]) ** 2).sum(-1))
    d_pred = torch.sqrt(eps + ((pred[..., :, None, :] - pred[..., None, :, :]) ** 2).sum(-1))
    eye = torch.eye(mask.shape[-1], dtype=mask.dtype, device=mask.device)
    scored = (d_true < cutoff).to(mask.dtype) * mask[..., :, None] * mask[..., None, :] * (1.0 - eye)
    diff = (d_true - d_pred).abs()
    score = sum((diff < t).to(mask.dtype) for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    dims = (-1,) if per_residue else (-2, -1)
    return (eps + (scored * score).sum(dims)) / (eps + scored.sum(dims))


def lddt_ca(pred_ca, true_ca, mask=None) -> float:
    """Global lDDT-Cα in [0, 1] of pred_ca [L, 3] against true_ca [L, 3]."""
    pred, true = _as_tensor(pred_ca), _as_tensor(true_ca)
    mask_t = _mask_or_ones(mask, pred)
    _check(pred, true, mask_t)
    return float(lddt_ca_tensor(pred, true, mask_t))


def per_residue_lddt_ca(pred_ca, true_ca, mask=None):
    """Per-residue lDDT-Cα [L] in [0, 1] (0 at masked residues); numpy in -> numpy out."""
    pred, true = _as_tensor(pred_ca), _as_tensor(true_ca)
    mask_t = _mask_or_ones(mask, pred)
    _check(pred, true, mask_t)
    out = lddt_ca_tensor(pred, true, mask_t, per_residue=True) * mask_t
    if isinstance(pred_ca, torch.Tensor):
        return out.to(pred_ca.dtype if pred_ca.is_floating_point() else torch.float32)
    return out.numpy()


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def kabsch(mobile: np.ndarray, target: np.ndarray, weights: np.ndarray | None = None):
    """Rotation R and translation t minimising sum w |R x + t - y|^2 (proper rotation, det +1).

    mobile, target [L, 3] (numpy or torch) -> (R [3, 3], t [3]) as float64 numpy."""
    x, y = _np(mobile), _np(target)
    w = np.ones(len(x)) if weights is None else _np(weights)
    if w.sum() <= 0:
        raise ValueError("kabsch needs at least one weighted point")
    w = w / w.sum()
    cx, cy = (w[:, None] * x).sum(0), (w[:, None] * y).sum(0)
    h = ((x - cx) * w[:, None]).T @ (y - cy)
    u, _, vt = np.linalg.svd(h)
    d = np.sign(np.linalg.det(vt.T @ u.T)) or 1.0
    rot = vt.T @ np.diag([1.0, 1.0, d]) @ u.T
    return rot, cy - rot @ cx


def superpose(mobile, target, mask=None) -> np.ndarray:
    """mobile [L, 3] superposed onto target (Kabsch on the masked positions) -> numpy [L, 3]."""
    rot, t = kabsch(mobile, target, None if mask is None else _np(mask))
    return _np(mobile) @ rot.T + t


def rmsd_ca(pred_ca, true_ca, mask=None) -> float:
    """Cα RMSD after optimal superposition (Kabsch) over the masked residues."""
    pred, true = _np(pred_ca), _np(true_ca)
    m = np.ones(len(pred)) if mask is None else _np(mask)
    if pred.shape != true.shape or pred.ndim != 2 or pred.shape[1] != 3 or m.shape != pred.shape[:1]:
        raise ValueError(f"rmsd_ca expects [L, 3] arrays and an [L] mask, got {pred.shape}, "
                         f"{true.shape}, {m.shape}")
    moved = superpose(pred, true, m)
    return float(np.sqrt((m * ((moved - true) ** 2).sum(-1)).sum() / m.sum()))


def gdt_ts(pred_ca, true_ca, mask=None, window: int = 8) -> float:
    """GDT-TS in [0, 1]: mean over cutoffs 1, 2, 4, 8 Å of the largest fraction of residues
    within the cutoff under some superposition.

    The superposition search is LGA-like but heuristic: seeds are the global fit and sliding
    windows of `window` residues, each refined by re-fitting on the residues under the cutoff."""
    pred, true = _np(pred_ca), _np(true_ca)
    m = np.ones(len(pred)) if mask is None else _np(mask)
    idx = np.flatnonzero(m > 0)
    if len(idx) == 0:
        raise ValueError("gdt_ts needs at least one residue")
    pred, true = pred[idx], true[idx]
    n = len(idx)
    seeds = [np.arange(n)] + [np.arange(s, min(s + window, n)) for s in range(0, max(1, n - window + 1),
                                                                              max(1, window // 2))]
    best = np.zeros(len(GDT_CUTOFFS))
    for seed in seeds:
        if len(seed) < 3 and n >= 3:
            continue
        for k, cutoff in enumerate(GDT_CUTOFFS):
            subset = seed
            for _ in range(5):
                rot, t = kabsch(pred[subset], true[subset])
                dist = np.linalg.norm(pred @ rot.T + t - true, axis=-1)
                close = dist < cutoff
                best = np.maximum(best, [(dist < c).mean() for c in GDT_CUTOFFS])
                if close.sum() < 3 or np.array_equal(np.flatnonzero(close), subset):
                    break
                subset = np.flatnonzero(close)
    return float(best.mean())
