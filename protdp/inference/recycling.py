"""Early stop of recycling at inference (AF2 supplement 1.10, Algorithm 2's recycling loop).

ColabFold's `--recycle-early-stop-tolerance` (colabfold/alphafold/models.py) stops when the
structure stops moving: after each pass the Cα-Cα distance matrix D [L, L] is compared with
the previous pass's, and recycling stops when

    sqrt( sum_ij mask_ij (D_ij - D'_ij)^2 / sum_ij mask_ij ) < tolerance   (Å)

`--stop-at-score` stops once the mean pLDDT (0-100) reaches the score. `RecycleEarlyStop`
is the model's `after_pass` hook (`AlphaFoldModel.forward`) and records every pass's change
and mean pLDDT for the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protdp.data.residue_constants import ATOM_TYPES

CA_INDEX = ATOM_TYPES.index("CA")


def ca_distance_matrix(positions: torch.Tensor) -> torch.Tensor:
    """positions [*, L, 37, 3] -> Cα distances [*, L, L] (Å)."""
    ca = positions[..., CA_INDEX, :].float()                                  # [*, L, 3]
    return torch.cdist(ca, ca)


def ca_distance_change(prev: torch.Tensor, now: torch.Tensor, seq_mask: torch.Tensor) -> float:
    """ColabFold's tolerance metric: RMS change of the masked Cα distance matrix (Å).
    prev, now [L, L]; seq_mask [L]."""
    pair = seq_mask[:, None] * seq_mask[None, :]                              # [L, L]
    sq = (now - prev) ** 2 * pair
    return float(torch.sqrt(sq.sum() / pair.sum().clamp(min=1)))


@dataclass
class RecycleEarlyStop:
    """`after_pass` hook: stop at a Cα-distance change below `tolerance` (Å) or a mean pLDDT at
    or above `stop_at_score`; either may be None (never stops on it)."""

    tolerance: float | None = None
    stop_at_score: float | None = None
    changes: list = field(default_factory=list)       # per pass from the 2nd: Å
    mean_plddts: list = field(default_factory=list)   # per pass
    reason: str | None = None
    _prev: torch.Tensor | None = None

    def __post_init__(self):
        if self.tolerance is not None and not self.tolerance >= 0:
            raise ValueError(f"recycle early-stop tolerance must be >= 0 Å, got {self.tolerance}")
        if self.stop_at_score is not None and not 0 <= self.stop_at_score <= 100:
            raise ValueError(f"stop-at-score must be in [0, 100], got {self.stop_at_score}")

    def __call__(self, i: int, out: dict) -> bool:
        # single-example inference batch: out["final_atom_positions"] [1, L, 37, 3]
        dist = ca_distance_matrix(out["final_atom_positions"][0])             # [L, L]
        mask = torch.ones(dist.shape[0], device=dist.device)
        mean = float(out["plddt"][0].float().mean())
        self.mean_plddts.append(round(mean, 2))
        stop = False
        if self._prev is not None:
            change = ca_distance_change(self._prev, dist, mask)
            self.changes.append(round(change, 4))
            if self.tolerance is not None and change < self.tolerance:
                self.reason, stop = f"Cα distance change {change:.3f} Å < {self.tolerance:g}", True
        if self.stop_at_score is not None and mean >= self.stop_at_score:
            self.reason, stop = f"mean pLDDT {mean:.1f} >= {self.stop_at_score:g}", True
        self._prev = dist
        return stop

    def record(self) -> dict:
        return {"tolerance": self.tolerance, "stop_at_score": self.stop_at_score,
                "ca_distance_change": self.changes, "mean_plddt_per_pass": self.mean_plddts,
                "stopped_early": self.reason}
