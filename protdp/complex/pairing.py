"""Cross-chain MSA pairing by species (AlphaFold-Multimer, Evans et al. 2021, "MSA pairing";
AlphaFold v2.3.2 `msa_pairing.pair_sequences` / `reorder_paired_rows` /
`create_paired_features` and `msa_identifiers`).

Each chain of a heteromer brings an unclustered UniProt alignment (jackhmmer's Stockholm,
query first; `protdp msa search --db uniprot...` writes it as `<chain>/stockholm/<db>.sto`).
A row's species is the mnemonic of its UniProt entry name (`tr|A0A146SKV9|A0A146SKV9_FUNHE`
-> FUNHE). For every species found in at least two chains (and in no chain more than
`MAX_ROWS_PER_SPECIES` times), the rows of that species in each chain are ranked by identity
to their query and the k-th ranked rows of the chains are paired (k up to the smallest
count); a chain without the species contributes an all-gap row. Paired rows are ordered by how
many chains they cover (all chains first), then by the product of their row indices (a proxy
for e-value: rows come in hit order). Row 0 of every chain (the queries) is always the first
paired row. The returned `Pairing` records every paired row with its species so the choice
can be written out (`pairing_report`) and reproduced.

Tie-breaking: AlphaFold v2.3.2 sorts with pandas/numpy's default quicksort; ties keep input
order here (a stable sort, as AlphaFold's later `msa_pairing` rewrite does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from protdp.data.parse import Msa
from protdp.data.residues import GAP_ID, ids_to_sequence

MAX_UNIPROT_HITS = 50_000          # pipeline_multimer.DataPipeline(max_uniprot_hits=50000)
MAX_ROWS_PER_SPECIES = 600         # pair_sequences: species with more rows in a chain are skipped
QUERY_SPECIES = ""                 # the query (and every row without a UniProt name)

# UniProtKB entry names (msa_identifiers._UNIPROT_PATTERN): db|ACCESSION[_isoform]|ENTRY_SPECIES
# with an optional small-BFD '_<number>' suffix; the '/start-end' of jackhmmer is cut first.
_UNIPROT_NAME = re.compile(
    r"^(?:tr|sp)\|[A-Za-z0-9]{6,10}(?:_\d)?\|[A-Za-z0-9]+_(?P<species>[A-Za-z0-9]{1,5})"
    r"(?:_\d+)?$")
_UNIPROT_PREFIX = ("tr|", "sp|")


def species_of(name: str) -> str:
    """Species mnemonic of an MSA row name ('' when the name is not a UniProt entry name)."""
    word = name.split()[0].partition("/")[0] if name.split() else ""
    m = _UNIPROT_NAME.match(word.strip())
    return m.group("species") if m else QUERY_SPECIES


@dataclass
class UniprotChainMsa:
    """A chain's pairing MSA: tokens in AF order (gap = 21), deletions and per-row species."""
    tokens: np.ndarray                 # int32 [N, L]; row 0 = query
    deletions: np.ndarray              # int32 [N, L]
    names: list[str]                   # row names (first header word)
    species: list[str]                 # per row; '' = none
    malformed: list[str] = field(default_factory=list)   # tr|/sp| names without a species

    @classmethod
    def from_msa(cls, msa: Msa, max_hits: int = MAX_UNIPROT_HITS) -> "UniprotChainMsa":
        """First `max_hits` rows of a parsed (deduplicated) alignment (AlphaFold truncates the
        raw jackhmmer rows to 50,000 before deduplicating; this is the same below that)."""
        n = min(msa.depth, max_hits)
        names = list(msa.names[:n])
        species = [species_of(x) for x in names]
        malformed = [x for x, s in zip(names[1:], species[1:])
                     if not s and x.startswith(_UNIPROT_PREFIX)]
        return cls(msa.tokens()[:n].astype(np.int32),
                   np.asarray(msa.deletion_matrix[:n], np.int32), names, species, malformed)

    def similarity(self) -> np.ndarray:
        """Fraction of columns identical to the query, float64 [N] (gaps count as columns)."""
        return np.mean(self.tokens == self.tokens[0][None], axis=-1)


@dataclass
class Pairing:
    """Paired rows across chains, in AlphaFold's final order."""
    rows: np.ndarray                   # int64 [P, C]; row of each chain's MSA, -1 = gap row
    species: list[str]                 # [P]; '' for the query pairing (row 0)


def _species_groups(chain: UniprotChainMsa) -> dict[str, np.ndarray]:
    """species -> row indices of that species, ranked by similarity to the query (stable)."""
    sim = chain.similarity()
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(chain.species):
        groups.setdefault(s, []).append(i)
    return {s: np.asarray(r)[np.argsort(-sim[r], kind="stable")] for s, r in groups.items()}


def pair_rows(chains: list[UniprotChainMsa]) -> Pairing:
    """Species pairing over all chains (see the module docstring)."""
    n_chains = len(chains)
    groups = [_species_groups(c) for c in chains]
    by_coverage: dict[int, list[tuple[np.ndarray, str]]] = {k: [] for k in range(n_chains + 1)}
    by_coverage[n_chains].append((np.zeros(n_chains, np.int64), QUERY_SPECIES))
    for sp in sorted(set().union(*groups) - {QUERY_SPECIES}):
        present = [g.get(sp) for g in groups]
        counts = [len(p) for p in present if p is not None]
        if len(counts) <= 1 or max(counts) > MAX_ROWS_PER_SPECIES:
            continue
        take = min(counts)
        cols = [p[:take] if p is not None else np.full(take, -1) for p in present]
        for row in np.stack(cols, axis=1).astype(np.int64):       # [take, C]
            by_coverage[len(counts)].append((row, sp))
    rows, species = [], []
    for k in sorted(by_coverage, reverse=True):
        entries = by_coverage[k]
        if not entries:
            continue
        product = np.abs(np.array([np.prod(r) for r, _ in entries]))
        for j in np.argsort(product, kind="stable"):
            rows.append(entries[j][0])
            species.append(entries[j][1])
    return Pairing(np.stack(rows), species)


def paired_chain_msa(chain: UniprotChainMsa, rows: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The chain's paired block (create_paired_features): rows -1 take an appended padding row
    (all gaps, no deletions). -> (tokens int32 [P, L], deletions float32 [P, L])."""
    L = chain.tokens.shape[1]
    tok = np.concatenate([chain.tokens, np.full((1, L), GAP_ID, np.int32)])
    dels = np.concatenate([chain.deletions, np.zeros((1, L), np.int32)]).astype(np.float32)
    return tok[rows], dels[rows]


def pairing_report(chains: list[UniprotChainMsa], pairing: Pairing, kept: int,
                   chain_ids: list[str]) -> dict:
    """JSON-ready record of the pairing: per paired row its species and, per chain, the row
    index and name in that chain's pairing MSA (null = gap row); only the `kept` rows that
    survive AlphaFold's cropping are listed, with the number dropped."""
    out = []
    for r, sp in zip(pairing.rows[:kept], pairing.species[:kept]):
        out.append({"species": sp or None,
                    "rows": {c: (int(i) if i >= 0 else None) for c, i in zip(chain_ids, r)},
                    "names": {c: (ch.names[i] if i >= 0 else None)
                              for c, ch, i in zip(chain_ids, chains, r)}})
    return {"paired_rows": out, "paired_rows_cropped": int(len(pairing.rows) - kept),
            "uniprot_msas": {c: {"rows": len(ch.names),
                           "rows_with_species": sum(1 for s in ch.species[1:] if s),
                           "malformed_uniprot_names": len(ch.malformed),
                           "first_malformed": ch.malformed[0] if ch.malformed else None}
                       for c, ch in zip(chain_ids, chains)}}


def species_paired_msas(uniprot: list[Msa]) -> list[Msa]:
    """The species pairing of these chains' UniProt alignments as pre-paired rows, one Msa per
    chain in the given order (row i of every Msa belongs together; all gaps = no partner; not
    deduplicated), e.g. for writing ColabFold's complex a3m. The pairing does not depend on the
    chains' order (species sorted, rows ordered by coverage and by the product of indices)."""
    chains = [UniprotChainMsa.from_msa(m) for m in uniprot]
    pairing = pair_rows(chains)
    out = []
    for k, c in enumerate(chains):
        tok, dels = paired_chain_msa(c, pairing.rows[:, k])                   # [P, L]
        names = [c.names[i] if i >= 0 else "" for i in pairing.rows[:, k]]
        out.append(Msa([ids_to_sequence(r) for r in tok],
                       np.clip(dels, 0, 255).astype(np.uint8), names))
    return out
