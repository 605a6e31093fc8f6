"""Search many queries against several databases into a folder `protdp predict` reads.

Layout of OUT (one folder per query, named by its `stem`, the predictor's MSA file name):

    OUT/<stem>/<db>.a3m              query-anchored MSA, deduplicated (what --msa-dir merges)
    OUT/<stem>/stockholm/<db>.sto    the search alignment (first max_sequences rows)
    OUT/<stem>/.<db>.search.json     completion mark: fingerprint and statistics (written last)
    OUT/databases.json               sha256 (and size) of each database, computed once
    OUT/msa_search.tsv               depth and coverage per query and database

A (query, database) pair whose completion mark carries the same fingerprint (sequence,
database sha256, settings) is not searched again. Queries are searched in batches of
`batch_size`, each batch one streamed pass over the database per iteration, so an interrupted
run loses at most the batch in flight.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from protdp.data.safeio import writable_folder
from protdp.msa.database import ChecksumCache, SequenceDatabase, open_databases
from protdp.msa.sanitize import skipped_lines
from protdp.msa.search import Query, QueryResult, search_database
from protdp.msa.settings import SearchSettings
from protdp.msa.writers import alignment_to_a3m, atomic_write, stockholm_bytes

FORMAT_VERSION = 1          # bump when the output of the same search changes
SUMMARY_NAME = "msa_search.tsv"
STOCKHOLM_DIR = "stockholm"
TSV_COLUMNS = ("target", "stem", "database", "status", "depth", "included", "duplicates",
               "truncated", "coverage_min", "coverage_mean", "covered_fraction", "iterations",
               "converged", "seconds", "a3m", "detail")
_MARK_COLUMNS = TSV_COLUMNS[4:-2]     # depth .. seconds, from the completion mark


def _tool_versions() -> dict:
    import pyhmmer
    return {"pyhmmer": pyhmmer.__version__}


def search_provenance(settings: SearchSettings, databases: list[dict]) -> dict:
    """What made a searched MSA: tool, settings and databases (name, path, sha256, size)."""
    return {"tool": "protdp.msa (pyhmmer, jackhmmer-style iterative search)",
            "versions": _tool_versions(), "settings": asdict(settings),
            "databases": databases, "format_version": FORMAT_VERSION}


def fingerprint(query: Query, database: dict, settings: SearchSettings) -> str:
    blob = json.dumps({"sequence": query.sequence, "database_sha256": database["sha256"],
                       "settings": asdict(settings), "format_version": FORMAT_VERSION},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _mark_path(out: Path, stem: str, db: str) -> Path:
    return out / stem / f".{db}.search.json"


def a3m_path(out: Path, stem: str, db: str) -> Path:
    return out / stem / f"{db}.a3m"


def _done(out: Path, query: Query, db: str, fp: str) -> dict | None:
    """The completion mark when this pair was searched with the same inputs."""
    try:
        mark = json.loads(_mark_path(out, query.stem, db).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or mark.get("fingerprint") != fp:
        return None
    if not a3m_path(out, query.stem, db).is_file():
        return None
    return mark


def _write_result(out: Path, res: QueryResult, fp: str, settings: SearchSettings,
                  database: dict, seconds: float) -> dict:
    """a3m, Stockholm, then the completion mark (last)."""
    stem = res.query.stem
    a3m = alignment_to_a3m(res.msa, settings.max_sequences, query_name=stem)
    atomic_write(out / stem / STOCKHOLM_DIR / f"{res.database}.sto",
                 stockholm_bytes(res.msa, settings.max_sequences))
    atomic_write(a3m_path(out, stem, res.database), a3m.text.encode("ascii"))
    mark = {"target": res.query.name, "stem": stem, "database": database,
            "fingerprint": fp, "included": res.included, "iterations": res.iterations,
            "converged": res.converged, "searched_sequences": res.searched_sequences,
            "skipped_records": len(res.skipped_records),
            "seconds": round(seconds, 3), **a3m.stats(), "coverage": a3m.coverage,
            "settings": asdict(settings), "versions": _tool_versions()}
    atomic_write(_mark_path(out, stem, res.database), json.dumps(mark, indent=1).encode())
    return mark


@dataclass
class SearchReport:
    """Rows of msa_search.tsv (one per query and database) and what the run did."""

    out_dir: Path
    rows: list[dict] = field(default_factory=list)
    databases: list[dict] = field(default_factory=list)
    summary_path: Path | None = None

    def counts(self) -> dict:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def _row(query: Query, db: str, status: str, mark: dict | None, out: Path,
         detail: str = "") -> dict:
    row = {"target": query.name, "stem": query.stem, "database": db, "status": status,
           "detail": detail}
    if mark is not None:
        row.update({k: mark[k] for k in _MARK_COLUMNS if k in mark})
        row["a3m"] = str(a3m_path(out, query.stem, db))
    return row


def _search_one_database(queries: list[Query], db: SequenceDatabase, database: dict, out: Path,
                         settings: SearchSettings, cache: ChecksumCache, *, workers: int,
                         batch_size: int, block_residues: int, progress: bool, force: bool
                         ) -> list[dict]:
    fps = {q.stem: fingerprint(q, database, settings) for q in queries}
    rows, todo = {}, []
    for q in queries:
        mark = None if force else _done(out, q, db.name, fps[q.stem])
        if mark is not None:
            rows[q.stem] = _row(q, db.name, "skipped", mark, out)
        else:
            todo.append(q)
    batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
    with tqdm(total=len(todo), unit="target", desc=f"msa search {db.name}",
              disable=not progress or not todo) as bar:
        for batch in batches:
            t0 = time.perf_counter()
            results = search_database(batch, db, settings, workers=workers,
                                      block_residues=block_residues, progress=progress,
                                      total_sequences=cache.sequences(db))
            per_query = (time.perf_counter() - t0) / len(batch)
            if batch is batches[0]:      # each bad database record once, not once per batch
                for line in skipped_lines(results[0].skipped_records, db.path):
                    print(line, file=sys.stderr)
            for res in results:
                mark = _write_result(out, res, fps[res.query.stem], settings, database,
                                     per_query)
                rows[res.query.stem] = _row(res.query, db.name, "searched", mark, out)
            cache.record_sequences(db, results[0].searched_sequences)
            bar.update(len(batch))
    return [rows[q.stem] for q in queries]


def search_targets(queries: list[Query], databases: list[str | Path], out_dir: str | Path, *,
                   settings: SearchSettings | None = None, workers: int = 1,
                   batch_size: int = 32, block_residues: int | None = None,
                   progress: bool = True, force: bool = False,
                   failed: list[tuple[Query, str]] | None = None,
                   summary_name: str | None = SUMMARY_NAME) -> SearchReport:
    """Search every query against every database into `out_dir` (layout above); finished
    pairs are skipped. `failed` lists queries rejected before the search (bad sequence): they
    get an 'error' row in the summary. Returns the report (summary TSV `summary_name` written;
    None: none, e.g. one target searched by `protdp predict --db`)."""
    from protdp.msa.database import DEFAULT_BLOCK_RESIDUES

    settings = settings or SearchSettings()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dbs = open_databases(list(databases))
    out = writable_folder(out_dir, "MSA output folder (--out)")   # read-only: one line, first
    cache = ChecksumCache(out)
    report = SearchReport(out, databases=[cache.describe(db) for db in dbs])
    for db, database in zip(dbs, report.databases):
        rows = _search_one_database(queries, db, database, out, settings, cache,
                                    workers=workers, batch_size=batch_size,
                                    block_residues=block_residues or DEFAULT_BLOCK_RESIDUES,
                                    progress=progress, force=force)
        report.rows += rows
        report.rows += [_row(q, db.name, "error", None, out, why) for q, why in failed or []]
    if summary_name is not None:
        report.summary_path = atomic_write(out / summary_name, _tsv(report.rows))
    return report


def _tsv(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n")
    writer.writerow(TSV_COLUMNS)
    for r in rows:
        writer.writerow(["" if r.get(k) is None else _cell(r.get(k)) for k in TSV_COLUMNS])
    return buf.getvalue().encode()


def _cell(value) -> str:
    """TSV-safe text: user text (ids, errors) never carries a tab or newline."""
    return str(value).encode("unicode_escape").decode("ascii")


def link_msa_inputs(link_dir: str | Path, links: dict[str, Path]) -> Path:
    """A folder of symbolic links `relative name -> file` (e.g. 'x/uniref90.a3m', 'y.a3m'):
    exactly the MSAs one prediction run uses, for `--msa-dir`. Rebuilt whole on every call
    (built beside, then swapped in), so a link from an earlier run never lingers."""
    import shutil

    link_dir = Path(link_dir)
    tmp = link_dir.with_name(f".{link_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for rel, src in sorted(links.items()):
        dest = tmp / rel
        if dest.resolve().parent != tmp.resolve() and tmp.resolve() not in dest.resolve().parents:
            raise ValueError(f"link name escapes the folder: {rel!r}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(Path(src).resolve(), dest)
    old = link_dir.with_name(f".{link_dir.name}.{os.getpid()}.old")
    if link_dir.exists():
        os.replace(link_dir, old)
    os.replace(tmp, link_dir)
    shutil.rmtree(old, ignore_errors=True)
    return link_dir
