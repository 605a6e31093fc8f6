"""Confidence gate: route every prediction to exactly one of accepted / needs_review / rejected.

pLDDT is AF2's per-residue confidence head (AF2 supplement §1.9.6, Algorithm 29), reported per
target in AlphaFold DB's bands (`protdp.gating.bands`). Very-low residues are often disordered
or wrong; AF2's accuracy also falls for shallow MSAs (AF2 paper, Fig. 5a: a
sharp drop below ~30 effective sequences) and for inputs longer than anything seen in training.

The rule is conservative: a prediction is `accepted` only when *every* check passes; any flag
sends it to `needs_review` with machine-readable reason codes; invalid input is `rejected`.
Nothing low-confidence, non-finite or out of the training distribution can be accepted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from protdp.errors import InputError
from protdp.gating.bands import afdb_bands
from protdp.gating.policy import GatePolicy


@dataclass
class GateDecision:
    """Where one prediction goes and why; `to_dict()` is what summary/provenance record."""

    route: str
    reasons: list[str]
    mean_plddt: float | None
    afdb_bands: dict[str, float]
    very_low_fraction: float | None
    details: dict[str, str] = field(default_factory=dict)
    policy: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sequence_complexity(sequence: str) -> tuple[float, float]:
    """(largest single-residue fraction, Shannon entropy in bits) of a one-letter sequence."""
    if not sequence:
        return 0.0, 0.0
    _, counts = np.unique(np.frombuffer(sequence.upper().encode("ascii", "replace"), np.uint8),
                          return_counts=True)
    p = counts / counts.sum()
    return float(p.max()), float(-(p * np.log2(p)).sum())


def route(plddt: np.ndarray, *, length: int, msa_depth: int, training_crop: int | None,
          screening_hits: Sequence = (), invalid_reason: str | None = None,
          policy: GatePolicy, sequence: str | None = None,
          forced_reasons: dict[str, str] | None = None,
          ensemble_ca_rmsd: float | None = None,
          templates: Sequence[str] | None = None,
          interface: dict | None = None) -> GateDecision:
    """Route one prediction. `plddt` is [L] on the 0–100 scale; `length` must equal L.

    `invalid_reason` (set by the predictor for a bad target) -> rejected. Otherwise every failed
    check adds a reason code and the prediction needs review; only a clean pass is accepted.
    `forced_reasons` ({code: detail}, e.g. an unreleased checkpoint) always send it to review.
    `ensemble_ca_rmsd`: the largest Cα RMSD (Å) of the top-ranked model to the other models of
    its ensemble (None: a single prediction); above `policy.max_ensemble_ca_rmsd` -> review.
    `templates`: the templates the model used ("<pdb>_<chain>"; None: a template-free model): a
    shallow MSA without any is its own reason, and the shallow-MSA detail names the ones used.
    `interface` (complexes: {"iptm": float, "interface_pae": float | None, and optionally
    "interface_scores": `protdp.interface` rows}) adds low_iptm / uncertain_interface /
    low_ipsae, so a confident monomer with an unconfident interface goes to review.
    """
    policy_dict = dataclasses.asdict(policy)
    if invalid_reason is not None:
        return GateDecision("rejected", ["invalid_input"], None, afdb_bands(np.zeros(0)), None,
                            {"invalid_input": str(invalid_reason)}, policy_dict)

    p = np.asarray(plddt, dtype=np.float64)  # [L]
    if p.ndim != 1:
        raise InputError(f"expected a 1-D per-residue vector, got shape {p.shape}", field="plddt")
    if p.shape[0] != length:
        raise InputError(f"{p.shape[0]} values for a sequence of length {length}", field="plddt")

    flags: dict[str, str] = {}          # reason code -> detail, in the order found
    mean, very_low, bands = _plddt_checks(p, policy, flags)
    _input_checks(length, msa_depth, training_crop, sequence, templates, policy, flags)
    if ensemble_ca_rmsd is not None and not ensemble_ca_rmsd <= policy.max_ensemble_ca_rmsd:
        flags["ensemble_disagreement"] = (f"Cα RMSD {ensemble_ca_rmsd:.2f} Å between the "
                                          f"top-ranked model and another > "
                                          f"{policy.max_ensemble_ca_rmsd:g} Å")
    hits = list(screening_hits or ())
    if hits:
        flags["screening"] = "; ".join(str(h) for h in hits)
    if interface is not None:
        _interface_checks(interface, policy, flags)
    flags.update(forced_reasons or {})
    decision_route = "needs_review" if flags else "accepted"
    return GateDecision(decision_route, list(flags), mean, bands, very_low, flags, policy_dict)


def _plddt_checks(p: np.ndarray, policy: GatePolicy, flags: dict
                  ) -> tuple[float | None, float | None, dict]:
    """low_mean_plddt / low_plddt_fraction / invalid_plddt -> (mean, very-low fraction, bands);
    a broken confidence head must never look confident: review, with no summary numbers."""
    if p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(p > 100):
        bad = int(np.sum(~np.isfinite(p) | (p < 0) | (p > 100))) if p.size else 0
        flags["invalid_plddt"] = (f"{bad} of {p.size} values non-finite or outside 0–100"
                                  if p.size else "empty pLDDT vector")
        return None, None, afdb_bands(np.zeros(0))
    mean = float(p.mean())
    very_low = float(np.mean(p < policy.very_low_plddt))
    if not mean >= policy.accept_mean_plddt:
        flags["low_mean_plddt"] = f"mean pLDDT {mean:.1f} < {policy.accept_mean_plddt:g}"
    if very_low > policy.max_very_low_fraction:
        flags["low_plddt_fraction"] = (f"{very_low:.1%} of residues below pLDDT "
                                       f"{policy.very_low_plddt:g} "
                                       f"(max {policy.max_very_low_fraction:.0%})")
    return mean, very_low, afdb_bands(p)


def _input_checks(length, msa_depth, training_crop, sequence, templates, policy: GatePolicy,
                  flags: dict) -> None:
    """length_beyond_training_crop / shallow_msa (+ _no_template) / low_complexity."""
    if policy.review_beyond_training_crop and training_crop is not None and length > training_crop:
        flags["length_beyond_training_crop"] = f"length {length} > training crop {training_crop}"
    if msa_depth < policy.min_msa_depth:
        flags["shallow_msa"] = f"MSA depth {msa_depth} < minimum {policy.min_msa_depth}"
        if templates is not None and not templates:
            flags["shallow_msa_no_template"] = "no template found or given"
        elif templates:
            flags["shallow_msa"] += f"; {len(templates)} template(s): {', '.join(templates)}"
    if sequence:
        top, bits = sequence_complexity(sequence)
        if top > policy.max_single_residue_fraction or (
                len(sequence) >= 20 and bits < policy.min_sequence_entropy_bits):
            flags["low_complexity"] = (f"one residue type is {top:.0%} of the sequence, "
                                       f"composition entropy {bits:.2f} bits")


def _interface_checks(interface: dict, policy: GatePolicy, flags: dict) -> None:
    """low_iptm / uncertain_interface / low_ipsae (each max row below `min_ipsae`, named)."""
    iptm, ipae = interface.get("iptm"), interface.get("interface_pae")
    if iptm is None or not np.isfinite(iptm) or iptm < policy.min_iptm:
        flags["low_iptm"] = f"ipTM {iptm if iptm is None else f'{iptm:.3f}'} < {policy.min_iptm:g}"
    if ipae is not None and not ipae <= policy.max_interface_pae:
        flags["uncertain_interface"] = (f"interface PAE {ipae:.1f} Å > "
                                        f"{policy.max_interface_pae:g} Å")
    low = [r for r in interface.get("interface_scores") or () if r.get("type") == "max"
           and not (r.get("ipsae") is not None and r["ipsae"] >= policy.min_ipsae)]
    if low:
        flags["low_ipsae"] = "; ".join(
            f"chains {r['chain_1']}-{r['chain_2']} ipSAE "
            f"{'n/a' if r.get('ipsae') is None else format(r['ipsae'], '.3f')} < "
            f"{policy.min_ipsae:g}" for r in low)
