"""Template hits from hmmsearch's `-A` Stockholm output, as AlphaFold v2.3.2 reads them
(`parsers.convert_stockholm_to_a3m(remove_first_row_gaps=False)` then
`parsers.parse_hmmsearch_a3m(skip_first=False)`): one hit per aligned *domain*, in file order;
names `<pdb>_<chain>` from `<pdb>_<chain>/<start>-<end>` plus the `DE` line
(`mol:protein length:N NAME`); match columns uppercase, insertions lowercase (they advance the
template index but are not aligned), `-` deletions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from protdp.errors import InputError

_DESCRIPTION = re.compile(r"^>?([a-z0-9]+)_(\w+)/([0-9]+)-([0-9]+).*protein length:([0-9]+) *(.*)$")


@dataclass(frozen=True)
class TemplateHit:
    """One aligned domain (AF2 `parsers.TemplateHit`; hmmsearch has no sum_probs)."""

    index: int
    name: str                 # "<pdb>_<chain>"
    aligned_cols: int
    query: str
    hit_sequence: str         # query-aligned, uppercase (insertions kept, uppercased)
    indices_query: list[int]
    indices_hit: list[int]
    sum_probs: float | None = None


def _indices(sequence: str, start: int) -> list[int]:
    """AF2 `parsers._get_indices`: -1 per gap, an index per match; insertions advance only."""
    out, counter = [], start
    for symbol in sequence:
        if symbol == "-":
            out.append(-1)
        elif symbol.islower():
            counter += 1
        else:
            out.append(counter)
            counter += 1
    return out


def stockholm_rows(text: str) -> list[tuple[str, str, str]]:
    """(name, aligned sequence with '.' removed, DE description) per sequence, in order."""
    sequences: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith(("#", "//")):
            parts = line.split(maxsplit=1)
            if len(parts) != 2:
                raise ValueError(f"alignment line without a sequence: {line[:80]!r}")
            sequences[parts[0]] = sequences.get(parts[0], "") + parts[1]
    descriptions = {}
    for line in text.splitlines():
        if line.startswith("#=GS"):
            cols = line.split(maxsplit=3)
            if len(cols) >= 3 and cols[2] == "DE":
                descriptions[cols[1]] = cols[3] if len(cols) == 4 else ""
    return [(k, v.replace(".", ""), descriptions.get(k, "")) for k, v in sequences.items()]


def parse_hits(text: str, query: str, source: str | Path = "<hits>") -> list[TemplateHit]:
    """hmmsearch `-A` Stockholm -> TemplateHits (see the module docstring); protein rows only."""
    try:
        rows = stockholm_rows(text)
    except ValueError as exc:
        raise InputError(str(exc), path=source) from None
    query_indices = _indices(query, 0)
    hits = []
    for i, (name, seq, desc) in enumerate(rows, start=1):
        header = f"{name} {desc}"
        if "mol:protein" not in header:
            continue
        m = _DESCRIPTION.match(header.strip())
        if m is None:
            raise InputError(f"hit {name!r}: expected '<pdb>_<chain>/<start>-<end> ... "
                             "mol:protein length:N' (pdb_seqres.txt names)", path=source)
        pdb, chain, start = m.group(1), m.group(2), int(m.group(3))
        hits.append(TemplateHit(
            index=i, name=f"{pdb}_{chain}",
            aligned_cols=sum(r.isupper() and r != "-" for r in seq), query=query,
            hit_sequence=seq.upper(), indices_query=query_indices,
            indices_hit=_indices(seq, start - 1)))
    return hits
