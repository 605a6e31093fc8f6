"""Release records: a checkpoint may serve predictions only after it passed the release checks.

`protdp.safety.release` evaluates a checkpoint (held-out calibration, the red-team suite, the
screening-list check of its training data) against `ReleasePolicy` and writes `release.json`
beside it; this module defines the policy (its numbers live in `protdp/configs/release.yaml`).
The record's format and its one reader (`read_release`) live with the checkpoint layout in
`protdp.train.release_record`, so the trainer can report a verdict too.

The site's policy is a floor: `site_policy()` is the packaged release.yaml, or the file an
administrator names in `PROTDP_RELEASE_POLICY`; `weaker_thresholds(record["policy"])` lists every
threshold a release record was judged by that is weaker than the site's, and `protdp predict`
treats such a record as no release at all (so `protdp release --config lax.yaml` cannot release
a model that the site's policy would refuse).

Multimer checkpoints are judged by the same pLDDT thresholds on their held-out complexes' residues
plus `min_interface_lddt` and `max_iptm_error` (`protdp.safety.complex_release`); those two bind
only the records of multimer checkpoints (`weaker_thresholds(..., complexes=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass

import os

from protdp.config import load_config, read_yaml
from protdp.errors import ProtdpError
from protdp.resources import config_file, resolve_config

DEFAULT_RELEASE = config_file("release.yaml")
SITE_POLICY_ENV = "PROTDP_RELEASE_POLICY"
_DEFAULTS = read_yaml(DEFAULT_RELEASE)
# the allowed range of each real-valued threshold
# an MSA of 0 rows or a band judged on 0 residues cannot be evaluated (main: a raw error later)
_INT_MINIMA = {"min_band_residues": 1, "min_targets": 0, "max_redteam_failures": 0,
               "max_msa_rows": 1}
_RANGES = {"min_spearman_residue": (-1.0, 1.0), "min_mean_lddt_ca": (0.0, 1.0),
           "max_ece": (0.0, 1.0), "band_tolerance": (0.0, float("inf")),
           "min_interface_lddt": (0.0, 1.0), "max_iptm_error": (0.0, 1.0)}


@dataclass
class ReleasePolicy:
    """Thresholds of the release gate (configs/release.yaml maps 1:1 onto these fields)."""

    min_spearman_residue: float = _DEFAULTS["min_spearman_residue"]
    """Spearman of per-residue pLDDT vs true lDDT-Cα on held-out families, at least."""
    max_ece: float = _DEFAULTS["max_ece"]
    """Expected calibration error of pLDDT (0-1 scale, 10 pLDDT bins), at most."""
    min_mean_lddt_ca: float = _DEFAULTS["min_mean_lddt_ca"]
    """Mean lDDT-Cα (0-1) of the held-out predictions, at least: calibration alone would release
    a model that predicts noise and says so."""
    band_tolerance: float = _DEFAULTS["band_tolerance"]
    """Each AFDB band's mean true lDDT-Cα (x100) must reach its floor minus this."""
    min_band_residues: int = _DEFAULTS["min_band_residues"]
    """Bands with fewer held-out residues are not judged."""
    min_targets: int = _DEFAULTS["min_targets"]
    """Fewer held-out families: the calibration checks fail for want of evidence."""
    max_redteam_failures: int = _DEFAULTS["max_redteam_failures"]
    """Red-team cases or global checks that may miss."""
    screening_list: str = _DEFAULTS["screening_list"]
    """FASTA of sequences of concern the training data must not match."""
    max_msa_rows: int = _DEFAULTS["max_msa_rows"]
    """MSA depth of the held-out predictions (per chain for complexes)."""
    min_interface_lddt: float = _DEFAULTS["min_interface_lddt"]
    """Complexes: mean interface lDDT-Cα (inter-chain pairs, 0-1) of the held-out complexes,
    at least; and every held-out complex the gate's complex checks accept must reach it."""
    max_iptm_error: float = _DEFAULTS["max_iptm_error"]
    """Complexes: mean |ipTM - interface lDDT-Cα| of the held-out complexes, at most."""

    def __post_init__(self):
        for name, low in _INT_MINIMA.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if not isinstance(self.screening_list, str) or not self.screening_list.strip():
            raise ValueError(f"screening_list must be a FASTA file path, got "
                             f"{self.screening_list!r}")
        try:                         # found now, not after a 15 s evaluation
            resolve_config(self.screening_list)
        except ProtdpError as exc:
            raise ValueError(f"screening_list: {exc}") from None
        for name, (low, high) in _RANGES.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
                raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {v!r}")


# direction of each threshold: a record judged with a smaller "at least" or a larger "at most"
# value than the site's was judged more leniently
_AT_LEAST = ("min_spearman_residue", "min_mean_lddt_ca", "min_targets")
_AT_MOST = ("max_ece", "band_tolerance", "min_band_residues", "max_redteam_failures")
COMPLEX_AT_LEAST = ("min_interface_lddt",)     # judged for multimer checkpoints only
COMPLEX_AT_MOST = ("max_iptm_error",)


def site_policy_path() -> str:
    """The site's release policy file: $PROTDP_RELEASE_POLICY (set by an administrator), else
    the packaged release.yaml."""
    return os.environ.get(SITE_POLICY_ENV) or str(DEFAULT_RELEASE)


def site_policy() -> ReleasePolicy:
    return load_config(ReleasePolicy, site_policy_path())


def weaker_thresholds(recorded, complexes: bool = True) -> list[str]:
    """Every threshold of a release record's policy weaker than the site's ("name recorded vs
    site"); a missing or malformed policy counts as weaker in every threshold. The complex
    thresholds count only for a record of a multimer checkpoint (`complexes`), so a monomer
    record written before they existed keeps serving."""
    site = site_policy()
    recorded = recorded if isinstance(recorded, dict) else {}
    weaker = []
    at_least = _AT_LEAST + (COMPLEX_AT_LEAST if complexes else ())
    at_most = _AT_MOST + (COMPLEX_AT_MOST if complexes else ())
    for name in at_least + at_most:
        want, got = getattr(site, name), recorded.get(name)
        number = isinstance(got, (int, float)) and not isinstance(got, bool)
        if not number or (got < want if name in at_least else got > want):
            op = ">=" if name in at_least else "<="
            weaker.append(f"{name} {got!r} (site requires {op} {want!r})")
    if recorded.get("screening_list") != site.screening_list:
        weaker.append(f"screening_list {recorded.get('screening_list')!r} (site uses "
                      f"{site.screening_list!r})")
    return weaker
