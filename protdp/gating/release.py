"""Release records: a checkpoint may serve predictions only after it passed the release checks.

`protdp.safety.release` evaluates a checkpoint (held-out calibration, the red-team suite, the
screening-list check of its training data) against `ReleasePolicy` and writes `release.json`
beside it; this module defines the policy (its numbers live in `protdp/configs/release.yaml`)
and reads the record back for `protdp predict`. A record counts only for the exact weights it
was made for: its checkpoint sha256 must equal the loaded checkpoint's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from protdp.config import read_yaml
from protdp.resources import config_file
from protdp.train.checkpointing import RELEASE_FILE

RELEASE_FORMAT = "protdp-release-v1"
DEFAULT_RELEASE = config_file("release.yaml")
_DEFAULTS = read_yaml(DEFAULT_RELEASE)


@dataclass
class ReleasePolicy:
    """Thresholds of the release gate (configs/release.yaml maps 1:1 onto these fields)."""

    min_spearman_residue: float = _DEFAULTS["min_spearman_residue"]
    """Spearman of per-residue pLDDT vs true lDDT-Cα on held-out families, at least."""
    max_ece: float = _DEFAULTS["max_ece"]
    """Expected calibration error of pLDDT (0-1 scale, 10 pLDDT bins), at most."""
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
    """MSA depth of the held-out predictions."""

    def __post_init__(self):
        for name in ("min_band_residues", "min_targets", "max_redteam_failures", "max_msa_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if not -1.0 <= self.min_spearman_residue <= 1.0:
            raise ValueError(f"min_spearman_residue must be in [-1, 1], got {self.min_spearman_residue}")
        if not 0.0 <= self.max_ece <= 1.0:
            raise ValueError(f"max_ece must be in [0, 1], got {self.max_ece}")


@dataclass
class ReleaseStatus:
    """What `protdp predict` needs to know about a checkpoint's release record."""

    released: bool
    path: Path
    failed: list[str] = field(default_factory=list)     # names of failed checks
    reason: str = ""                                     # one line for people

    def to_dict(self) -> dict:
        return {"released": self.released, "record": str(self.path), "failed": self.failed,
                "reason": self.reason}


def read_release(home: str | Path, checkpoint_sha256: str) -> ReleaseStatus:
    """The release status of the checkpoint whose reports live in `home` (never raises for a
    missing or broken record: that is an unreleased checkpoint, with the reason)."""
    path = Path(home) / RELEASE_FILE
    if not path.is_file():
        return ReleaseStatus(False, path, ["release_record"],
                             f"no release record ({RELEASE_FILE}); run `protdp release {home}`")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return ReleaseStatus(False, path, ["release_record"], f"unreadable release record: {exc}")
    if not isinstance(doc, dict) or doc.get("format") != RELEASE_FORMAT:
        return ReleaseStatus(False, path, ["release_record"],
                             f"not a release record (expected format '{RELEASE_FORMAT}')")
    if (doc.get("checkpoint") or {}).get("sha256") != checkpoint_sha256:
        return ReleaseStatus(False, path, ["release_record"],
                             "the release record is for other weights (checkpoint sha256 differs)")
    checks = doc.get("checks") or []
    failed = [c.get("name", "?") for c in checks if not c.get("passed")]
    if not checks or failed or doc.get("verdict") != "released":
        return ReleaseStatus(False, path, failed or ["verdict"],
                             "failed release checks: " + ", ".join(failed or ["verdict"]))
    return ReleaseStatus(True, path)
