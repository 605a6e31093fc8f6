"""ColabFold's CSV batch form for complexes (issue 47 D5): a header with `id` and `sequence`
columns, one complex a row, chains separated by ':' (`c1,MKV...:GSH...`), as ColabFold's
`get_queries` reads a CSV. Each row is one `ComplexTarget`; a malformed row (short, no id, a
duplicate id, a bad chain) is that complex's one-line error and the other rows go on."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from protdp.data.safeio import decode_text, read_bytes
from protdp.errors import InputError
from protdp.multimer.inputs import CHAIN_IDS, CHAIN_SEPARATOR, MAX_CHAINS, ComplexTarget, _fill


def _rows(text: str):
    """(line number, cells or None, csv's complaint or None) per row."""
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield reader.line_num, None, str(exc)
        else:
            yield reader.line_num, row, None


def read_colabfold_csv(path: str | Path) -> list[ComplexTarget]:
    """One complex per CSV row (see the module docstring)."""
    path = Path(path)
    rows = list(_rows(decode_text(read_bytes(path), path)))
    if not rows or rows[0][1] is None:
        raise InputError("empty CSV or unreadable header", path=path, line=1)
    head = [h.strip().lower() for h in rows[0][1]]
    if "id" not in head or "sequence" not in head:
        raise InputError("CSV needs a header with 'id' and 'sequence' columns", path=path, line=1)
    i_id, i_seq = head.index("id"), head.index("sequence")
    out, seen = [], {}
    for line, row, refused in rows[1:]:
        if row is not None and not any(c.strip() for c in row):
            continue
        cid = row[i_id].strip() if row is not None and len(row) > i_id else ""
        t = ComplexTarget(len(out), cid, str(path), line)
        out.append(t)
        if refused is not None:
            t.error = f"{path}:{line}: unreadable CSV row ({refused})"
        elif len(row) <= max(i_id, i_seq) or not cid or not row[i_seq].strip():
            t.error = f"{path}:{line}: expected an id and a sequence"
        elif cid in seen:
            t.error = f"{path}:{line}: duplicate complex id '{cid}' (first at line {seen[cid]})"
        else:
            seen[cid] = line
            parts = row[i_seq].split(CHAIN_SEPARATOR)
            _fill(t, [(f"{cid} chain {CHAIN_IDS[k] if k < MAX_CHAINS else k + 1}", p, line)
                      for k, p in enumerate(parts)])
    if not out:
        raise InputError("no complexes in the CSV", path=path)
    return out
