"""MSA and structure parsers (Biopython underneath) plus MSA <-> chain pairing.

MSAs follow the AF2 a3m convention (Supplement 1.2.2 / `parsers.parse_a3m`): the first
record is the query and defines the columns; lowercase letters are insertions relative to
the query and become per-column deletion counts (the number of inserted residues *before*
each column); `-`/`.` are gaps. Stockholm, aligned FASTA and Clustal are projected onto
the same convention: columns where the query has a gap are dropped and residues in them
counted as deletions (AF2 `convert_stockholm_to_a3m`). Duplicate aligned rows are removed
(keep first, the query is always first); `X` and non-standard letters become `X`. A query
without a single standard residue (all `X`) is refused: it would pair with any chain.

Files are read by `protdp.data.safeio` (regular files only, `.gz`, BOM, CRLF/CR); every problem
is an `InputError` naming the file and line, never a library's own message.

Structures (`protdp.data.atoms`) keep every heavy atom in AF2's atom37 layout (first model,
highest-occupancy altloc, modified residues mapped to their parent); residues are placed on the
SEQRES / `_entity_poly_seq` sequence by `protdp.data.placement` (numbering first, alignment as a
recorded fallback, chain breaks kept where no reference sequence fills them).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from protdp.data.atoms import (backbone_from_atom37, is_amino_acid, pick_residue,
                               read_structure, residue_atom37, residue_letter,
                               virtual_cb)  # noqa: F401  (virtual_cb re-exported)
from protdp.data.placement import align_map, place_residues  # noqa: F401  (align_map re-exported)
from protdp.data.residue_constants import ATOM_ORDER
from protdp.data.residues import RESTYPES, msa_row_to_ids, residue_name_to_letter
from protdp.data.safeio import decode_text, format_suffix, read_text, unpack
from protdp.errors import InputError

SS_ROW_NAMES = frozenset({"ss_pred", "ss_conf", "ss_dssp", "sa_dssp"})
MSA_FORMATS = ("a3m", "stockholm", "fasta", "clustal", "psicov")
_EXT_TO_FMT = {".a3m": "a3m", ".sto": "stockholm", ".sth": "stockholm", ".stk": "stockholm",
               ".stockholm": "stockholm", ".fasta": "fasta", ".fa": "fasta", ".fas": "fasta",
               ".afa": "fasta", ".aln": "aln", ".clustal": "clustal", ".clw": "clustal"}
MSA_EXTENSIONS = tuple(_EXT_TO_FMT)            # each optionally followed by .gz
# first word of a Clustal header as Biopython's reader knows it (MUSCLE, Kalign, ... write
# their own name there); a header starting with CLUSTAL is Clustal too
CLUSTAL_HEADERS = ("CLUSTAL", "PROBCONS", "MUSCLE", "MSAPROBS", "Kalign", "Biopython")
_STD = set(RESTYPES)
_STD_CODES = np.frombuffer(RESTYPES.encode(), np.uint8)
_NORMALIZE = np.frombuffer(bytes(range(256)), dtype=np.uint8).copy()
for _c in range(256):
    _ch = chr(_c).upper()
    _NORMALIZE[_c] = ord(_ch) if _ch in _STD else (ord("-") if _ch in "-." else ord("X"))


# --------------------------------------------------------------------------------------- MSA

@dataclass
class Msa:
    """A query-anchored MSA: every row has exactly the query's columns."""
    sequences: list[str]            # aligned rows, alphabet RESTYPES + 'X' + '-'; row 0 = query
    deletion_matrix: np.ndarray     # uint8 [N, L]; residues deleted before each column, clipped 255
    names: list[str]                # row names (first header word)
    sources: list[str] = field(default_factory=list)  # files this MSA came from
    query_cut: bool = False         # the file ends inside its query record (no final newline)
    file_sha256: list[str] = field(default_factory=list)  # of the stored bytes parsed (`sources`)

    @property
    def query(self) -> str:
        return self.sequences[0].replace("-", "")

    @property
    def depth(self) -> int:
        return len(self.sequences)

    @property
    def length(self) -> int:
        return len(self.sequences[0])

    def tokens(self) -> np.ndarray:
        """AF2 token ids, uint8 [N, L], letters read as HHblits / AlphaFold read MSA rows
        (B -> D, Z -> E, U -> C; `protdp.data.residues.msa_row_to_ids`)."""
        if not self.sequences:
            return np.zeros((0, 0), np.uint8)
        return np.stack([msa_row_to_ids(s) for s in self.sequences])


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def is_clustal_header(line: str) -> bool:
    word = line.split()[0] if line.split() else ""
    return word in CLUSTAL_HEADERS or word.upper().startswith("CLUSTAL")


def detect_msa_format(path: Path, text: str | None = None) -> str:
    """MSA format from the extension (a trailing .gz ignored); `.aln` is Clustal (a Clustal
    header: CLUSTAL, MUSCLE, Kalign, ...), aligned FASTA ('>') or PSICOV (bare rows)."""
    ext = format_suffix(path)
    fmt = _EXT_TO_FMT.get(ext)
    if fmt is None:
        raise InputError(f"unknown MSA file extension '{ext}'; expected one of "
                         f"{sorted(_EXT_TO_FMT)} (optionally .gz)", path=path)
    if fmt == "aln":
        first = _first_line(read_text(path) if text is None else text)
        fmt = "clustal" if is_clustal_header(first) else (
            "fasta" if first.startswith(">") else "psicov")
    return fmt


def _sniff_wrong_format(text: str, path: Path, expected: str) -> None:
    first = _first_line(text)
    if is_clustal_header(first):
        raise InputError(f"this is a Clustal alignment, not {expected}; name it .aln or pass "
                         f"fmt='clustal'", path=path, line=1)
    if first.startswith("# STOCKHOLM"):
        raise InputError(f"this is a Stockholm alignment, not {expected}; name it .sto",
                         path=path, line=1)


_ALLOWED = np.zeros(256, bool)
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-.":
    _ALLOWED[_c] = True


def _fasta_records(text: str, path: Path, skip: frozenset = frozenset()
                   ) -> list[tuple[str, str, int]]:
    """(name, concatenated sequence, first sequence line) per '>' record; '#' lines and records
    named in `skip` (secondary-structure rows) are left out; characters are validated."""
    records: list[list] = []
    skipping = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        if line[0] == ">":
            header = line[1:].strip()
            name = header.split()[0] if header else ""
            skipping = name in skip
            if not skipping:
                records.append([name, [], lineno])
        elif skipping:
            continue
        elif not records:
            raise InputError("sequence data before the first '>' header "
                             "(a3m/FASTA records start with '>name')", path=path, line=lineno)
        else:
            if not records[-1][1]:
                records[-1][2] = lineno          # report the sequence line, not the header
            records[-1][1].append(line)
    out = [(name, "".join(parts).replace(" ", "").rstrip("*"), ln) for name, parts, ln in records]
    if out:
        joined = np.frombuffer("".join(r[1] for r in out).encode("utf-8", "replace"), np.uint8)
        bad = np.nonzero(~_ALLOWED[joined])[0]
        if len(bad):
            ends = np.cumsum([len(r[1].encode("utf-8", "replace")) for r in out])
            k = int(np.searchsorted(ends, bad[0], side="right"))
            chars = sorted(set(re.sub(r"[A-Za-z\-.]", "", out[k][1])))
            raise InputError(f"unexpected character(s) {chars} in sequence of record "
                             f"'{out[k][0]}'", path=path, line=out[k][2])
    return out


def _project_on_query(arr: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop columns where the query (row 0) is a gap; residues there count as deletions.
    arr uint8 [N, C] (ASCII), d int [N, C] -> same with only the query's columns."""
    keep = (arr[0] != ord("-")) & (arr[0] != ord("."))
    if keep.all():
        return arr, d
    is_res = (arr != ord("-")) & (arr != ord(".")) & ~keep[None, :]
    # deletions credited to the next kept column: cumulative count of dropped residues
    extra = np.cumsum(is_res, axis=1, dtype=np.int64)[:, keep]
    extra = np.diff(extra, axis=1, prepend=0)
    # deletions already recorded at dropped columns move along to the next kept column too
    moved = np.cumsum(np.where(keep[None, :], 0, d), axis=1, dtype=np.int64)[:, keep]
    moved = np.diff(moved, axis=1, prepend=0)
    return arr[:, keep], d[:, keep] + extra + moved


def _rows_array(rows: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), -1)


def _finish(names: list[str], arr: np.ndarray, dels: np.ndarray, path: Path,
            lines: list[int] | None = None) -> Msa:
    """Normalize letters, check the query, deduplicate (keep first), clip deletions to uint8."""
    if arr.shape[0] == 0:
        raise InputError("no sequences found (empty MSA)", path=path)
    arr = _NORMALIZE[arr]                                                  # [N, L]
    if not (arr[0] != ord("-")).any():
        raise InputError(f"the query '{names[0]}' has no residues", path=path,
                         line=None if lines is None else lines[0])
    if not np.isin(arr[0], _STD_CODES).any():
        raise InputError(f"the query '{names[0]}' has no standard amino acid (all X); an "
                         f"all-unknown query would pair with any chain", path=path,
                         line=None if lines is None else lines[0])
    seqs = [r.tobytes().decode("ascii") for r in arr]
    first: dict[str, int] = {}
    for i, s in enumerate(seqs):
        first.setdefault(s, i)
    keep = sorted(first.values())                          # first occurrence, original order
    d = np.clip(np.asarray(dels)[keep], 0, 255).astype(np.uint8)
    return Msa([seqs[i] for i in keep], d, [names[i] for i in keep], [str(path)])


def a3m_widths(b: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(is_insertion [bytes], aligned columns per row [N]) of a3m rows concatenated as bytes
    `b` (uint8) with row `starts`: lower-case letters are insertions, the rest aligned."""
    is_ins = (b >= ord("a")) & (b <= ord("z"))
    return is_ins, np.add.reduceat((~is_ins).astype(np.int64), starts)


def a3m_columns(b: np.ndarray, starts: np.ndarray, is_ins: np.ndarray, width: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(aligned letters uint8 [N, W] as in the file, deletions [N, W]: insertions just before
    each aligned column) of rows that all have `width` aligned columns; all rows at once (the
    one vectorised a3m core: `parse_a3m` and `protdp.complex.colabfold_a3m`)."""
    n = len(starts)
    cum = np.cumsum(is_ins, dtype=np.int32 if b.size < 2**31 - 1 else np.int64)
    before = cum[~is_ins].reshape(n, width)                            # insertions so far
    base = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0).astype(cum.dtype)  # [N]
    dels = np.diff(before, axis=1, prepend=base[:, None])             # [N, W]
    return b[~is_ins].reshape(n, width), dels


def parse_a3m(text: str, path: str | Path = "<string>") -> Msa:
    """a3m text -> Msa (see module docstring for the convention). Vectorized over rows."""
    path = Path(path)
    _sniff_wrong_format(text, path, "a3m")
    records = _fasta_records(text, path, SS_ROW_NAMES)
    if not records:
        raise InputError("no sequences found (empty MSA)", path=path)
    for name, seq, lineno in records:
        if not seq:
            raise InputError(f"record '{name}' has an empty sequence", path=path, line=lineno)
    seqs = [r[1] for r in records]
    b = np.frombuffer("".join(seqs).encode("ascii"), np.uint8)        # all rows, concatenated
    lens = np.fromiter((len(x) for x in seqs), np.int64, len(seqs))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    is_ins, width = a3m_widths(b, starts)                             # aligned columns per row
    wrong = np.nonzero(width != width[0])[0]
    if len(wrong):
        k = int(wrong[0])
        raise InputError(f"row '{records[k][0]}' (record {k + 1}) has {width[k]} aligned "
                         f"columns but the query has {width[0]}", path=path, line=records[k][2])
    cols, dels = _project_on_query(*a3m_columns(b, starts, is_ins, int(width[0])))
    return _finish([r[0] for r in records], cols, dels, path, [r[2] for r in records])


def _aligned_msa(names: list[str], rows: list[bytes], lines: list[int], path: Path) -> Msa:
    """Equal-length aligned rows (no insertion letters) -> Msa projected on the query's columns."""
    if not rows:
        raise InputError("no sequences found (empty MSA)", path=path)
    arr, d = _project_on_query(_rows_array(rows), np.zeros((len(rows), len(rows[0])), np.int64))
    return _finish(names, arr, d, path, lines)


def _parse_aligned_fasta(text: str, path: Path) -> Msa:
    records = _fasta_records(text, path)
    rows, lines = [], []
    for name, seq, lineno in records:
        if rows and len(seq) != len(rows[0]):
            raise InputError(f"row '{name}' has {len(seq)} columns but the first row has "
                             f"{len(rows[0])}", path=path, line=lineno)
        rows.append(seq.upper().encode("ascii"))
        lines.append(lineno)
    return _aligned_msa([r[0] for r in records], rows, lines, path)


def _stockholm_rows(text: str):
    """(line number, kind, key, data) of every Stockholm row: kind 'seq' (key = name),
    'GR' (key = (name, feature)) or 'GC' (key = feature)."""
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line == "//":
            continue
        if line.startswith("#=GR"):
            parts = line.split(None, 3)
            if len(parts) == 4:
                yield lineno, "GR", (parts[1], parts[2]), parts[3].replace(" ", "")
        elif line.startswith("#=GC"):
            parts = line.split(None, 2)
            if len(parts) == 3:
                yield lineno, "GC", parts[1], parts[2].replace(" ", "")
        elif not line.startswith("#"):
            parts = line.split(None, 1)
            yield lineno, "seq", parts[0], parts[1].replace(" ", "") if len(parts) > 1 else ""


def _check_stockholm(text: str, path: Path) -> None:
    """What Biopython gets wrong or crashes on, found first and named with a line number:
    repeated row names (silently concatenated), rows or #=GR/#=GC annotations whose total
    length differs from the alignment's (an internal error inside the reader)."""
    where: dict[str, list[int]] = {}
    total: dict = {}
    last: dict = {}
    for lineno, kind, key, data in _stockholm_rows(text):
        if kind == "seq":
            where.setdefault(key, []).append(lineno)
        total[(kind, key)] = total.get((kind, key), 0) + len(data)
        last[(kind, key)] = lineno
    if not where:
        raise InputError("no sequence rows (expected 'name  aligned-sequence' lines)", path=path)
    if not any(line.strip() == "//" for line in text.split("\n")):
        raise InputError("no '//' end-of-alignment line: the file is truncated or not "
                         "Stockholm", path=path, line=text.count("\n") + 1)
    blocks = min(len(v) for v in where.values())
    for name, lines in where.items():
        if len(lines) != blocks:
            raise InputError(f"sequence name '{name}' appears {len(lines)} times (lines "
                             f"{', '.join(map(str, lines[:5]))}) while other rows appear "
                             f"{blocks} time(s); duplicate row names make the alignment "
                             f"ambiguous", path=path, line=lines[1])
    first = next(iter(where))
    width = total[("seq", first)]
    for (kind, key), n in total.items():
        if n != width:
            what = {"seq": f"row '{key}'", "GC": f"#=GC {key} annotation",
                    "GR": f"#=GR {' '.join(key)} annotation"}[kind]
            raise InputError(f"{what} has {n} columns but row '{first}' has {width}",
                             path=path, line=last[(kind, key)])


def _check_clustal(text: str, path: Path) -> None:
    """Rows after the header must be 'name  aligned-sequence [count]' with equal totals per
    name (Biopython's reader loops forever on a header-only file and names no line)."""
    total: dict[str, int] = {}
    last: dict[str, int] = {}
    for lineno, raw in enumerate(text.split("\n")[1:], 2):
        if not raw.strip() or raw[0] in " \t":             # blank or conservation line
            continue
        parts = raw.split()
        if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].isdigit()):
            raise InputError("expected 'name  aligned-sequence [residue count]' rows",
                             path=path, line=lineno)
        total[parts[0]] = total.get(parts[0], 0) + len(parts[1])
        last[parts[0]] = lineno
    if not total:
        raise InputError("no sequence rows after the Clustal header (truncated file?)",
                         path=path)
    first = next(iter(total))
    for name, n in total.items():
        if n != total[first]:
            raise InputError(f"row '{name}' has {n} columns but row '{first}' has "
                             f"{total[first]}", path=path, line=last[name])


def _parse_with_alignio(path: Path, fmt: str, text: str) -> Msa:
    from Bio import AlignIO
    if fmt == "stockholm":
        if not text.lstrip().startswith("# STOCKHOLM"):
            _sniff_wrong_format(text, path, "Stockholm")
            raise InputError("missing '# STOCKHOLM 1.0' header", path=path, line=1)
        lines = text.split("\n")
        starts = [i + 1 for i, ln in enumerate(lines) if ln.startswith("# STOCKHOLM")]
        if len(starts) > 1:
            raise InputError(f"holds {len(starts)} alignments ('# STOCKHOLM' headers on lines "
                             f"{', '.join(map(str, starts[:5]))}); give one alignment per "
                             f"file", path=path, line=starts[1])
        _check_stockholm(text, path)
    elif fmt == "clustal":
        first = _first_line(text)
        if not is_clustal_header(first):
            raise InputError("missing Clustal header (first line 'CLUSTAL ...', 'MUSCLE ...' "
                             "or 'Kalign ...')", path=path, line=1)
        if first.split()[0] not in CLUSTAL_HEADERS:           # e.g. 'CLUSTALW': Biopython
            text = text.replace(first, "CLUSTAL " + first.split(None, 1)[-1], 1)
        _check_clustal(text.lstrip(), path)
    try:
        aln = AlignIO.read(io.StringIO(text), fmt)
    except Exception:     # the reader's own texts are not user messages; say what is expected
        what = {"stockholm": "'name  aligned-sequence' rows of equal total length, ending "
                             "with '//'",
                "clustal": "blocks of 'name  aligned-sequence' rows of equal total length"}[fmt]
        raise InputError(f"not a valid {fmt} alignment: expected {what}", path=path) from None
    rows = [str(rec.seq).upper().encode("ascii", "replace") for rec in aln]
    names = [rec.id for rec in aln]
    if not rows or not rows[0]:
        raise InputError("no sequences found (empty MSA)", path=path)
    arr = _rows_array(rows)
    bad = np.nonzero(~_ALLOWED[arr].all(1))[0]
    if len(bad):
        raise InputError(f"unexpected character(s) in row '{names[bad[0]]}' (expected amino-"
                         f"acid letters and '-' / '.')", path=path)
    arr, d = _project_on_query(arr, np.zeros(arr.shape, np.int64))
    return _finish(names, arr, d, path)


def _parse_psicov(text: str, path: Path) -> Msa:
    rows, lines = [], []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if not re.fullmatch(r"[A-Za-z\-.]+", line):
            raise InputError("PSICOV .aln rows must be bare aligned sequences (letters, '-' "
                             "and '.')", path=path, line=lineno)
        if rows and len(line) != len(rows[0]):
            raise InputError(f"row {len(rows) + 1} has {len(line)} columns but the first row "
                             f"has {len(rows[0])}", path=path, line=lineno)
        rows.append(line.upper().encode("ascii"))
        lines.append(lineno)
    return _aligned_msa([f"row{i}" for i in range(len(rows))], rows, lines, path)


def parse_msa(path: str | Path, fmt: str | None = None, raw: bytes | None = None) -> Msa:
    """Read an MSA file (a3m, Stockholm, aligned FASTA, Clustal, PSICOV; plain or .gz); format
    from the extension unless `fmt` is given; `raw`: the file's stored bytes, read earlier (the
    caller hashed them). Raises InputError naming file and line."""
    path = Path(path)
    text = read_text(path) if raw is None else decode_text(unpack(raw, path), path)
    fmt = detect_msa_format(path, text) if fmt is None else fmt
    if fmt not in MSA_FORMATS:
        raise InputError(f"unknown MSA format '{fmt}'; expected one of {MSA_FORMATS}", path=path)
    if not text.strip():
        raise InputError("file is empty (no sequences)", path=path)
    if fmt in ("a3m", "fasta"):
        if fmt == "fasta":
            _sniff_wrong_format(text, path, "FASTA")
        msa = parse_a3m(text, path) if fmt == "a3m" else _parse_aligned_fasta(text, path)
        msa.query_cut = msa.depth == 1 and not text.endswith("\n")  # judged against a structure
        return msa
    if fmt == "psicov":
        _sniff_wrong_format(text, path, "PSICOV")
        return _parse_psicov(text, path)
    return _parse_with_alignio(path, fmt, text)


def merge_msas(msas: list[Msa]) -> Msa:
    """Merge MSAs of one chain (AF2 concatenates its database hits): the longest query is the
    reference; another query must equal it up to terminal residues (it is padded with gaps);
    rows are then deduplicated keeping the first occurrence."""
    if not msas:
        raise ValueError("merge_msas needs at least one MSA")
    ref = max(msas, key=lambda m: m.length)
    ref_q = ref.query
    seqs, dels, names, sources = [], [], [], []
    for m in [ref] + [m for m in msas if m is not ref]:
        q = m.query
        off = ref_q.find(q)
        if off < 0 or m.length != len(q):
            raise InputError(f"MSA queries differ beyond the termini: {m.sources[0]} "
                             f"({len(q)} aa) is not a contiguous part of {ref.sources[0]} "
                             f"({len(ref_q)} aa)", path=m.sources[0])
        pad_l, pad_r = off, len(ref_q) - off - len(q)
        seqs += ["-" * pad_l + s + "-" * pad_r for s in m.sequences]
        dels.append(np.pad(m.deletion_matrix, ((0, 0), (pad_l, pad_r))))
        names += m.names
        sources += m.sources
    seen, keep = set(), []
    for i, s in enumerate(seqs):
        if s not in seen:
            seen.add(s)
            keep.append(i)
    d = np.concatenate(dels)[keep]
    return Msa([seqs[i] for i in keep], d, [names[i] for i in keep], sources)


# --------------------------------------------------------------------------------- structure

CA37 = ATOM_ORDER["CA"]


@dataclass
class Chain:
    """One polymer chain, every heavy atom in AF2's atom37 layout, placed on its sequence."""
    sequence: str                   # one-letter; SEQRES / _entity_poly_seq when the file has it
    all_atom_positions: np.ndarray  # float32 [L, 37, 3] Å, 0 where missing
    all_atom_mask: np.ndarray       # bool [L, 37] atom present in the file
    residue_index: np.ndarray       # int32 [L] (jumps at breaks no reference sequence fills)
    between_segment: np.ndarray     # bool [L] first residue after a chain break
    author_ids: list[str]           # author residue number + insertion code ('' if unobserved)
    resolution: float               # Å; NaN if unknown (NMR, extracts without header)
    chain_id: str
    source: str
    has_seqres: bool                # True if `sequence` came from SEQRES / _entity_poly_seq
    placement: str = "observed"     # how residues were placed (protdp.data.placement)
    warnings: list[str] = field(default_factory=list)
    dropped_atoms: int = 0          # atom records of the file dropped by validation

    @cached_property
    def _backbone(self) -> tuple[np.ndarray, np.ndarray]:
        return backbone_from_atom37(self.sequence, self.all_atom_positions, self.all_atom_mask)

    @property
    def positions(self) -> np.ndarray:
        """float32 [L, 5, 3] N, CA, C, O, CB (virtual CB for Gly), derived from atom37."""
        return self._backbone[0]

    @property
    def mask(self) -> np.ndarray:
        """bool [L, 5] for `positions`."""
        return self._backbone[1].astype(bool)

    @property
    def observed(self) -> np.ndarray:
        """bool [L]: CA observed."""
        return self.all_atom_mask[:, CA37]


def _pdb_seqres(text: str, chain_id: str) -> str | None:
    names = []
    want = (chain_id or " ")[0]
    for line in text.split("\n"):
        if line.startswith("SEQRES") and len(line) > 19 and line[11] == want:
            names += line[19:].split()
    return "".join(residue_name_to_letter(n) for n in names) or None


def _cif_column(d: dict, key: str) -> list:
    v = d.get(key)
    return v if isinstance(v, list) else [v]


def _cif_reference(d: dict, chain_id: str) -> tuple[str | None, dict]:
    """_entity_poly_seq sequence of the chain's entity and a map (auth resseq, icode) ->
    label_seq_id - 1 (first model)."""
    if "_entity_poly_seq.mon_id" not in d or "_atom_site.label_seq_id" not in d or \
            "_atom_site.label_entity_id" not in d:
        return None, {}
    auth_asym = _cif_column(d, "_atom_site.auth_asym_id")
    entity = _cif_column(d, "_atom_site.label_entity_id")
    seq_id, auth_seq = (_cif_column(d, "_atom_site.label_seq_id"),
                        _cif_column(d, "_atom_site.auth_seq_id"))
    icode = _cif_column(d, "_atom_site.pdbx_PDB_ins_code")
    model = _cif_column(d, "_atom_site.pdbx_PDB_model_num")
    first_model = model[0] if model else None
    ent, mapping = None, {}
    for i, ch in enumerate(auth_asym):
        if ch != chain_id or model[i] != first_model or seq_id[i] in (".", "?"):
            continue
        ent = entity[i] if ent is None else ent
        if entity[i] != ent:
            continue
        ic = "" if icode[i] in ("?", ".") else icode[i]
        try:
            mapping[(int(auth_seq[i]), ic)] = int(seq_id[i]) - 1
        except ValueError:                   # malformed numbering: numbering decides instead
            return _entity_sequence(d, ent), {}
    if ent is None:
        return None, {}
    return _entity_sequence(d, ent), mapping


def _entity_sequence(d: dict, entity: str) -> str | None:
    seq: dict[int, str] = {}
    for e, num, mon in zip(_cif_column(d, "_entity_poly_seq.entity_id"),
                           _cif_column(d, "_entity_poly_seq.num"),
                           _cif_column(d, "_entity_poly_seq.mon_id")):
        if e == entity and str(num).isdigit() and int(num) not in seq:  # heterogeneity: first
            seq[int(num)] = residue_name_to_letter(mon)
    return "".join(seq[k] for k in sorted(seq)) or None


def _protein_chains(model) -> dict:
    return {c.id: c for c in model if any(is_amino_acid(pick_residue(r)) for r in c)}


def list_chains(path: str | Path, data=None) -> list[str]:
    """Auth chain ids (first model) that contain at least one amino-acid residue. `data`: the
    file already read by `protdp.data.atoms.read_structure` (else it is read here)."""
    data = read_structure(Path(path)) if data is None else data
    return [] if data.model is None else [c.strip() for c in _protein_chains(data.model)]


def _select_chain(data, chain: str | None, path: Path):
    if data.model is None:
        if data.dropped_atoms:
            raise InputError(f"no usable coordinates: all {data.dropped_atoms} atom records "
                             f"were invalid ({data.warnings[0]})", path=path)
        raise InputError("no ATOM/HETATM coordinates (header-only file?)", path=path)
    chains = {c.id: c for c in data.model}
    protein = list(_protein_chains(data.model))
    if not protein:
        raise InputError("no amino-acid residues in the first model (only ions, ligands or "
                         "water)", path=path)
    want = (chain or "").strip()
    if want:
        if want not in chains:
            raise InputError(f"chain '{want}' not found; chains present: "
                             f"{sorted(c.strip() or '<blank>' for c in chains)}", path=path,
                             field="chain")
        cid = want
    elif " " in chains:
        cid = " "
    elif len(protein) == 1:
        cid = protein[0]
    else:
        raise InputError(f"no chain id given and the file has {len(protein)} protein chains "
                         f"{sorted(protein)}; pass one", path=path, field="chain")
    residues = [r for r in (pick_residue(r) for r in chains[cid]) if is_amino_acid(r)]
    if not residues:
        raise InputError(f"chain '{cid.strip() or '<blank>'}' has no amino-acid residues "
                         f"(only ions, ligands or water)", path=path, field="chain")
    return cid, residues


def parse_structure(path: str | Path, chain: str | None = None, data=None) -> Chain:
    """PDB/mmCIF chain (plain or .gz) -> Chain. `chain` is the author chain id; '' or None
    selects a blank id or the only protein chain; `data` as in `list_chains`. InputError for
    files without usable residues."""
    path = Path(path)
    data = read_structure(path) if data is None else data
    cid, residues = _select_chain(data, chain, path)
    n = len(residues)
    pos = np.zeros((n, 37, 3), np.float32)                      # [n_obs, 37, 3]
    mask = np.zeros((n, 37), bool)                              # [n_obs, 37]
    for i, res in enumerate(residues):
        pos[i], mask[i] = residue_atom37(res)
    observed = "".join(residue_letter(r) for r in residues)
    authors = [(int(r.id[1]), r.id[2].strip()) for r in residues]
    label_index = None
    if data.cif is not None:
        ref, mapping = _cif_reference(data.cif, cid.strip())
        if ref and mapping and all(k in mapping for k in authors):
            label_index = np.array([mapping[k] for k in authors])
    else:
        ref = _pdb_seqres(data.text, cid)
    placed = place_residues(observed, authors, pos[:, CA37], mask[:, CA37], ref, label_index)
    L = len(placed.sequence)
    full_pos = np.zeros((L, 37, 3), np.float32)
    full_mask = np.zeros((L, 37), bool)
    full_pos[placed.index], full_mask[placed.index] = pos, mask
    full_auth = [""] * L
    for k, (num, ic) in zip(placed.index.tolist(), authors):
        full_auth[k] = f"{num}{ic}"
    return Chain(sequence=placed.sequence, all_atom_positions=full_pos, all_atom_mask=full_mask,
                 residue_index=placed.residue_index, between_segment=placed.between_segment,
                 author_ids=full_auth, resolution=data.resolution, chain_id=cid.strip(),
                 source=str(path), has_seqres=placed.method != "observed",
                 placement=placed.method, warnings=data.warnings + placed.warnings,
                 dropped_atoms=data.dropped_atoms)


# ----------------------------------------------------------------------------------- pairing

@dataclass
class Paired:
    """A chain's atoms placed on the MSA query positions."""
    all_atom_positions: np.ndarray  # float32 [Lq, 37, 3]
    all_atom_mask: np.ndarray       # bool [Lq, 37]
    residue_index: np.ndarray       # int32 [Lq] (jumps where a chain break is not filled)
    between_segment: np.ndarray     # bool [Lq]
    info: dict                      # aligned, identical, identity, coverage, dropped_terminal


def _carry_breaks(m: np.ndarray, chain: Chain) -> tuple[np.ndarray, np.ndarray]:
    """Query residue_index / break flags: a break stays a break where two consecutive query
    positions map to the residues on either side of it (the query does not fill the gap)."""
    Lq = len(m)
    steps = np.ones(Lq, np.int64)
    steps[0] = 0
    flags = np.zeros(Lq, bool)
    both = (m[1:] >= 0) & (m[:-1] >= 0) & (m[1:] == m[:-1] + 1)              # [Lq - 1]
    k = np.nonzero(both)[0]
    brk = chain.between_segment[m[k + 1]]
    jump = chain.residue_index[m[k + 1]] - chain.residue_index[m[k]]
    steps[k[brk] + 1] = jump[brk]
    flags[k[brk] + 1] = True
    return np.cumsum(steps).astype(np.int32), flags


def pair_msa_structure(query: str, chain: Chain, msa_path: str = "<msa>",
                       structure_path: str | None = None, *, min_coverage: float = 0.5,
                       min_identity: float = 1.0) -> Paired:
    """Place the chain's atoms on the MSA query positions (alignment, free end gaps).

    Coverage = aligned observed residues / min(query length, observed residues); identity =
    identical / aligned pairs where neither residue is X. Terminal overhangs are fine; coverage
    or identity below the minimum, or an observed residue inside the aligned region without a
    query counterpart, is an InputError naming both files and the figures.
    """
    structure_path = structure_path or chain.source
    where = f"MSA query ({msa_path}) vs structure {structure_path} chain " \
            f"'{chain.chain_id or '<blank>'}'"
    target = chain.sequence
    m = align_map(query, target)                                    # [Lq] -> target index
    obs = chain.all_atom_mask.any(1)                                # [L]
    hit = m >= 0
    pair = np.zeros(len(query), bool)
    pair[hit] = obs[m[hit]]                                         # [Lq] aligned + observed
    n_obs = int(obs.sum())
    if not pair.any():
        raise InputError(f"{where}: no observed structure residue aligns to the query",
                         path=msa_path)
    qi = np.nonzero(pair)[0]
    q_l = [query[i] for i in qi]
    t_l = [target[m[i]] for i in qi]
    nonx = [(i, a, b) for i, a, b in zip(qi, q_l, t_l) if a != "X" and b != "X"]
    mism = [(int(i), a, b) for i, a, b in nonx if a != b]
    identity = (len(nonx) - len(mism)) / len(nonx) if nonx else 0.0
    coverage = len(qi) / max(1, min(len(query), n_obs))
    info = {"aligned": len(qi), "identical": len(nonx) - len(mism),
            "identity": round(identity, 4), "coverage": round(coverage, 4)}
    if coverage < min_coverage:
        raise InputError(f"{where}: only {len(qi)} residues pair (coverage {coverage:.2f} of "
                         f"min(query {len(query)}, observed {n_obs}) < min_pairing_coverage "
                         f"{min_coverage}); the MSA is not for this chain", path=msa_path)
    if identity < min_identity:
        show = ", ".join(f"q{i + 1}:{a}>{b}" for i, a, b in mism[:5])
        raise InputError(f"{where}: identity {identity:.3f} < min_pairing_identity "
                         f"{min_identity} ({len(mism)} residue mismatch(es) inside the "
                         f"alignment{': ' + show if show else ''})", path=msa_path)
    lo, hi = m[hit].min(), m[hit].max()
    unmatched = np.zeros(len(target), bool)
    unmatched[lo:hi + 1] = obs[lo:hi + 1]
    unmatched[m[hit]] = False
    if unmatched.any():
        k = int(np.nonzero(unmatched)[0][0])
        raise InputError(f"{where}: {int(unmatched.sum())} observed structure residue(s) inside "
                         f"the aligned region have no query counterpart (first: "
                         f"{target[k]} {chain.author_ids[k]})", path=msa_path)
    positions = np.zeros((len(query), 37, 3), np.float32)
    mask = np.zeros((len(query), 37), bool)
    positions[hit], mask[hit] = chain.all_atom_positions[m[hit]], chain.all_atom_mask[m[hit]]
    residue_index, flags = _carry_breaks(m, chain)
    info["dropped_terminal"] = n_obs - int(obs[m[hit]].sum())
    return Paired(positions, mask, residue_index, flags, info)
