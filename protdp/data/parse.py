"""MSA and structure parsers (Biopython underneath) plus MSA <-> chain pairing.

MSAs follow the AF2 a3m convention (Supplement 1.2.2 / `parsers.parse_a3m`): the first
record is the query and defines the columns; lowercase letters are insertions relative to
the query and become per-column deletion counts (the number of inserted residues *before*
each column); `-`/`.` are gaps. Stockholm, aligned FASTA and Clustal are projected onto
the same convention: columns where the query has a gap are dropped and residues in them
counted as deletions (AF2 `convert_stockholm_to_a3m`). Duplicate aligned rows are removed
(keep first, the query is always first); `X` and non-standard letters become `X`.

Structures (Bio.PDB) are reduced to the five backbone atoms N, CA, C, O, CB per residue
(AF2 `atom37` subset; CB of GLY is the ideal virtual CB of trRosetta/AF2 `pseudo_beta`),
first model only, highest-occupancy altloc, modified residues mapped to their parent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.residues import (BACKBONE_ATOMS, MODIFIED_TO_PARENT, RESTYPES, THREE_TO_ONE,
                                  residue_name_to_letter, sequence_to_ids)
from protdp.errors import InputError

SS_ROW_NAMES = frozenset({"ss_pred", "ss_conf", "ss_dssp", "sa_dssp"})
MSA_FORMATS = ("a3m", "stockholm", "fasta", "clustal", "psicov")
_EXT_TO_FMT = {".a3m": "a3m", ".sto": "stockholm", ".sth": "stockholm", ".stk": "stockholm",
               ".stockholm": "stockholm", ".fasta": "fasta", ".fa": "fasta", ".fas": "fasta",
               ".afa": "fasta", ".aln": "aln"}
_STD = set(RESTYPES)
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
        """AF2 token ids, uint8 [N, L]."""
        if not self.sequences:
            return np.zeros((0, 0), np.uint8)
        return np.stack([sequence_to_ids(s) for s in self.sequences])


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror}", path=path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not a text file (byte {exc.start} is not UTF-8)", path=path) from None


def detect_msa_format(path: Path, text: str | None = None) -> str:
    ext = path.suffix.lower()
    fmt = _EXT_TO_FMT.get(ext)
    if fmt is None:
        raise InputError(f"unknown MSA file extension '{ext}'; expected one of "
                         f"{sorted(_EXT_TO_FMT)}", path=path)
    if fmt == "aln":  # Clustal ('CLUSTAL' header), aligned FASTA ('>') or PSICOV (bare rows)
        text = _read_text(path) if text is None else text
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        fmt = "clustal" if first.upper().startswith("CLUSTAL") else (
            "fasta" if first.startswith(">") else "psicov")
    return fmt


def _sniff_wrong_format(text: str, path: Path, expected: str) -> None:
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first.upper().startswith("CLUSTAL"):
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
    seqs = [r.tobytes().decode("ascii") for r in arr]
    first: dict[str, int] = {}
    for i, s in enumerate(seqs):
        first.setdefault(s, i)
    keep = sorted(first.values())                          # first occurrence, original order
    d = np.clip(np.asarray(dels)[keep], 0, 255).astype(np.uint8)
    return Msa([seqs[i] for i in keep], d, [names[i] for i in keep], [str(path)])


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
    is_ins = (b >= ord("a")) & (b <= ord("z"))
    width = np.add.reduceat((~is_ins).astype(np.int64), starts)       # aligned columns per row
    wrong = np.nonzero(width != width[0])[0]
    if len(wrong):
        k = int(wrong[0])
        raise InputError(f"row '{records[k][0]}' (record {k + 1}) has {width[k]} aligned "
                         f"columns but the query has {width[0]}", path=path, line=records[k][2])
    n, W = len(seqs), int(width[0])
    cum = np.cumsum(is_ins, dtype=np.int64)                           # insertions so far
    before = cum[~is_ins].reshape(n, W)                               # [N, W]
    base = np.where(starts > 0, cum[starts - 1], 0)                   # [N] count before row
    dels = np.diff(before, axis=1, prepend=base[:, None])             # [N, W]
    cols, dels = _project_on_query(b[~is_ins].reshape(n, W), dels)
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


def _check_stockholm_names(text: str, path: Path) -> None:
    """Biopython silently concatenates repeated row names; reject them with line numbers."""
    where: dict[str, list[int]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or line == "//":
            continue
        where.setdefault(line.split()[0], []).append(lineno)
    if not where:
        return
    blocks = min(len(v) for v in where.values())
    for name, lines in where.items():
        if len(lines) != blocks:
            raise InputError(f"sequence name '{name}' appears {len(lines)} times (lines "
                             f"{', '.join(map(str, lines[:5]))}) while other rows appear "
                             f"{blocks} time(s); duplicate row names make the alignment "
                             f"ambiguous", path=path, line=lines[1])


def _parse_with_alignio(path: Path, fmt: str, text: str) -> Msa:
    from Bio import AlignIO
    if fmt == "stockholm":
        if not text.lstrip().startswith("# STOCKHOLM"):
            _sniff_wrong_format(text, path, "Stockholm")
            raise InputError("missing '# STOCKHOLM 1.0' header", path=path, line=1)
        _check_stockholm_names(text, path)
    try:
        aln = AlignIO.read(str(path), fmt)
    except ValueError as exc:
        raise InputError(f"not a valid {fmt} alignment: {exc}", path=path) from None
    rows = [str(rec.seq).upper().encode("ascii") for rec in aln]
    names = [rec.id for rec in aln]
    if not rows:
        raise InputError("no sequences found (empty MSA)", path=path)
    arr, d = _project_on_query(_rows_array(rows), np.zeros((len(rows), len(rows[0])), np.int64))
    return _finish(names, arr, d, path)


def _parse_psicov(text: str, path: Path) -> Msa:
    rows, lines = [], []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if not re.fullmatch(r"[A-Za-z\-.]+", line):
            raise InputError("PSICOV .aln rows must be bare aligned sequences", path=path,
                             line=lineno)
        if rows and len(line) != len(rows[0]):
            raise InputError(f"row {len(rows) + 1} has {len(line)} columns but the first row "
                             f"has {len(rows[0])}", path=path, line=lineno)
        rows.append(line.upper().encode("ascii"))
        lines.append(lineno)
    return _aligned_msa([f"row{i}" for i in range(len(rows))], rows, lines, path)


def parse_msa(path: str | Path, fmt: str | None = None) -> Msa:
    """Read an MSA file (a3m, Stockholm, aligned FASTA, Clustal, PSICOV); format from the
    extension unless `fmt` is given. Raises InputError naming file and line on bad input."""
    path = Path(path)
    text = _read_text(path)
    fmt = detect_msa_format(path, text) if fmt is None else fmt
    if fmt not in MSA_FORMATS:
        raise InputError(f"unknown MSA format '{fmt}'; expected one of {MSA_FORMATS}", path=path)
    if not text.strip():
        raise InputError("file is empty (no sequences)", path=path)
    if fmt == "a3m":
        return parse_a3m(text, path)
    if fmt == "fasta":
        _sniff_wrong_format(text, path, "FASTA")
        return _parse_aligned_fasta(text, path)
    if fmt == "psicov":
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

@dataclass
class Chain:
    """One polymer chain reduced to backbone atoms (+CB)."""
    sequence: str               # one-letter; full SEQRES/entity_poly sequence when the file has it
    positions: np.ndarray       # float32 [L, 5, 3] N, CA, C, O, CB in Å (0 where missing)
    mask: np.ndarray            # bool [L, 5]
    residue_index: np.ndarray   # int32 [L] 0-based position in `sequence`
    author_ids: list[str]       # author residue number + insertion code ('' if unobserved)
    resolution: float           # Å; NaN if unknown (NMR, extracts without header)
    chain_id: str
    source: str
    has_seqres: bool            # True if `sequence` came from SEQRES / _entity_poly_seq

    @property
    def observed(self) -> np.ndarray:
        """bool [L]: CA observed."""
        return self.mask[:, 1]


def virtual_cb(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Ideal CB from backbone (trRosetta / AF2 pseudo-beta constants). [..., 3]."""
    b = ca - n
    cc = c - ca
    a = np.cross(b, cc)
    return -0.58273431 * a + 0.56802827 * b - 0.54067466 * cc + ca


def _pick_residue(res):
    """DisorderedResidue (point mutation) -> child with highest mean occupancy."""
    if res.is_disordered() == 2:
        return max(res.disordered_get_list(),
                   key=lambda r: np.mean([a.get_occupancy() or 0.0 for a in r]))
    return res


def _keep_residue(res) -> bool:
    het, _, _ = res.id
    name = res.get_resname().strip().upper()
    if het == "W":
        return False
    if name in THREE_TO_ONE or name in MODIFIED_TO_PARENT:
        return True
    return het == " " and "CA" in res   # unknown ATOM residue with a CA -> X


def _pdb_seqres(text: str, chain_id: str) -> str | None:
    names = []
    for line in text.splitlines():
        if line.startswith("SEQRES") and len(line) > 19 and line[11] == (chain_id or " ")[0]:
            names += line[19:].split()
    return "".join(residue_name_to_letter(n) for n in names) or None


def _float_or_nan(values) -> float:
    for v in values or []:
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x) and x > 0:
            return x
    return float("nan")


def _cif_reference(d: dict, chain_id: str) -> tuple[str | None, dict]:
    """_entity_poly_seq sequence of the chain's entity and a map (auth resseq, icode) ->
    0-based index in it, via _atom_site.label_seq_id (first model)."""
    if "_entity_poly_seq.mon_id" not in d or "_atom_site.label_seq_id" not in d:
        return None, {}
    col = lambda k: d.get(k) if isinstance(d.get(k), list) else [d.get(k)]
    auth_asym, entity = col("_atom_site.auth_asym_id"), col("_atom_site.label_entity_id")
    seq_id, auth_seq = col("_atom_site.label_seq_id"), col("_atom_site.auth_seq_id")
    icode = col("_atom_site.pdbx_PDB_ins_code") if "_atom_site.pdbx_PDB_ins_code" in d else None
    model = col("_atom_site.pdbx_PDB_model_num") if "_atom_site.pdbx_PDB_model_num" in d else None
    first_model = model[0] if model else None
    ent, mapping = None, {}
    for i, ch in enumerate(auth_asym):
        if ch != chain_id or (model and model[i] != first_model) or seq_id[i] in (".", "?"):
            continue
        ent = entity[i]
        ic = "" if icode is None or icode[i] in ("?", ".") else icode[i]
        try:
            mapping[(int(auth_seq[i]), ic)] = int(seq_id[i]) - 1
        except ValueError:                  # malformed numbering: fall back to observed-only
            return None, {}
    if ent is None:
        return None, {}
    seq: dict[int, str] = {}
    for e, num, mon in zip(col("_entity_poly_seq.entity_id"), col("_entity_poly_seq.num"),
                           col("_entity_poly_seq.mon_id")):
        if e == ent and num.isdigit() and int(num) not in seq:  # heterogeneity: first wins
            seq[int(num)] = residue_name_to_letter(mon)
    if not seq or max(mapping.values(), default=-1) >= len(seq):
        return None, {}
    return "".join(seq[k] for k in sorted(seq)), mapping


def _aligner():
    from Bio.Align import PairwiseAligner
    al = PairwiseAligner()
    al.mode = "global"
    al.match_score, al.mismatch_score = 2.0, -3.0
    al.wildcard = "X"
    al.open_gap_score, al.extend_gap_score = -5.0, -0.5
    al.end_gap_score = 0.0
    return al


def align_map(a: str, b: str) -> np.ndarray:
    """Global alignment with free end gaps (X = wildcard): int64 [len(a)] index into b or -1."""
    out = np.full(len(a), -1, np.int64)
    if not a or not b:
        return out
    if a == b:
        return np.arange(len(a))
    off = a.find(b)
    if off >= 0:                       # fast path: b is a contiguous part of a
        out[off:off + len(b)] = np.arange(len(b))
        return out
    off = b.find(a)
    if off >= 0:
        return np.arange(off, off + len(a))
    aln = _aligner().align(a, b)[0]
    for (s0, e0), (s1, _) in zip(*aln.aligned):
        out[s0:e0] = np.arange(s1, s1 + e0 - s0)
    return out


def _open_structure(path: Path):
    from Bio.PDB import MMCIFParser, PDBParser
    ext = path.suffix.lower()
    if ext in (".cif", ".mmcif"):
        parser = MMCIFParser(QUIET=True)
    elif ext in (".pdb", ".ent"):
        parser = PDBParser(QUIET=True, PERMISSIVE=True)
    else:
        raise InputError(f"unknown structure extension '{ext}'; expected .pdb/.ent/.cif/.mmcif",
                         path=path)
    try:
        structure = parser.get_structure(path.stem, str(path))
    except Exception as exc:   # Biopython raises many types for malformed files
        raise InputError(f"cannot parse structure: {type(exc).__name__}: {exc}",
                         path=path) from None
    return structure, getattr(parser, "_mmcif_dict", None)


def list_chains(path: str | Path) -> list[str]:
    """Auth chain ids (first model) that contain at least one amino-acid residue."""
    path = Path(path)
    structure, _ = _open_structure(path)
    models = list(structure)
    if not models:
        return []
    return [c.id.strip() for c in models[0]
            if any(_keep_residue(_pick_residue(r)) for r in c)]


def parse_structure(path: str | Path, chain: str | None = None) -> Chain:
    """PDB/mmCIF chain -> Chain. `chain` is the author chain id; '' or None selects a blank id
    or the only protein chain. Raises InputError for files without usable residues."""
    path = Path(path)
    structure, cif = _open_structure(path)
    models = list(structure)
    if not models:
        raise InputError("no ATOM/HETATM coordinates (header-only file?)", path=path)
    model = models[0]                                      # first model of NMR ensembles
    chains = {c.id: c for c in model}
    protein = [cid for cid, c in chains.items()
               if any(_keep_residue(_pick_residue(r)) for r in c)]
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
    residues = [r for r in (_pick_residue(r) for r in chains[cid]) if _keep_residue(r)]
    if not residues:
        raise InputError(f"chain '{cid.strip() or '<blank>'}' has no amino-acid residues "
                         f"(only ions, ligands or water)", path=path, field="chain")

    n = len(residues)
    pos = np.zeros((n, 5, 3), np.float32)        # [L_obs, 5, 3]
    mask = np.zeros((n, 5), bool)                # [L_obs, 5]
    letters, authors = [], []
    for i, res in enumerate(residues):
        letters.append(residue_name_to_letter(res.get_resname()))
        _, num, ic = res.id
        authors.append(f"{num}{ic.strip()}")
        for j, atom in enumerate(BACKBONE_ATOMS):
            if atom in res:
                pos[i, j] = res[atom].get_coord()
                mask[i, j] = True
        if letters[-1] == "G" and mask[i, :3].all() and not mask[i, 4]:
            pos[i, 4] = virtual_cb(pos[i, 0], pos[i, 1], pos[i, 2])
            mask[i, 4] = True
    observed = "".join(letters)

    # Place the observed residues on the full sequence when the file has one.
    ref, index = None, None
    if cif is not None:
        ref, mapping = _cif_reference(cif, cid.strip())
        if ref is not None:
            keys = [(res.id[1], res.id[2].strip()) for res in residues]
            if all(k in mapping for k in keys):
                index = np.array([mapping[k] for k in keys])
        resolution = _float_or_nan([cif.get(k, [None])[0] for k in (
            "_refine.ls_d_res_high", "_em_3d_reconstruction.resolution",
            "_reflns.d_resolution_high")])
    else:
        ref = _pdb_seqres(_read_text(path), cid)
        if ref is not None:
            m = align_map(observed, ref)
            if (m >= 0).all() and np.all(np.diff(m) > 0) and all(
                    ref[k] == x or "X" in (ref[k], x) for k, x in zip(m, observed)):
                index = m
        resolution = _float_or_nan([structure.header.get("resolution")])
    if index is None or len(set(index.tolist())) != n:
        ref, index = observed, np.arange(n)
    L = len(ref)
    full_pos = np.zeros((L, 5, 3), np.float32)
    full_mask = np.zeros((L, 5), bool)
    full_auth = [""] * L
    full_pos[index], full_mask[index] = pos, mask
    for k, a in zip(index, authors):
        full_auth[k] = a
    return Chain(sequence=ref, positions=full_pos, mask=full_mask,
                 residue_index=np.arange(L, dtype=np.int32), author_ids=full_auth,
                 resolution=resolution, chain_id=cid.strip(), source=str(path),
                 has_seqres=ref is not observed)


# ----------------------------------------------------------------------------------- pairing

def pair_msa_structure(query: str, chain: Chain, msa_path: str = "<msa>",
                       structure_path: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Place the chain's atoms on the MSA query positions.

    Returns positions float32 [Lq, 5, 3], mask bool [Lq, 5] and info (aligned, dropped).
    Terminal overhangs on either side are fine (residues outside the query are dropped);
    a substitution (other than X) or a structure residue missing inside the query is an
    InputError naming both files.
    """
    structure_path = structure_path or chain.source
    where = f"MSA query ({msa_path}) vs structure {structure_path} chain " \
            f"'{chain.chain_id or '<blank>'}'"
    if chain.has_seqres:
        target, tmask = chain.sequence, np.ones(len(chain.sequence), bool)
    else:
        target, tmask = chain.sequence, chain.observed | chain.mask.any(1)
    m = align_map(query, target)                                    # [Lq] -> target index
    hit = m >= 0
    obs = chain.mask.any(1)
    mapped_obs = obs[m[hit]]
    if not mapped_obs.any():
        raise InputError(f"{where}: no observed structure residue aligns to the query",
                         path=msa_path)
    qi = np.nonzero(hit)[0]
    mism = [(int(i), query[i], target[m[i]]) for i in qi
            if obs[m[i]] and query[i] != target[m[i]] and "X" not in (query[i], target[m[i]])]
    if mism:
        show = ", ".join(f"q{i + 1}:{a}>{b}" for i, a, b in mism[:5])
        raise InputError(f"{where}: {len(mism)} residue mismatch(es) inside the alignment "
                         f"({show})", path=msa_path)
    lo, hi = m[hit].min(), m[hit].max()
    inside = np.zeros(len(target), bool)
    inside[lo:hi + 1] = True
    unmatched = inside & obs & tmask
    unmatched[m[hit]] = False
    if unmatched.any():
        k = int(np.nonzero(unmatched)[0][0])
        raise InputError(f"{where}: {int(unmatched.sum())} observed structure residue(s) inside "
                         f"the aligned region have no query counterpart (first: "
                         f"{target[k]} {chain.author_ids[k]})", path=msa_path)
    positions = np.zeros((len(query), 5, 3), np.float32)
    mask = np.zeros((len(query), 5), bool)
    positions[hit], mask[hit] = chain.positions[m[hit]], chain.mask[m[hit]]
    dropped = int(obs.sum() - obs[m[hit]].sum())
    return positions, mask, {"aligned": int(mask[:, 1].sum()), "dropped_terminal": dropped}
