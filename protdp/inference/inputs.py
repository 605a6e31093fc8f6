"""Batch inputs as ColabFold's batch mode takes them: one FASTA file, a folder of FASTA / a3m
files, or a CSV of `id,sequence`.

- FASTA (plain or .gz): every record a target (`targets.read_targets`).
- A folder: every `*.fasta|*.fa|*.faa|*.fas` file's records, and every `*.a3m` file as one
  target named after the file whose query (first sequence) is the target and whose alignment is
  its MSA; files in name order, records in file order.
- CSV (`*.csv`): a header with `id` and `sequence` columns (ColabFold), one target a row;
  a row that is malformed is a rejected target naming the file and line.
The digest that identifies the batch input (`input_sha256`) covers every file read.
"""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

from protdp.errors import InputError
from protdp.fileio import sha256_file
from protdp.inference.complex_features_input import FEATURES_FILE
from protdp.inference.targets import Target, _assign_names, _read_text, read_targets

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas", ".fasta.gz", ".fa.gz")


def _a3m_target(path: Path, index: int) -> Target:
    text = _read_text(path)
    header, seq_lines, line = None, [], 0
    for lineno, raw in enumerate(text.split("\n"), 1):
        if raw.startswith(">"):
            if header is not None:
                break
            header, line = raw[1:], lineno
        elif header is not None and raw.strip():
            seq_lines.append(raw.strip())
    name = path.name[:-len(".a3m")]
    t = Target(index, name, header or name, "".join(seq_lines), line or 1,
               extra={"msa_files": [str(path)]})
    if header is None:
        t.error = f"{path}:1: no '>' record: not an a3m alignment"
    # a3m insertions (lower case) are not part of the query
    t.raw_sequence = "".join(ch for ch in t.raw_sequence if not ch.islower())
    return t


def _csv_rows(text: str) -> list[tuple[int, list[str] | None, str | None]]:
    """(line number, cells or None, csv's complaint or None) per row: a row csv refuses (a
    cell over its 128 KiB field limit) is that row's error, and the rows after it are read."""
    reader, rows = csv.reader(io.StringIO(text)), []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as exc:
            rows.append((reader.line_num, None, str(exc)))
        else:
            rows.append((reader.line_num, row, None))


def _csv_targets(path: Path, start: int) -> list[Target]:
    rows = _csv_rows(_read_text(path))
    if not rows:
        raise InputError("empty CSV", path=path)
    head = [h.strip().lower() for h in rows[0][1] or []]
    if "id" not in head or "sequence" not in head:
        raise InputError("CSV needs a header with 'id' and 'sequence' columns", path=path, line=1)
    i_id, i_seq = head.index("id"), head.index("sequence")
    out = []
    for lineno, row, refused in rows[1:]:
        if refused is not None:
            t = Target(start + len(out), "", "", "", lineno)
            t.error = f"{path}:{lineno}: unreadable CSV row ({refused})"
            out.append(t)
            continue
        if not any(c.strip() for c in row):
            continue
        t = Target(start + len(out), row[i_id].strip() if len(row) > i_id else "", "", "", lineno)
        t.header = t.target_id
        if len(row) <= max(i_id, i_seq) or not t.target_id or not row[i_seq].strip():
            t.error = f"{path}:{lineno}: expected an id and a sequence"
        else:
            t.raw_sequence = row[i_seq].replace(":", "")
            if ":" in row[i_seq]:
                t.error = (f"{path}:{lineno}: a complex (':' separated chains) needs a multimer "
                           "checkpoint (`protdp weights import` of params_model_N_multimer_v3."
                           "npz); this one is a monomer")
        out.append(t)
    return out


def read_inputs(path: str | Path) -> tuple[list[Target], str]:
    """(targets in input order, input_sha256) from a FASTA file, a CSV or a folder."""
    path = Path(path)
    if path.is_dir():
        named = sorted(p for p in path.iterdir()
                       if p.name.lower().endswith(FASTA_SUFFIXES) or p.name.endswith(".a3m")
                       or p.name.lower().endswith(".csv"))
        files = [p for p in named if p.is_file()]
        special = [p for p in named if not p.is_file() and not p.is_dir()]   # FIFO, device
        if not files and not special:
            if any(path.glob(f"*/{FEATURES_FILE}")):      # `protdp complex features --out`
                raise InputError(f"a folder of complex features (<complex>/{FEATURES_FILE}, "
                                 "from `protdp complex features`) needs a multimer checkpoint "
                                 "(`protdp weights import` of params_model_N_multimer_v3.npz); "
                                 "this one is a monomer", path=path)
            raise InputError("no FASTA, a3m or CSV files in the input folder", path=path)
        targets: list[Target] = []
        digest = hashlib.sha256()
        for f in files:
            digest.update(f"{f.name}\0{sha256_file(f)}\n".encode())
            if f.name.endswith(".a3m"):
                targets.append(_a3m_target(f, len(targets)))
            elif f.name.lower().endswith(".csv"):
                targets += _csv_targets(f, len(targets))
            else:
                for t in read_targets(f):
                    t.index = len(targets)
                    targets.append(t)
            for t in targets:
                t.extra.setdefault("source", str(f))   # a rejected row names its file and line
        for f in special:                 # a row each, never skipped unseen (issue 47)
            targets.append(Target(len(targets), f.name, f.name, "", 1,
                                  error=f"{f}: not a regular file (a FIFO, socket or device)",
                                  extra={"source": str(f)}))
        _assign_names(targets, path)
        return targets, digest.hexdigest()
    if path.name.lower().endswith(".csv"):
        targets = _csv_targets(path, 0)
        if not targets:
            raise InputError("no targets in the CSV", path=path)
        _assign_names(targets, path)
    else:
        targets = read_targets(path)
    for t in targets:
        t.extra.setdefault("source", str(path))
    return targets, sha256_file(path)
