"""Search output: a3m (insertions lowercase, deduplicated), Stockholm, depth and coverage.

The alignment of a search has the query first; columns where the query has a residue are the
query's positions. The a3m keeps those columns (residues upper case, gaps '-') and writes a
row's residues in every other column as lower-case insertions, dropping gaps there: the AF2
convention (`parsers.convert_stockholm_to_a3m`) that `protdp.data.parse.parse_a3m` reads.
Rows are first truncated to `max_sequences` in hit order (AF2 `truncate_stockholm_msa`), then
rows whose query-column sequence repeats an earlier one are dropped (AF2 `make_msa_features`).
Every file is written to a temporary name and renamed, so a kill never leaves half a file.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.fileio import atomic_write_bytes

_GAP = ord("-")
_DROP = 0


def atomic_write(path: Path, data: bytes) -> Path:
    """Write `data` to `path` via a temporary file in the same folder and a rename (never over
    a device node or FIFO: `protdp.fileio.atomic_write_bytes`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_bytes(path, data)


@dataclass
class A3m:
    """An a3m text and what it holds."""

    text: str
    depth: int                     # rows written, query included
    duplicates: int                # rows dropped as repeats of an earlier row
    truncated: int                 # rows dropped by max_sequences
    coverage: list[int] = field(default_factory=list)   # per query residue: other rows aligned

    def stats(self) -> dict:
        cov = np.asarray(self.coverage, dtype=np.int64)
        return {"depth": self.depth, "duplicates": self.duplicates, "truncated": self.truncated,
                "coverage_min": int(cov.min()) if cov.size else 0,
                "coverage_mean": round(float(cov.mean()), 2) if cov.size else 0.0,
                "covered_fraction": round(float((cov > 0).mean()), 4) if cov.size else 0.0}


def _rows(msa) -> tuple[list[str], np.ndarray]:
    """Row names and the alignment as ASCII codes uint8 [N, C] (row 0 = query)."""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in msa.names]
    rows = [msa.alignment[i] for i in range(len(names))]
    arr = np.frombuffer("".join(rows).encode("ascii"), np.uint8).reshape(len(rows), -1)
    return names, arr


def alignment_to_a3m(msa, max_sequences: int, query_name: str | None = None) -> A3m:
    """pyhmmer TextMSA (query first) -> A3m; see the module docstring for the convention."""
    names, arr = _rows(msa)
    n_all = len(names)
    names, arr = names[:max_sequences], arr[:max_sequences]                  # [N, C]
    is_res = ((arr | 0x20) >= ord("a")) & ((arr | 0x20) <= ord("z"))         # letters
    match = is_res[0]                                                         # [C]
    upper = np.where(is_res, arr & ~np.uint8(0x20), np.uint8(_GAP))          # match columns
    lower = np.where(is_res, arr | np.uint8(0x20), np.uint8(_DROP))          # insert columns
    out = np.where(match[None, :], upper, lower)                               # [N, C]
    keys = [r.tobytes() for r in upper[:, match]]                             # [N, L] rows
    seen: set[bytes] = set()
    keep = []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    if query_name is not None:
        names[0] = query_name
    buf = io.StringIO()
    for i in keep:
        row = out[i].tobytes().replace(b"\0", b"").decode("ascii")
        buf.write(f">{names[i]}\n{row}\n")
    cols = upper[keep][:, match]                                              # [N_keep, L]
    coverage = (cols[1:] != _GAP).sum(axis=0).astype(int).tolist()
    return A3m(buf.getvalue(), len(keep), len(names) - len(keep), n_all - len(names), coverage)


def stockholm_bytes(msa, max_sequences: int) -> bytes:
    """The search alignment in Stockholm (pyhmmer's writer: RF and PP lines), first
    `max_sequences` rows."""
    n = len(msa.names)
    part = msa.select(sequences=range(min(n, max_sequences))) if n > max_sequences else msa
    buf = io.BytesIO()
    part.write(buf, "stockholm")
    return buf.getvalue()
