"""A prediction folder's completion records: is a previous run's prediction done, or published
but pending (the run stopped before the review queue / completion mark)?

`pending.json` (the provenance record less the review item) travels inside the build and is
renamed into place with the outputs; `provenance.json` is written last and is the completion
mark. Both list the outputs with their SHA-256 (`layout.outputs_intact`), so a truncated or
swapped file is never taken as done.
"""

from __future__ import annotations

import json
from pathlib import Path

from protdp.inference.layout import outputs_intact

PENDING_FILE = "pending.json"
PROVENANCE_FILE = "provenance.json"


def completed_record(pdir: Path, fingerprint: str) -> dict | None:
    """The previous run's provenance when this prediction is done with identical inputs (same
    `fingerprint`, every output intact), else None."""
    prov = pdir / PROVENANCE_FILE
    if not prov.is_file():
        return None
    try:
        data = json.loads(prov.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if data.get("fingerprint") != fingerprint:
        return None
    if not outputs_intact(pdir, data):
        return None
    return data


def intact_pending(pdir: Path, fingerprint: str) -> bool:
    """Published, not yet complete, every file present: no provenance.json, or one that is
    not a whole JSON object (torn: provenance is not among the bytes the review item
    binds, so finishing keeps the item's binding; redoing would break it)."""
    try:
        data = json.loads((pdir / PENDING_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    try:
        whole = isinstance(json.loads((pdir / PROVENANCE_FILE).read_text()), dict)
    except (OSError, ValueError):
        whole = False
    return (not whole and data.get("fingerprint") == fingerprint
            and outputs_intact(pdir, data))


def item_paths(paths: dict, pdir: Path) -> dict:
    """Every file of a prediction for its review item (the queue hashes them): the outputs and
    pending.json, the record provenance.json repeats once the item id is known. A file in a
    subfolder (AlphaFold's `msas/chain_id_map.json`) is bound through pending.json, whose
    `outputs_sha256` holds its digest (the queue binds the files of one folder)."""
    out = {k: v for k, v in paths.items() if k != "provenance" and Path(v).parent == pdir}
    out["pending"] = str(pdir / PENDING_FILE)
    return out
