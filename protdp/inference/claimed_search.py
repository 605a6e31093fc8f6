"""`protdp predict --db`: the MSA search of each target when a process claims it from the run's
work queue (issue 45), not a share of the targets dealt to each rank up front.

A claimed target that has no MSA (none in --msa-dir, none given by the input) is searched
(`protdp.msa.search_targets`: pyhmmer, AF2's jackhmmer settings) into --msa-search-dir
(default OUT/msa_search, `<stem>/<db>.a3m`); with --prefetch the search runs in the prefetch
worker process while the model predicts the previous target (`prefetch.prepare_target`), else
inline just before the target's prediction. So every process searches only what it claims:
two processes of a run (ranks, job-array tasks, two `protdp predict` by hand) never search
one target twice unless a lease ran out, and the target of a killed process is searched by
whoever claims it next (a finished search is found by its completion mark, not redone).

The target then reads exactly the searched files (`Target.extra["msa_files"]`, as an input
that names its MSAs); complexes read `--msa-search-dir` as their MSA folder (`<complex>_<chain
id>/`, as `protdp msa search --complexes` writes it), each distinct chain of the claimed complex
searched.

Failures: a database that cannot be read (an error naming the database file) stops the
process with one line, as a bad --db did before any work; anything else failing in one
target's search (its folder cannot be written, ...) is that target's summary row, with the
reason, and the rest go on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from protdp.errors import InputError, ProtdpError
from protdp.inference.predictor import Predictor
from protdp.inference.targets import Target, clean_sequence, find_msa_files
from protdp.msa import SearchSettings, a3m_path, search_targets
from protdp.msa.search import Query

SEARCH_FAILED = "MSA search failed"


@dataclass(frozen=True)
class ClaimedSearch:
    """What searching one claimed target needs (picklable: a prefetch worker runs it)."""
    databases: tuple[str, ...]          # --db paths, resolved
    search_dir: str                     # --msa-search-dir
    settings: SearchSettings
    user_dir: str | None = None         # --msa-dir: a target with an MSA there is not searched
    workers: int = 1                    # search threads
    max_length: int = 10_000            # predict's sequence checks: an invalid target is
    max_unknown_fraction: float = 0.5   # rejected by the predictor, never searched
    chain_queries: dict | None = None   # complexes: complex id -> (Query of each distinct chain)

    def queries(self, t: Target) -> list[Query]:
        """The queries target `t` needs searched ([]: none, it has its MSAs or is invalid)."""
        if t.error:
            return []
        if self.chain_queries is not None:
            return list(self.chain_queries.get(t.target_id, ()))
        if "msa_files" in t.extra or "complex" in t.extra:
            return []
        user = None if self.user_dir is None else Path(self.user_dir)
        try:
            if find_msa_files(user, t.file_name):
                return []
            seq = clean_sequence(t.raw_sequence, max_length=self.max_length,
                                 max_unknown_fraction=self.max_unknown_fraction)
        except InputError:          # the predictor rejects it with the same reason
            return []
        return [Query(t.target_id, t.file_name, seq)]

    def _database_error(self, exc: BaseException) -> bool:
        path = getattr(exc, "path", None)
        return isinstance(exc, ProtdpError) and path is not None and any(
            Path(path).resolve() == Path(db).resolve() for db in self.databases)

    def outcome(self, t: Target) -> tuple[str, tuple[str, ...] | str] | None:
        """Search target `t` when it needs it: ("ok", its a3m files) / ("error", reason);
        None when it needs no search. An error naming a database is raised (the run stops)."""
        queries = self.queries(t)
        if not queries:
            return None
        try:
            report = search_targets(queries, list(self.databases), self.search_dir,
                                    settings=self.settings, workers=self.workers,
                                    batch_size=len(queries), progress=False,
                                    summary_name=None)
        except Exception as exc:    # noqa: BLE001  (one target's failure is its row)
            if self._database_error(exc):
                raise
            return "error", f"{SEARCH_FAILED}: {type(exc).__name__}: {exc}"
        return "ok", tuple(str(a3m_path(Path(self.search_dir), q.stem, db["name"]))
                           for q in queries for db in report.databases)

    def apply(self, t: Target, outcome) -> Target:
        """`t` reading its searched MSAs (monomers), or rejected with the search's reason."""
        if outcome is None:
            return t
        kind, value = outcome
        if kind == "error":
            return dataclasses.replace(t, error=value)
        if self.chain_queries is not None:      # complexes read --msa-search-dir
            return t
        return dataclasses.replace(t, extra={**t.extra, "msa_files": list(value)})


class SearchingPredictor(Predictor):
    """A `Predictor` that searches each target's MSA (`ClaimedSearch`) when it predicts it,
    or takes the search a prefetch worker ran (`search_outcomes`, by target index)."""

    def __init__(self, *args, claimed_search: ClaimedSearch, **kwargs):
        super().__init__(*args, **kwargs)
        self.claimed_search = claimed_search
        self.search_outcomes: dict[int, tuple] = {}

    def predict_target(self, t: Target, fasta: dict, forward=None) -> dict:
        outcome = self.search_outcomes.pop(t.index, None) or self.claimed_search.outcome(t)
        return super().predict_target(self.claimed_search.apply(t, outcome), fasta, forward)


def prepare_search(databases: list[str], search_dir: str | Path, settings: SearchSettings, *,
                   user_dir: str | Path | None = None, workers: int = 1,
                   max_length: int = 10_000, max_unknown_fraction: float = 0.5,
                   complexes_fasta: str | Path | None = None) -> tuple[ClaimedSearch, dict]:
    """Before any work: open the databases (a missing or unreadable one is one line), hash
    them once (cached in `search_dir`/databases.json) for the provenance every process of the
    run records alike, and, for complexes (`complexes_fasta`), list each complex's distinct
    chains. Returns (the search, config.msa_search provenance)."""
    from protdp.data.safeio import writable_folder
    from protdp.msa import open_databases, search_provenance
    from protdp.msa.cli import read_complex_queries
    from protdp.msa.database import ChecksumCache

    dbs = open_databases(list(databases))
    search_dir = writable_folder(search_dir, "MSA search folder (--msa-search-dir)")
    cache = ChecksumCache(search_dir)
    described = [cache.describe(db) for db in dbs]
    chains = None
    if complexes_fasta is not None:
        queries, _ = read_complex_queries(str(complexes_fasta), max_length=max_length)
        chains: dict[str, tuple] = {}
        for q in queries:                       # named <complex>_<chain id>
            complex_id = q.name.rsplit("_", 1)[0]
            chains[complex_id] = chains.get(complex_id, ()) + (q,)
    search = ClaimedSearch(tuple(str(db.path) for db in dbs), str(Path(search_dir).resolve()),
                           settings, None if user_dir is None else str(user_dir), workers,
                           max_length, max_unknown_fraction, chains)
    return search, {**search_provenance(settings, described),
                    "search_dir": search.search_dir}
