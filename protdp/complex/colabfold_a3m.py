r"""ColabFold's complex a3m (`colabfold.input.msa_to_str` / `colabfold.batch.unserialize_msa`):
read it into AlphaFold-Multimer's per-chain inputs with the paired rows kept paired as given,
and write it.

Layout (one file per complex; the chains are the complex's distinct sequences in order of first
appearance, each once, with its number of copies):

    #36,40<TAB>1,1                     lengths of the distinct chains <TAB> their copy numbers
    >101<TAB>102                       paired block: row 0 = the queries side by side
    MVLSPADKTN...VHLTPEEKSA...
    >tr|Q9|..._HUMAN<TAB>tr|P7|..._HUMAN   one label per chain, tab-separated (empty: no partner)
    MVLSGEDKSN...VHLTAEEKAA...         the chains' rows concatenated (a3m: lower case = insertion)
    >101                               chain 1's unpaired rows, the other chains' columns gaps
    MVLSPADKTN...----------...
    >hit_of_chain_1
    MVLTPAEKTN...----------...
    >102                               chain 2's unpaired rows
    ----------...VHLTPEEKSA...

A row is split into chains by counting aligned columns (upper case and '-'): the first L1 are
chain 1's, the next L2 chain 2's, ...; lower-case letters count as deletions before the next
aligned column (so insertions after a chain's last column count at the next chain's first, as
ColabFold splits). The paired block is every row before the first unpaired query row (header
`>10k` and nothing but chain k's query); it may be absent (ColabFold's `unpaired` mode) or be all
there is (`paired` mode). A homomer (`#45<TAB>2`) has one chain: every row is that chain's
(ColabFold pairs nothing for homomers; neither does AlphaFold).

Reading keeps paired rows as given: row i of the paired block is paired row i of every chain,
a chain's all-gap part is "no partner" (AlphaFold's gap row), nothing is re-paired. A paired row
with residues in one chain only stays paired (ColabFold's own reader would move it to that
chain's unpaired rows; AlphaFold pairs such rows for the copies of a repeated chain).
Unpaired rows are deduplicated per chain as our a3m reader does (first occurrence kept), rows
without residues are skipped. `protdp.complex.features.complex_features` then builds
AlphaFold-Multimer's features (deduplication against the paired rows, cropping, merging) as for
rows paired by our own species pairing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protdp.data.parse import _ALLOWED as A3M_VALID_BYTES
from protdp.data.parse import _NORMALIZE as A3M_LETTER_MAP
from protdp.data.parse import Msa, a3m_columns, a3m_widths
from protdp.data.safeio import (atomic_write_text, check_readable, check_regular_file,
                                decode_text, read_bytes)
from protdp.errors import InputError
from protdp.complex.features import ChainInput
from protdp.complex.pair_modes import query_msa
from protdp.complex.pairing import species_paired_msas

QUERY_LABEL_BASE = 101                 # ColabFold names chain k's query row '>{101 + k}'
MAX_COMPLEX_A3M_BYTES = 2 << 30        # a larger file (or gzip stream) is refused: 2 GiB
INSERTION_LETTER = "x"                 # what the writer puts for a deleted residue
_GAP = ord("-")
# a3m letters -> our MSA alphabet and the letters an a3m row may hold: protdp.data.parse's own
# tables, so that a row reads here exactly as our a3m reader reads it
_NORM, _VALID = A3M_LETTER_MAP, A3M_VALID_BYTES


@dataclass
class ComplexA3m:
    """One complex's MSAs in ColabFold's layout, per distinct chain (first-appearance order)."""
    queries: list[str]                 # distinct chain sequences
    cardinality: list[int]             # copies of each
    paired: list[Msa] | None           # per distinct chain: the paired block (P rows, row 0 the
    #                                    query, not deduplicated); None: no paired block
    unpaired: list[Msa | None]         # per distinct chain: its unpaired rows (query first)
    path: str = "<string>"
    query_lines: list[int] | None = None   # line of each chain's query row (error messages)


def distinct_chains(sequences: list[str]) -> tuple[list[str], list[int]]:
    """(distinct sequences in order of first appearance, copies of each): ColabFold's
    `query_seqs_unique` / `query_seqs_cardinality`."""
    counts: dict[str, int] = {}
    for s in sequences:
        counts[s] = counts.get(s, 0) + 1
    return list(counts), list(counts.values())


def cardinality_header(queries: list[str], cardinality: list[int]) -> str:
    return "#" + ",".join(str(len(q)) for q in queries) + "\t" + ",".join(map(str, cardinality))


# ------------------------------------------------------------------------------------ reading
@dataclass
class _Row:
    header: str                        # header text after '>'
    line: int                          # first line of the row's sequence
    aligned: np.ndarray                # uint8 [sum L] normalised letters
    deletions: np.ndarray              # int32 [sum L] (int64 for files over 2 GiB)
    has: np.ndarray                    # bool [chains]: residues (not only gaps) in chain k


def _parse_header(first: str, path: Path) -> tuple[list[int], list[int]]:
    """'#L1,L2\tc1,c2' -> ([L1, L2], [c1, c2]); anything else is an InputError on line 1."""
    parts = first[1:].split("\t") if first.startswith("#") else []
    try:
        if len(parts) != 2:
            raise ValueError
        lengths = [int(x) for x in parts[0].split(",")]
        counts = [int(x) for x in parts[1].split(",")]
    except ValueError:
        raise InputError(f"not a ColabFold complex a3m: the first line must be the cardinality "
                         f"header '#L1,L2<TAB>c1,c2' (chain lengths, copies), got "
                         f"'{first[:60]}'", path=path, line=1) from None
    if len(lengths) != len(counts) or min(lengths + counts) < 1:
        raise InputError(f"cardinality header '{first[:60]}': as many lengths as copy numbers, "
                         f"all positive", path=path, line=1)
    return lengths, counts


def _records(lines: list[str], path: Path, first: int = 1) -> list[tuple[str, str, int]]:
    """(header, sequence, first sequence line) per '>' record from line index `first` on
    (after the cardinality line)."""
    out: list[list] = []
    for n, raw in enumerate(lines[first:], first + 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(">"):
            out.append([raw.rstrip("\n")[1:], [], n, n])
        elif line.startswith("#") or not out:
            raise InputError("expected a '>' header (only a ColabFold complex a3m has a '#' "
                             "line, its first)", path=path, line=n)
        else:
            if not out[-1][1]:
                out[-1][3] = n
            out[-1][1].append("".join(line.split()))
    for header, parts, n, _ in out:
        if not parts:
            raise InputError(f"record '{header[:40]}' has no sequence", path=path, line=n)
    return [(h, "".join(p), n) for h, p, _, n in out]


def _first_bad_character(records, k: int) -> str:
    return next(ch for ch in records[k][1] if not (ch.isascii() and _VALID[ord(ch)]))


def _decode(records: list[tuple[str, str, int]], lengths: list[int], path: Path) -> list[_Row]:
    """Every record -> its aligned letters, deletion counts and which chains have residues,
    all rows at once (`protdp.data.parse.a3m_columns`, the core `parse_a3m` uses)."""
    if not records:
        return []
    enc = [s.encode("utf-8", "replace") for _, s, _ in records]
    b = np.frombuffer(b"".join(enc), np.uint8)
    ends = np.cumsum([len(e) for e in enc])
    starts = ends - [len(e) for e in enc]
    bad = np.flatnonzero(~_VALID[b])
    if len(bad):
        k = int(np.searchsorted(ends, bad[0], side="right"))
        raise InputError(f"unexpected character '{_first_bad_character(records, k)}' in row "
                         f"'{records[k][0][:40]}' (letters, '-' and '.' only)", path=path,
                         line=records[k][2])
    is_ins, width = a3m_widths(b, starts)                                # aligned cols per row
    wrong = np.flatnonzero(width != sum(lengths))
    if len(wrong):
        k = int(wrong[0])
        need = (f"the header's chains need {sum(lengths)} ({'+'.join(map(str, lengths))})"
                if len(lengths) > 1 else f"the chain's query has {lengths[0]}")
        raise InputError(f"row '{records[k][0][:40]}' has {width[k]} aligned columns "
                         f"(upper-case letters and '-'); {need}", path=path, line=records[k][2])
    letters, dels = a3m_columns(b, starts, is_ins, sum(lengths))          # [N, W] each
    aligned = _NORM[letters]                                              # [N, W]
    has = np.stack([(aligned[:, s] != _GAP).any(axis=1) for s in _segments(lengths)], 1)
    return [_Row(h, line, aligned[i], dels[i], has[i])
            for i, (h, _, line) in enumerate(records)]


def decode_rows(text: str, path: str | Path, length: int
                ) -> list[tuple[str, str, np.ndarray, int]]:
    """Every record of a plain a3m kept in file order, not deduplicated: (name, aligned letters
    of `length` columns, deletions int64 [length], sequence line); the rows of a user's paired
    file (`protdp.complex.given_msas`)."""
    path = Path(path)
    return [((r.header.split() or [""])[0], r.aligned.tobytes().decode(), r.deletions, r.line)
            for r in _decode(_records(text.split("\n"), path, first=0), [length], path)]


def _segments(lengths: list[int]) -> list[slice]:
    ends = np.cumsum(lengths)
    return [slice(int(e - L), int(e)) for L, e in zip(lengths, ends)]


def _queries(rows: list[_Row], segs: list[slice], path: Path) -> list[tuple[str, int]]:
    """Chain k's query: its part of the first row with residues in chain k (ColabFold's
    queries are the first row, or the first row of each chain's unpaired block)."""
    out = []
    for k, s in enumerate(segs):
        row = next((r for r in rows if r.has[k]), None)
        if row is None:
            raise InputError(f"chain {k + 1} of the header ({s.stop - s.start} aa) has no row "
                             f"with residues (no query row)", path=path)
        if (row.aligned[s] == _GAP).any() or row.deletions[s][1:].any():
            raise InputError(f"chain {k + 1}'s first row '{row.header[:40]}' is not its query "
                             f"(it has gaps or insertions); each chain's first row must be its "
                             f"query ('>{QUERY_LABEL_BASE + k}')", path=path, line=row.line)
        out.append((row.aligned[s].tobytes().decode(), row.line))
    return out


def _is_unpaired_query(r: _Row, k: int, segs: list[slice], queries: list[str]) -> bool:
    label = r.header.split("\t")[0].strip().split()
    return (bool(label) and label[0] == str(QUERY_LABEL_BASE + k)
            and r.aligned[segs[k]].tobytes().decode() == queries[k]
            and int(r.has.sum()) == 1)


def _paired_msas(rows: list[_Row], segs: list[slice]) -> list[Msa]:
    """Per chain: the paired rows (labels split at tabs, ColabFold's rule for missing ones)."""
    out = []
    for k, s in enumerate(segs):
        labels = []
        for r in rows:
            fields = r.header.split("\t")
            word = (fields[k] if k < len(fields) else fields[-1]).strip().split()
            labels.append(word[0] if word and r.has[k] else "")
        out.append(Msa([r.aligned[s].tobytes().decode() for r in rows],
                       np.clip(np.stack([r.deletions[s] for r in rows]), 0, 255).astype(np.uint8),
                       labels))
    return out


def _unpaired_msa(rows: list[_Row], s: slice, query: str, k: int, path: Path) -> Msa | None:
    """One chain's unpaired rows, query first, deduplicated (first occurrence kept)."""
    if not rows:
        return None
    seqs, dels, names, seen = [query], [np.zeros(len(query), np.int32)], \
        [str(QUERY_LABEL_BASE + k)], {query}
    for r in rows:
        seq = r.aligned[s].tobytes().decode()
        if seq in seen:
            continue
        seen.add(seq)
        seqs.append(seq)
        dels.append(r.deletions[s])
        word = r.header.split()
        names.append(word[0] if word else "")
    return Msa(seqs, np.clip(np.stack(dels), 0, 255).astype(np.uint8), names, [str(path)])


def _split_blocks(rows, segs, queries, path) -> tuple[list[_Row], list[list[_Row]]]:
    """(paired rows, unpaired rows per chain) of a heteromer's file."""
    n = len(segs)
    full = bool(rows[0].has.all())
    end = 0
    if full:
        end = next((i for i in range(1, len(rows))
                    if any(_is_unpaired_query(rows[i], k, segs, queries) for k in range(n))),
                   len(rows))
    unpaired: list[list[_Row]] = [[] for _ in segs]
    for r in rows[end:]:
        chains = np.flatnonzero(r.has).tolist()
        if len(chains) > 1:
            raise InputError(f"row '{r.header[:40]}' has residues of chains "
                             f"{' and '.join(str(k + 1) for k in chains)} but lies among the "
                             f"unpaired rows (after line {rows[end].line}); paired rows come "
                             f"first, before the first unpaired query row "
                             f"'>{QUERY_LABEL_BASE}'", path=path, line=r.line)
        if chains:
            unpaired[chains[0]].append(r)
    return rows[:end], unpaired


def parse_complex_a3m(text: str, path: str | Path = "<string>",
                      chains: list[tuple[str, str]] | None = None) -> ComplexA3m:
    """ColabFold complex a3m text -> ComplexA3m (InputError naming the line otherwise); with
    the complex's `chains` [(chain id, sequence)] the header is checked against them first."""
    path = Path(path)
    lines = text.split("\n")
    lengths, counts = _parse_header(lines[0].strip() if lines else "", path)
    if chains is not None:
        _check_header(lengths, counts, chains, path)
    records = _records(lines, path)
    if not records:
        raise InputError("no '>' records after the cardinality header", path=path, line=1)
    rows = _decode(records, lengths, path)
    segs = _segments(lengths)
    found = _queries(rows, segs, path)
    queries, lines_of = [q for q, _ in found], [n for _, n in found]
    if len(segs) == 1:
        return ComplexA3m(queries, counts, None,
                          [_unpaired_msa(rows, segs[0], queries[0], 0, path)], str(path),
                          lines_of)
    paired_rows, unpaired = _split_blocks(rows, segs, queries, path)
    paired = _paired_msas(paired_rows, segs) if paired_rows else None
    return ComplexA3m(queries, counts, paired,
                      [_unpaired_msa(u, segs[k], queries[k], k, path)
                       for k, u in enumerate(unpaired)], str(path), lines_of)


def read_complex_a3m(path: str | Path, max_bytes: int | None = None,
                     chains: list[tuple[str, str]] | None = None) -> ComplexA3m:
    """A ColabFold complex a3m file (plain or gzip) of at most `max_bytes`
    (MAX_COMPLEX_A3M_BYTES); `chains` as for `parse_complex_a3m`."""
    path = Path(path)
    limit = MAX_COMPLEX_A3M_BYTES if max_bytes is None else max_bytes
    size = check_regular_file(path).st_size
    if size > limit:
        raise InputError(f"file is {size:,} bytes, over the {limit:,}-byte limit for a "
                         f"complex a3m", path=path)
    data = read_bytes(path, limit)            # a gzip stream is bounded the same way
    return parse_complex_a3m(decode_text(data, path), path, chains)


def find_complex_a3m(msa_dir: Path, name: str) -> Path | None:
    """`<msa_dir>/<name>.a3m` (or `.a3m.gz`) when present: a complex's MSAs in ColabFold's
    layout (checked readable; a FIFO or an unreadable file is an InputError, never skipped)."""
    for suffix in (".a3m", ".a3m.gz"):
        p = Path(msa_dir) / f"{name}{suffix}"
        if p.exists() or p.is_symlink():
            check_readable(p)
            return p
    return None


def _first_difference(a: str, b: str) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if k >= min(len(a), len(b)):
        return f"{len(a)} aa in the file, {len(b)} in the FASTA"
    return f"residue {k + 1} is {a[k]} in the file, {b[k]} in the FASTA"


def _check_header(lengths: list[int], counts: list[int], chains: list[tuple[str, str]],
                  path) -> None:
    """The cardinality header against the complex's chains [(chain id, sequence)] (input
    order): InputError on line 1 naming the first chain that does not fit."""
    seqs, want_counts = distinct_chains([s for _, s in chains])
    first_id: dict[str, str] = {}
    for cid, s in chains:
        first_id.setdefault(s, cid)
    header = "#" + ",".join(map(str, lengths)) + "\t" + ",".join(map(str, counts))
    want = cardinality_header(seqs, want_counts)
    for k, s in enumerate(seqs):
        cid, n = first_id[s], want_counts[k]
        copies = f"{n} cop{'y' if n == 1 else 'ies'}"
        if k >= len(lengths):
            raise InputError(f"chain {cid} ({len(s)} aa, {copies}) is missing from the "
                             f"cardinality header '{header}' (the complex's is '{want}')",
                             path=path, line=1)
        if lengths[k] != len(s) or counts[k] != n:
            raise InputError(f"cardinality header '{header}' does not match the complex: its "
                             f"chain {k + 1} should be chain {cid} ({len(s)} aa, {copies}); "
                             f"the complex's header is '{want}'", path=path, line=1)
    if len(lengths) > len(seqs):
        raise InputError(f"cardinality header '{header}' lists {len(lengths)} distinct chains, "
                         f"the complex has {len(seqs)} ('{want}')", path=path, line=1)


def check_matches_complex(a3m: ComplexA3m, chains: list[tuple[str, str]]) -> None:
    """The file's header and query rows against the complex's chains [(chain id, sequence)]
    in input order; an InputError naming the file, the line and the first mismatch."""
    _check_header([len(q) for q in a3m.queries], a3m.cardinality, chains, a3m.path)
    first_id: dict[str, str] = {}
    for cid, s in chains:
        first_id.setdefault(s, cid)
    for k, s in enumerate(distinct_chains([s for _, s in chains])[0]):
        if a3m.queries[k] != s:
            raise InputError(f"the query row of chain {k + 1} ('>{QUERY_LABEL_BASE + k}') is "
                             f"not chain {first_id[s]}'s sequence: "
                             f"{_first_difference(a3m.queries[k], s)}",
                             path=a3m.path, line=(a3m.query_lines or [None] * (k + 1))[k])


def chain_inputs_from_a3m(a3m: ComplexA3m, chains: list[tuple[str, str]]) -> list[ChainInput]:
    """ChainInputs of the complex's chains (input order) from a checked ComplexA3m: each chain's
    unpaired rows (its query alone without any) and, for a heteromer, the paired block as given
    (the queries' row alone without one, as ColabFold feeds the model then)."""
    check_matches_complex(a3m, chains)
    index = {q: k for k, q in enumerate(a3m.queries)}
    out = []
    for cid, seq in chains:
        k = index[seq]
        msa = a3m.unpaired[k] or query_msa(seq, str(QUERY_LABEL_BASE + k))
        paired = None
        if len(a3m.queries) > 1:
            paired = a3m.paired[k] if a3m.paired is not None else query_msa(seq)
        out.append(ChainInput(cid, seq, msa, None, None, paired))
    return out


# ------------------------------------------------------------------------------------ writing
def a3m_row(seq: str, dels: np.ndarray) -> str:
    """Aligned row + deletion counts -> a3m text (INSERTION_LETTER for each deleted residue)."""
    if not np.any(dels):
        return seq
    return "".join(INSERTION_LETTER * int(d) + c for c, d in zip(seq, dels))


def format_complex_a3m(a3m: ComplexA3m) -> str:
    """ColabFold's complex a3m text (`msa_to_str` layout) of a ComplexA3m."""
    qs, out = a3m.queries, [cardinality_header(a3m.queries, a3m.cardinality)]
    if a3m.paired is not None and len(qs) > 1:
        for r in range(a3m.paired[0].depth):
            labels = [str(QUERY_LABEL_BASE + k) if r == 0 else m.names[r].replace("\t", " ")
                      for k, m in enumerate(a3m.paired)]
            out.append(">" + "\t".join(labels))
            out.append("".join(a3m_row(m.sequences[r], m.deletion_matrix[r])
                               for m in a3m.paired))
    for k, m in enumerate(a3m.unpaired):
        if m is None:
            continue
        left = "-" * sum(len(q) for q in qs[:k])
        right = "-" * sum(len(q) for q in qs[k + 1:])
        for r in range(m.depth):
            name = str(QUERY_LABEL_BASE + k) if r == 0 else (m.names[r].split() or [""])[0]
            out.append(f">{name}")
            out.append(left + a3m_row(m.sequences[r], m.deletion_matrix[r]) + right)
    return "\n".join(out) + "\n"


def write_complex_a3m(path: str | Path, a3m: ComplexA3m) -> Path:
    """Write atomically (temporary file + rename)."""
    path = Path(path)
    atomic_write_text(path, format_complex_a3m(a3m))
    return path


def complex_a3m_from_chains(chains: list[ChainInput]) -> ComplexA3m:
    """Our own inputs of a complex (input order) -> ColabFold's layout: each distinct chain's
    MSA as its unpaired rows and, for a heteromer, the chains' rows paired before
    (`ChainInput.paired`, when every chain has them) or else our species pairing of the
    chains' UniProt alignments (AlphaFold-Multimer's, over every copy) as the paired block.
    The copies of a repeated chain get equal paired rows from the species pairing (equal
    alignments pair alike), which ColabFold's one part per distinct chain can hold; copies
    paired differently are a ValueError."""
    queries, counts = distinct_chains([c.sequence for c in chains])
    first = {}
    for c in chains:
        first.setdefault(c.sequence, c)
    paired = None
    if len(queries) > 1:
        missing = [c.chain_id for c in chains if c.uniprot is None and c.paired is None]
        if missing:
            raise ValueError(f"chain {missing[0]}: a heteromer needs every chain's UniProt "
                             f"alignment for the paired block")
        if all(c.paired is not None for c in chains):        # paired before: kept as given
            msas = [c.paired for c in chains]
        else:
            msas = species_paired_msas([c.uniprot for c in chains])
        by_seq: dict[str, Msa] = {}
        for c, m in zip(chains, msas):
            prev = by_seq.setdefault(c.sequence, m)
            if prev.sequences != m.sequences:
                raise ValueError(f"chain {c.chain_id}: its paired rows differ from those of "
                                 f"another copy of the same sequence")
        paired = [by_seq[q] for q in queries]
    return ComplexA3m(queries, counts, paired, [first[q].msa for q in queries])
