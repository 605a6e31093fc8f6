"""Complex targets from FASTA, in the two forms users bring:

* ColabFold's: one record per complex, chains separated by ':' in the sequence
  (`>dimer` / `MKV...:GSH...`); a record without ':' is a single chain.
* AlphaFold's (`run_alphafold.py --model_preset=multimer`): one FASTA file per complex, one
  record per chain; a folder of such files is a batch of complexes.

Chains get AlphaFold's chain ids in input order (`pipeline_multimer._make_chain_id_map`:
`protein.PDB_CHAIN_IDS` = A-Z, a-z, 0-9, so at most `MAX_CHAINS` = 62 chains per complex).
A problem with one complex (an empty chain, too many chains, a single chain, a bad letter) is
one line naming the file and line, attached to that complex (`error`); the others go on.
A line that is not UTF-8 (a stray Latin-1 byte in one header) is that record's one line
(`file:line: not UTF-8: byte 0xE9 at column 7`), not the whole file's end.
Sequence letters: ASCII letters only (case and ASCII whitespace ignored); length and
unknown-residue limits are the predictor's (`protdp.inference.targets.clean_sequence`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from protdp.data.safeio import decode_text, read_bytes, split_suffix
from protdp.errors import InputError

# AlphaFold's `protein.PDB_CHAIN_IDS`: the chain ids a PDB file can hold, in assignment order
CHAIN_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MAX_CHAINS = len(CHAIN_IDS)            # 62 = AlphaFold's `protein.PDB_MAX_CHAINS`
CHAIN_SEPARATOR = ":"                  # ColabFold's inter-chain break
FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas")   # each optionally .gz (AlphaFold form folder)
_WS = " \t\r\v\f"
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


@dataclass
class ComplexChain:
    """One chain of a complex, in input order."""
    chain_id: str          # AlphaFold chain id (A, B, ... in input order)
    sequence: str          # upper-case one-letter sequence (letters checked, nothing else)
    description: str       # FASTA header (AlphaFold form) or '<complex id> chain <id>'
    line: int              # 1-based line of the chain's header / record


@dataclass
class ComplexTarget:
    """One complex: its chains, or the one-line reason it cannot be predicted."""
    index: int             # 0-based position in the input (summary order)
    complex_id: str        # ColabFold: first header word; AlphaFold: the file's stem
    path: str
    line: int
    chains: list[ComplexChain] = field(default_factory=list)
    error: str | None = None

    @property
    def sequences(self) -> list[str]:
        return [c.sequence for c in self.chains]

    @property
    def is_homomer(self) -> bool:
        """All chains identical: AlphaFold then pairs no MSA rows
        (`feature_processing._is_homomer_or_monomer`)."""
        return len(set(self.sequences)) == 1


def _read_fasta(path: Path) -> tuple[str, dict[int, str]]:
    """(text, {line: why it is not UTF-8}): a file with stray non-UTF-8 bytes is decoded line
    by line (bad bytes replaced, the line recorded); a binary or UTF-16 file stays an
    InputError for the whole file."""
    data = read_bytes(path)
    try:
        return decode_text(data, path), {}
    except InputError as exc:
        if "not a text file in UTF-8: byte" not in exc.reason:
            raise
    bad, lines = {}, []
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            bad[n] = f"not UTF-8: byte 0x{raw[err.start]:02X} at column {err.start + 1}"
            lines.append(raw.decode("utf-8", errors="replace"))
    return decode_text("\n".join(lines).encode(), path), bad


def _text_and_bad(path: Path) -> tuple[str, Path, dict[int, str]]:
    text, bad = _read_fasta(path)
    return text, path, bad


def _records(text: str, path: Path, bad: dict[int, str] | None = None
             ) -> list[tuple[str, str, int, str | None]]:
    """(header, joined sequence text, header line, first undecodable line's error or None)
    per '>' record; text before the first header is an InputError (it belongs to no
    complex)."""
    bad = bad or {}
    out: list[list] = []
    for lineno, line in enumerate(text.split("\n"), 1):
        why = f"{path}:{lineno}: {bad[lineno]}" if lineno in bad else None
        if line.startswith(">"):
            out.append([line[1:].strip(), [], lineno, why])
        elif line.strip(_WS) == "":
            continue
        elif not out:
            raise InputError(bad.get(lineno, "sequence before the first '>' header"),
                             path=path, line=lineno)
        else:
            out[-1][1].append(line)
            out[-1][3] = out[-1][3] or why
    return [(h, "".join(parts), ln, why) for h, parts, ln, why in out]


def _clean_chain(raw: str, what: str) -> str:
    """Letters only, whitespace dropped, upper-cased; ValueError saying what and where."""
    seq = "".join(ch for ch in raw if ch not in _WS)
    if not seq:
        raise ValueError(f"{what} is empty (a chain of length 0)")
    for pos, ch in enumerate(seq, 1):
        if ch not in _LETTERS:
            shown = ch if ch.isprintable() and ch.isascii() else f"U+{ord(ch):04X}"
            raise ValueError(f"{what}: invalid character '{shown}' at position {pos}; "
                             f"expected one-letter amino-acid codes")
    return seq.upper()


def _check_chain_count(t: ComplexTarget, n: int) -> str | None:
    if n > MAX_CHAINS:
        return (f"{t.path}:{t.line}: complex '{t.complex_id}' has {n} chains; at most "
                f"{MAX_CHAINS} are supported (AlphaFold's chain ids A-Z, a-z, 0-9)")
    if n < 2:
        return (f"{t.path}:{t.line}: complex '{t.complex_id}' has a single chain; a complex "
                f"needs at least 2 (predict a single chain as a monomer)")
    return None


def _fill(t: ComplexTarget, raw_chains: list[tuple[str, str, int]]) -> ComplexTarget:
    """raw (description, sequence text, line) per chain -> chains or t.error (first problem)."""
    t.error = _check_chain_count(t, len(raw_chains))
    if t.error:
        return t
    for k, (desc, raw, line) in enumerate(raw_chains):
        cid = CHAIN_IDS[k]
        try:
            seq = _clean_chain(raw, f"chain {k + 1} ({cid}) of complex '{t.complex_id}'")
        except ValueError as exc:
            t.error, t.chains = f"{t.path}:{line}: {exc}", []
            return t
        t.chains.append(ComplexChain(cid, seq, desc, line))
    return t


def read_colabfold_fasta(path: str | Path) -> list[ComplexTarget]:
    """ColabFold form: one complex per record, chains split at ':'. A record id seen before
    is rejected (its outputs would overwrite the first)."""
    path = Path(path)
    records = _records(*_text_and_bad(path))
    if not records:
        raise InputError("no FASTA records found", path=path)
    out, seen = [], {}
    for header, seq, line, undecodable in records:
        cid = header.split()[0] if header.split() else ""
        t = ComplexTarget(len(out), cid, str(path), line)
        out.append(t)
        if undecodable:
            t.error = f"{undecodable} (save the file as UTF-8 or ASCII)"
        elif not cid:
            t.error = f"{path}:{line}: empty FASTA header (no complex id)"
        elif cid in seen:
            t.error = f"{path}:{line}: duplicate complex id '{cid}' (first at line {seen[cid]})"
        else:
            seen[cid] = line
            parts = seq.split(CHAIN_SEPARATOR)
            _fill(t, [(f"{cid} chain {CHAIN_IDS[k] if k < MAX_CHAINS else k + 1}", p, line)
                      for k, p in enumerate(parts)])
    return out


def complex_id_of_file(path: str | Path) -> str:
    """AlphaFold form: the complex is named after its file (`dimer.fasta.gz` -> 'dimer')."""
    return split_suffix(path)[0]


def read_alphafold_fasta(path: str | Path, index: int = 0) -> ComplexTarget:
    """AlphaFold form: the whole file is one complex, one record per chain (a ':' inside a
    record is refused: mixing the two forms is ambiguous)."""
    path = Path(path)
    t = ComplexTarget(index, complex_id_of_file(path), str(path), 1)
    try:
        records = _records(*_text_and_bad(path))
    except InputError as exc:
        t.error = str(exc)
        return t
    if not records:
        t.error = f"{path}: no FASTA records found"
        return t
    for header, seq, line, undecodable in records:
        if undecodable:
            t.error = f"{undecodable} (save the file as UTF-8 or ASCII)"
            return t
        if CHAIN_SEPARATOR in seq:
            t.error = (f"{path}:{line}: ':' inside a record; in a one-file-per-complex FASTA "
                       f"every chain is its own record (ColabFold's 'A:B' form is one "
                       f"record per complex)")
            return t
    return _fill(t, [(h, s, ln) for h, s, ln, _ in records])


# ---- ColabFold's CSV form ----
# ColabFold's CSV batch form for complexes (issue 47 D5): a header with `id` and `sequence`
# columns, one complex a row, chains separated by ':' (`c1,MKV...:GSH...`), as ColabFold's
# `get_queries` reads a CSV. Each row is one `ComplexTarget`; a malformed row (short, no id, a
# duplicate id, a bad chain) is that complex's one-line error and the other rows go on.

def _csv_rows(text: str):
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
    rows = list(_csv_rows(decode_text(read_bytes(path), path)))
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


def read_complexes(path: str | Path) -> list[ComplexTarget]:
    """A folder: one complex per FASTA file (AlphaFold form, sorted by name). A file: ColabFold
    form if any record contains ':', else one complex of all its records (AlphaFold form)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and
                       split_suffix(p)[1] in FASTA_SUFFIXES)
        if not files:
            raise InputError(f"no FASTA files ({', '.join(FASTA_SUFFIXES)}) in the folder",
                             path=path)
        out = [read_alphafold_fasta(f, i) for i, f in enumerate(files)]
        seen: dict[str, str] = {}
        for t in out:
            if not t.error and t.complex_id in seen:
                t.error = (f"{t.path}: complex id '{t.complex_id}' is also that of "
                           f"{seen[t.complex_id]}")
            seen.setdefault(t.complex_id, t.path)
        return out
    if path.name.lower().endswith(".csv"):       # ColabFold's CSV form (issue 47)
        return read_colabfold_csv(path)
    text, bad = _read_fasta(path)
    if any(CHAIN_SEPARATOR in seq for _, seq, _, _ in _records(text, path, bad)):
        return read_colabfold_fasta(path)
    return [read_alphafold_fasta(path)]


def chain_msa_names(t: ComplexTarget) -> dict[str, str]:
    """chain id -> the name its MSAs are searched and stored under, `<complex id>_<chain id>`
    of the first chain with the same sequence (identical chains share one search, as
    AlphaFold's `DataPipeline.process` reuses the features of an identical chain)."""
    first: dict[str, str] = {}
    return {c.chain_id: first.setdefault(c.sequence, f"{t.complex_id}_{c.chain_id}")
            for c in t.chains}
