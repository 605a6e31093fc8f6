"""The release record beside a checkpoint, and its one reader.

`protdp release` (protdp.safety.release) evaluates a checkpoint and writes `release.json` in its
folder; the policy it judges by is `protdp.gating.release.ReleasePolicy`. Two readers need the
verdict: `protdp predict`, before it serves predictions, and the trainer, which reports the
verdict of its last checkpoint's background release job. Both read it here. A record counts
only for the exact weights it was made for: its checkpoint sha256 must equal the digest of the
checkpoint being served (`checkpointing.read_weights(...).sha256` or `checkpoint_digest`),
and (given `floor`, e.g. `protdp.gating.release.weaker_thresholds`, called with the record's
policy and `complexes=True` for a multimer checkpoint's record) only when the policy it was
judged by is not weaker than the site's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

RELEASE_FILE = "release.json"          # the record, in the checkpoint's folder
RELEASE_FORMAT = "protdp-release-v1"   # its "format" field
MULTIMER_RECORD_KIND = "alphafold-multimer"   # checkpoint.kind of a multimer checkpoint's record


@dataclass
class ReleaseStatus:
    """What `protdp predict` (and the trainer's report) needs to know about a release record."""

    released: bool
    path: Path
    failed: list[str] = field(default_factory=list)     # names of failed checks
    reason: str = ""                                     # one line for people

    def to_dict(self) -> dict:
        return {"released": self.released, "record": str(self.path), "failed": self.failed,
                "reason": self.reason}


def read_release(home: str | Path, checkpoint_sha256: str,
                 floor: Callable[..., list[str]] | None = None,
                 multimer: bool | None = None) -> ReleaseStatus:
    """The release status of the checkpoint whose reports live in `home` (never raises for a
    missing or broken record: that is an unreleased checkpoint, with the reason). `multimer`:
    whether the served checkpoint is a multimer one (its complex thresholds then count in the
    floor); None: as the record says."""
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
    failed = [c.get("name", "?") for c in checks if isinstance(c, dict) and not c.get("passed")]
    if not checks or failed or doc.get("verdict") != "released":
        return ReleaseStatus(False, path, failed or ["verdict"],
                             "failed release checks: " + ", ".join(failed or ["verdict"]))
    if multimer is None:
        multimer = (doc.get("checkpoint") or {}).get("kind") == MULTIMER_RECORD_KIND
    weaker = floor(doc.get("policy"), complexes=multimer) if floor is not None else []
    if weaker:
        return ReleaseStatus(False, path, ["release_policy"],
                             "released under a policy weaker than this site's: "
                             + "; ".join(weaker))
    return ReleaseStatus(True, path)
