"""Thresholds of the confidence gate and where they come from.

The numbers live in one file, `protdp/configs/gating.yaml`: it is the source of the
`GatePolicy` defaults, so `GatePolicy()` is the shipped policy and a user's YAML maps 1:1 onto
the same fields. Calibration reports can only tighten it, never loosen it below that
configured floor: the pLDDT-vs-lDDT report (`protdp calibrate`) raises `accept_mean_plddt`;
the reviewed calibration (`protdp calibrate --from-reviews`) may raise `accept_mean_plddt`,
`min_msa_depth` and (from reviewed complexes) `min_iptm` and `min_ipsae`, and lower `max_very_low_fraction` and
`max_interface_pae`. A tightened policy is a
`CalibratedGatePolicy` whose `calibrations` name the reports applied (path, sha256, what
changed), so they land in provenance.json with the rest of the policy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from protdp.config import load_config, read_yaml
from protdp.errors import InputError
from protdp.resources import config_file

DEFAULT_GATING = config_file("gating.yaml")
_DEFAULTS = read_yaml(DEFAULT_GATING)
CALIBRATION_FORMAT = "protdp-calibration-v1"
REVIEWED_CALIBRATION_FORMAT = "protdp-review-calibration-v1"


@dataclass
class GatePolicy:
    """Thresholds of the confidence gate (configs/gating.yaml maps 1:1 onto these fields)."""

    accept_mean_plddt: float = _DEFAULTS["accept_mean_plddt"]
    """Mean pLDDT at or above which a prediction may be accepted (below: needs_review)."""
    very_low_plddt: float = _DEFAULTS["very_low_plddt"]
    """Residues with pLDDT strictly below this count as very low confidence."""
    max_very_low_fraction: float = _DEFAULTS["max_very_low_fraction"]
    """Largest tolerated fraction of very-low residues; above it: needs_review."""
    min_msa_depth: int = _DEFAULTS["min_msa_depth"]
    """MSA rows (query included) below which the input is out of distribution: needs_review."""
    review_beyond_training_crop: bool = _DEFAULTS["review_beyond_training_crop"]
    """Send targets longer than the checkpoint's training crop to review."""
    max_single_residue_fraction: float = _DEFAULTS["max_single_residue_fraction"]
    """Largest tolerated fraction of one residue type; above it: low_complexity (review)."""
    min_sequence_entropy_bits: float = _DEFAULTS["min_sequence_entropy_bits"]
    """Shannon entropy of the residue composition (bits) below which a sequence of at least
    20 residues is low-complexity (natural proteins: ~4.2 bits; a dipeptide repeat: 1 bit)."""

    max_ensemble_ca_rmsd: float = _DEFAULTS["max_ensemble_ca_rmsd"]
    """Largest Cα RMSD (Å, after superposition) between the top-ranked model of an ensemble
    and any other (model, seed) prediction; above it: ensemble_disagreement (review)."""

    min_iptm: float = _DEFAULTS["min_iptm"]
    """Complexes: ipTM (AlphaFold-Multimer) below which the interface needs review (low_iptm)."""
    max_interface_pae: float = _DEFAULTS["max_interface_pae"]
    """Complexes: mean predicted aligned error (Å) over cross-chain residue pairs above which
    the interface needs review (uncertain_interface)."""

    min_ipsae: float = _DEFAULTS["min_ipsae"]
    """Complexes: ipSAE (Dunbrack 2025; `protdp.interface`) of each chain pair's max row below
    which that interface needs review (low_ipsae, naming the pair)."""

    def __post_init__(self):
        rmsd = self.max_ensemble_ca_rmsd
        if isinstance(rmsd, bool) or not isinstance(rmsd, (int, float)) or not rmsd > 0:
            raise ValueError(f"max_ensemble_ca_rmsd must be a positive number (Å), got {rmsd!r}")
        if isinstance(self.min_iptm, bool) or not isinstance(self.min_iptm, (int, float)) \
                or not 0 <= self.min_iptm <= 1:
            raise ValueError(f"min_iptm must be a number in [0, 1], got {self.min_iptm!r}")
        if isinstance(self.min_ipsae, bool) or not isinstance(self.min_ipsae, (int, float)) \
                or not 0 <= self.min_ipsae <= 1:
            raise ValueError(f"min_ipsae must be a number in [0, 1], got {self.min_ipsae!r}")
        pae = self.max_interface_pae
        if isinstance(pae, bool) or not isinstance(pae, (int, float)) or not pae > 0:
            raise ValueError(f"max_interface_pae must be a number > 0 (Å), got {pae!r}")
        for name in ("accept_mean_plddt", "very_low_plddt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
                raise ValueError(f"{name} must be a number in [0, 100], got {value!r}")
        frac = self.max_very_low_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
            raise ValueError(f"max_very_low_fraction must be a number in [0, 1], got {frac!r}")
        if isinstance(self.min_msa_depth, bool) or not isinstance(self.min_msa_depth, int) \
                or self.min_msa_depth < 0:
            raise ValueError(f"min_msa_depth must be a non-negative integer, got {self.min_msa_depth!r}")
        frac = self.max_single_residue_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
            raise ValueError(f"max_single_residue_fraction must be a number in (0, 1], got {frac!r}")
        bits = self.min_sequence_entropy_bits
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 <= bits <= 4.33:
            raise ValueError(f"min_sequence_entropy_bits must be a number in [0, 4.32], got {bits!r}")
        if not isinstance(self.review_beyond_training_crop, bool):
            raise ValueError("review_beyond_training_crop must be true or false, "
                             f"got {self.review_beyond_training_crop!r}")



def load_gate_policy(path_or_policy=None) -> GatePolicy:
    """A GatePolicy as given, from a YAML path, or the shipped one (None)."""
    if isinstance(path_or_policy, GatePolicy):
        return path_or_policy
    if path_or_policy is None:
        return GatePolicy()
    return load_config(GatePolicy, path_or_policy)


@dataclass
class CalibratedGatePolicy(GatePolicy):
    """A GatePolicy tightened by calibration reports (only the loaders below make one)."""

    calibrations: tuple = ()
    """One record per report applied: path, sha256, format and the thresholds it set."""


def read_calibration_report(path: Path) -> dict:
    try:
        raw = path.read_bytes()
        doc = json.loads(raw)
    except OSError as exc:
        raise InputError(f"cannot read calibration report: {exc.strerror}", path=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    except UnicodeDecodeError as exc:       # binary data given as the report (was a traceback)
        raise InputError(f"not a calibration report: not UTF-8 JSON (byte {exc.start})",
                         path=path) from None
    if not isinstance(doc, dict) or doc.get("format") not in (CALIBRATION_FORMAT,
                                                              REVIEWED_CALIBRATION_FORMAT):
        raise InputError(f"not a calibration report (expected format '{CALIBRATION_FORMAT}' "
                         f"or '{REVIEWED_CALIBRATION_FORMAT}')", path=path, field="format")
    doc["_sha256"] = hashlib.sha256(raw).hexdigest()
    return doc


def _number(doc: dict, section: str, key: str, lo: float, hi: float, path: Path) -> float:
    value = (doc.get(section) or {}).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise InputError(f"expected a number in [{lo:g}, {hi:g}], got {value!r}", path=path,
                         field=f"{section}.{key}")
    return float(value)


def _tightened(base: GatePolicy, path: Path, doc: dict, changes: dict) -> CalibratedGatePolicy:
    record = {"path": str(path.resolve()), "sha256": doc["_sha256"], "format": doc["format"],
              "applied": changes}
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(GatePolicy)}
    return CalibratedGatePolicy(**{**fields, **changes},
                                calibrations=(*getattr(base, "calibrations", ()), record))


def load_calibrated_policy(calibration_json: str | Path, base_policy: GatePolicy | None = None
                           ) -> GatePolicy:
    """`base_policy` (default GatePolicy()) tightened by a calibration report of either kind.

    pLDDT-vs-lDDT report: accept_mean_plddt = max(base, calibrated) (an unachievable target
    is stored as 100: review everything). Reviewed calibration: see `load_reviewed_policy`."""
    path = Path(calibration_json)
    doc = read_calibration_report(path)
    base = base_policy if base_policy is not None else GatePolicy()
    if doc["format"] == REVIEWED_CALIBRATION_FORMAT:
        return load_reviewed_policy(path, base, doc=doc)
    thr = _number(doc, "threshold", "accept_mean_plddt", 0, 100, path)
    return _tightened(base, path, doc, {"accept_mean_plddt": max(thr, base.accept_mean_plddt)})


def load_reviewed_policy(calibration_json: str | Path, base_policy: GatePolicy | None = None,
                         *, doc: dict | None = None) -> GatePolicy:
    """`base_policy` tightened by `protdp calibrate --from-reviews`: the configured policy is
    the floor (mean pLDDT, MSA depth and ipTM only go up, the very-low fraction and the
    interface PAE only down). A part made from too few reviews (its status other than "ok":
    the report's own for pLDDT, `complexes.status` for ipTM / interface PAE) changes nothing."""
    path = Path(calibration_json)
    doc = doc if doc is not None else read_calibration_report(path)
    base = base_policy if base_policy is not None else GatePolicy()
    if doc.get("format") != REVIEWED_CALIBRATION_FORMAT:
        raise InputError(f"not a reviewed calibration (format '{REVIEWED_CALIBRATION_FORMAT}')",
                         path=path, field="format")
    changes = {}
    if doc.get("status") == "ok":
        mean = _number(doc, "policy", "accept_mean_plddt", 0, 100, path)
        frac = _number(doc, "policy", "max_very_low_fraction", 0, 1, path)
        depth = _number(doc, "policy", "min_msa_depth", 0, 10**9, path)
        changes.update(accept_mean_plddt=max(mean, base.accept_mean_plddt),
                       max_very_low_fraction=min(frac, base.max_very_low_fraction),
                       min_msa_depth=max(int(depth), base.min_msa_depth))
    complexes = doc.get("complexes")
    if isinstance(complexes, dict) and complexes.get("status") == "ok":   # issue 32
        iptm = _number(complexes, "policy", "min_iptm", 0, 1, path)
        ipae = _number(complexes, "policy", "max_interface_pae", 1e-9, 10**6, path)
        changes.update(min_iptm=max(iptm, base.min_iptm),
                       max_interface_pae=min(ipae, base.max_interface_pae))
        if "min_ipsae" in (complexes.get("policy") or {}):              # issue 43
            ipsae = _number(complexes, "policy", "min_ipsae", 0, 1, path)
            changes["min_ipsae"] = max(ipsae, base.min_ipsae)
    return _tightened(base, path, doc, changes) if changes else base
