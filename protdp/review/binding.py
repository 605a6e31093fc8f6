"""An approval binds bytes: the sha256 of every file of an item, taken by the queue at enqueue,
and the check that the files are still those bytes when they are exported or calibrated on.

`file_digests` hashes the item's files in its folder (structure files, scores.json, PAE,
provenance.json; None for one that is absent), every MSA file its provenance lists
(`msa:<path>`) and records the checkpoint digest the predictor names (`checkpoint`). The
digests are part of the item's content digest (`protdp.review.audit.content_digest`), which a
decision event binds (`bound_sha256`). `mismatches` re-hashes the same files and names every
one that changed, vanished or appeared; an item with any mismatch is never exported.

The workbench shows a reviewer only the bound bytes: `served_bytes_match` refuses a file whose
bytes are not the ones recorded at enqueue, `changed_files` names what changed for the page's
warning, and an approval is refused while any file differs (so an approval binds the bytes
the reviewer saw, complexes' ranked_*/PAE JSON included).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from protdp.fileio import sha256_file
from protdp.review.files import item_files

_HEX = set("0123456789abcdef")


def _digest(path: Path) -> str | None:
    """sha256 of a regular file (links not followed), None when absent or not a file."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        return sha256_file(path)
    except OSError:
        return None


def _provenance(folder: Path, name: str | None) -> dict:
    if not name:
        return {}
    try:
        data = json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _checkpoint_sha(scores: dict, prov: dict) -> str | None:
    value = scores.get("checkpoint_sha256") or (prov.get("checkpoint") or {}).get("sha256")
    return value if isinstance(value, str) and len(value) == 64 and set(value) <= _HEX else None


def file_digests(row: dict) -> dict[str, str | None]:
    """{kind: sha256 | None, "msa:<path>": sha256 | None, "checkpoint": digest} of an item row
    (its `folder`, bare `paths` and `scores`)."""
    if not row.get("folder"):
        return {}
    folder = Path(row["folder"])
    files = item_files(row)
    out: dict[str, str | None] = {kind: _digest(folder / name)
                                  for kind, name in sorted(files.items())}
    prov = _provenance(folder, files.get("provenance"))
    for entry in (prov.get("inputs") or {}).get("msa_files") or []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            out[f"msa:{entry['path']}"] = _digest(Path(entry["path"]))
    checkpoint = _checkpoint_sha(row.get("scores") or {}, prov)
    if checkpoint:
        out["checkpoint"] = checkpoint
    return out


def mismatches(record: dict) -> list[str]:
    """Why the item's files are not the bytes recorded at enqueue (empty: they are)."""
    recorded = record.get("file_sha256")
    if not recorded:
        return ["no file digests were recorded at enqueue (queued before protdp bound "
                "approvals to bytes); re-predict and review it again"]
    now = file_digests(record)
    problems = []
    for name in sorted(set(recorded) | set(now)):
        if name == "checkpoint":
            if recorded.get(name) != now.get(name):
                problems.append(f"checkpoint digest {now.get(name)} differs from the "
                                f"{recorded.get(name)} recorded at enqueue")
            continue
        want, got = recorded.get(name), now.get(name)
        if want is None and got is None:
            continue
        if want is None and recorded.get("provenance") is None and (
                name == "provenance" or name.startswith("msa:")):
            # provenance.json (and so the MSA list) written after enqueue, as it names the item
            # id: not bound here; distill checks each MSA against provenance's own sha256
            continue
        if want is None:
            problems.append(f"{name}: appeared after enqueue")
        elif got is None:
            problems.append(f"{name}: gone since enqueue")
        elif want != got:
            problems.append(f"{name}: changed since enqueue (sha256 {got[:12]}, approved "
                            f"{want[:12]})")
    if recorded.get("scores") is None:
        problems.append("scores: was absent at enqueue, so the approval binds no bytes of it")
    if not any(recorded.get(k) for k in ("pdb", "cif")):
        problems.append("no structure file was present at enqueue")
    return problems


CHANGED_MARKS = ("changed since enqueue", "appeared after enqueue", "checkpoint digest")


def changed_files(record: dict) -> list[str]:
    """The mismatches that mean different bytes are in place now (a file changed or appeared,
    another checkpoint); a file that is merely unreadable from here is not among them."""
    if not record.get("file_sha256"):
        return []
    return [p for p in mismatches(record) if any(m in p for m in CHANGED_MARKS)]


def served_bytes_match(record: dict, kind: str, data: bytes) -> bool:
    """Whether `data`, about to be shown as the item's `kind` file, is the recorded bytes (True
    when nothing was recorded for that kind: provenance.json, written after enqueue)."""
    want = (record.get("file_sha256") or {}).get(kind)
    return want is None or hashlib.sha256(data).hexdigest() == want
