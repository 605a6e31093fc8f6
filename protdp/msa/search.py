"""jackhmmer-style iterative search with pyhmmer, streaming the database in blocks.

AF2 builds the MSAs of a target by genetic search (supplement 1.2.2: jackhmmer against UniRef90
and MGnify, settings in `protdp.msa.settings`); this module is that search. Per query and iteration, as HMMER's `jackhmmer` (and pyhmmer's `IterativeSearch`): iteration 1
builds an HMM from the query alone (BLOSUM62, `Builder.build`); each later iteration builds one
from the previous iteration's alignment of included hits, the query first
(`Builder.build_msa`, hand architecture over all consensus columns); the search stops early
when an iteration includes no new sequence (`TopHits.compare_ranking`).

Unlike `pyhmmer.hmmer.jackhmmer`, which reads the whole database into memory, every iteration
streams the database once for all active queries: each block of at most `block_residues`
residues is searched by every query's HMM on a thread pool (pyhmmer releases the GIL; one
`Pipeline` per thread), and the per-block hits are merged with `TopHits.merge`, which sums the
searched-sequence counts so E-values use the whole database size (Z), exactly as one pass over
the file would. At most `workers + 1` blocks are held at a time.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tqdm import tqdm

from protdp.errors import InputError
from protdp.msa.database import DEFAULT_BLOCK_RESIDUES, SequenceDatabase
from protdp.msa.sanitize import DatabaseScan
from protdp.msa.settings import SearchSettings

_MERGE_EVERY = 64   # merge a query's per-block hits in groups, so the list stays short


@dataclass
class Query:
    """One search query: `stem` names its output files (the predictor's MSA file name)."""

    name: str
    stem: str
    sequence: str


@dataclass
class QueryResult:
    """The final iteration of one query against one database."""

    query: Query
    database: str
    msa: object               # pyhmmer.easel.TextMSA: query first, then included domains
    included: int             # sequences over the inclusion thresholds (final iteration)
    iterations: int
    converged: bool
    searched_sequences: int   # Z: sequences in the database
    skipped_records: list = field(default_factory=list)   # SkippedRecord: bad database records


class _IterativeQuery:
    """One query's jackhmmer state between passes over the database."""

    def __init__(self, query: Query, alphabet, settings: SearchSettings):
        from pyhmmer.easel import KeyHash, TextSequence
        from pyhmmer.plan7 import Background, Builder, Trace

        self.query = query
        self.alphabet = alphabet
        self.sequence = TextSequence(name=query.stem.encode(),
                                     sequence=query.sequence).digitize(alphabet)
        self.background = Background(alphabet)
        self.builder = Builder(alphabet, seed=settings.seed, architecture="hand")
        self.trace = Trace.from_sequence(self.sequence)
        self.ranking = KeyHash()
        self.msa = None           # DigitalMSA of the last iteration
        self.hits = None
        self.iteration = 0
        self.converged = False

    def next_hmm(self):
        """Iteration 1: HMM of the query alone; later: of the last alignment."""
        if self.msa is None:
            hmm, _, _ = self.builder.build(self.sequence, self.background)
        else:
            hmm, _, _ = self.builder.build_msa(self.msa, self.background)
        return hmm

    def finish_iteration(self, hits) -> None:
        """Rank the merged hits, align the included ones and test convergence."""
        hits.sort(by="key")
        previous = 1 if self.msa is None else len(self.msa.sequences)
        new = hits.compare_ranking(self.ranking)
        self.msa = hits.to_msa(self.alphabet, sequences=[self.sequence], traces=[self.trace],
                               all_consensus_cols=True, digitize=True)
        self.msa.name = f"{self.query.stem}-i{self.iteration + 1}".encode()
        self.hits = hits
        self.iteration += 1
        self.converged = new == 0 and len(self.msa.sequences) <= previous

    def result(self, database: str) -> QueryResult:
        return QueryResult(self.query, database, self.msa.textize(), len(self.hits.included),
                           self.iteration, self.converged, int(self.hits.searched_sequences))


class _Scanner:
    """Searches HMMs against blocks on a thread pool, one pyhmmer `Pipeline` per thread."""

    def __init__(self, alphabet, settings: SearchSettings, workers: int):
        self.alphabet = alphabet
        self.options = settings.pipeline_options()
        self.workers = workers
        self._local = threading.local()

    def _pipeline(self):
        pli = getattr(self._local, "pipeline", None)
        if pli is None:
            from pyhmmer.plan7 import Background, Pipeline
            pli = Pipeline(self.alphabet, background=Background(self.alphabet), **self.options)
            self._local.pipeline = pli
        return pli

    def _search(self, hmm, block):
        pli = self._pipeline()
        try:
            return pli.search_hmm(hmm, block)
        finally:
            pli.clear()

    def scan(self, hmms: list, db: SequenceDatabase, block_residues: int, bar,
             records: DatabaseScan | None = None) -> list:
        """One pass over `db`: merged TopHits per HMM (skipped records into `records`)."""
        parts: list[list] = [[] for _ in hmms]
        merged: list = [None] * len(hmms)
        pending: deque[tuple[int, list[Future]]] = deque()

        def collect(n_seqs: int, futures: list[Future]) -> None:
            for i, fut in enumerate(futures):
                parts[i].append(fut.result())
                if len(parts[i]) >= _MERGE_EVERY:
                    merged[i] = _merge(merged[i], parts[i])
                    parts[i] = []
            bar.update(n_seqs)

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            try:
                for block in db.blocks(block_residues, records):
                    pending.append((len(block), [pool.submit(self._search, h, block)
                                                 for h in hmms]))
                    while len(pending) > self.workers:
                        collect(*pending.popleft())
                while pending:
                    collect(*pending.popleft())
            except ValueError as exc:   # pyhmmer: a target over HMMER's length limit
                raise InputError(f"search failed: {exc}", path=db.path) from None
            finally:
                for _, futures in pending:
                    for fut in futures:
                        fut.cancel()
        return [_merge(m, p) for m, p in zip(merged, parts)]


def _merge(first, rest: list):
    """Merge per-block TopHits (Z and domZ summed, thresholds re-applied)."""
    items = ([first] if first is not None else []) + rest
    if not items:
        raise InputError("the sequence database contains no sequences")
    return items[0].merge(*items[1:]) if len(items) > 1 else items[0].merge()


def search_database(queries: list[Query], db: SequenceDatabase, settings: SearchSettings, *,
                    workers: int = 1, block_residues: int = DEFAULT_BLOCK_RESIDUES,
                    progress: bool = False, total_sequences: int | None = None
                    ) -> list[QueryResult]:
    """Iterative search of every query against `db`; one streamed pass per iteration."""
    from pyhmmer.easel import Alphabet

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    alphabet = Alphabet.amino()
    states = [_IterativeQuery(q, alphabet, settings) for q in queries]
    scanner = _Scanner(alphabet, settings, workers)
    records = DatabaseScan()                     # filled by the first pass
    for iteration in range(1, settings.iterations + 1):
        active = [s for s in states if not s.converged]
        if not active:
            break
        hmms = [s.next_hmm() for s in active]
        with tqdm(total=total_sequences, unit="seq", unit_scale=True, disable=not progress,
                  desc=f"{db.name} iteration {iteration}/{settings.iterations} "
                       f"({len(active)} queries)", leave=False) as bar:
            hits = scanner.scan(hmms, db, block_residues, bar,
                                records if iteration == 1 else None)
        for state, h in zip(active, hits):
            state.finish_iteration(h)
    results = [s.result(db.name) for s in states]
    for r in results:
        r.skipped_records = records.skipped
    return results
