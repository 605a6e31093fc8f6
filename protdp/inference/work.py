"""The targets of a batch through the leased work queue (`protdp.workqueue`): which run a
process joins, how it predicts what it claims, and the run's summary, written from the queue.

- Run: every process predicting the same FASTA into the same --out with the same settings
  (checkpoints, seeds, gate policy, ...) joins one run (`run_key`), whatever launched it:
  torchrun / mpirun / SLURM ranks, or `protdp predict` started twice by hand.
- Queue: the SQLite file OUT/.summary_parts/work_queue.sqlite (one node), or the PostgreSQL
  server of `--work-queue-url` (ranks on several nodes; the review queue's server will do:
  the work queue's tables are its own, `work_runs` / `work_items`).
- Claims: costliest first (length^2, `sharding.target_cost`), shortest first with
  --sort-queries-by-length. Each claimed target's lease is renewed while it is predicted; a
  process killed midway leaves its target to be claimed again when the lease runs out (at
  once by a process on the same host, which sees that the pid is gone).
- Summary: the queue holds each target's row once (a second result for a target whose lease
  was lost is dropped), and summary.tsv / .csv / .json are written from it, under a file lock,
  once every target is final (`batch.write_run_summary`); so each target is in summary.csv
  exactly once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from protdp.inference.predictor import PARTS_DIR as WORK_DIR   # the summary's parts: the queue
from protdp.inference.json_text import json_plain
from protdp.inference.prefetch import DEFAULT_LOOKAHEAD, FeaturePrefetcher
from protdp.inference.sharding import target_cost
from protdp.workqueue import DEFAULT_LEASE_S, WorkItem, WorkQueue, Worker, drain
from protdp.workqueue.progress import RunProgress

QUEUE_FILE = "work_queue.sqlite"


def default_queue_url(out_dir: str | Path, given: str | None = None) -> str:
    """--work-queue-url, else the SQLite file in the output folder (one node)."""
    if given:
        return given
    return str(Path(out_dir).resolve() / WORK_DIR / QUEUE_FILE)


def run_key(out_dir: Path, fasta: dict, settings: dict) -> str:
    """The run a process joins: output folder, inputs and every prediction setting."""
    blob = json.dumps({"out": str(Path(out_dir).resolve()), "fasta_sha256": fasta["sha256"],
                       "msa_dir": None if fasta["msa_dir"] is None else str(fasta["msa_dir"]),
                       "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def predict_queued(pred, targets: list, lengths: list, info: dict, *, queue_url: str,
                   rank: int, lease_s: float = DEFAULT_LEASE_S, largest_first: bool = True,
                   progress: bool = True, prefetch_workers: int = 0,
                   lookahead: int = DEFAULT_LOOKAHEAD) -> tuple[WorkQueue, list[dict]]:
    """Join the run, predict targets until none is left (`workqueue.drain`); with
    `prefetch_workers`, the inputs of `lookahead` claimed targets ahead are prepared in that
    many worker processes meanwhile (`prefetch`). Returns the queue and the rows this process
    recorded."""
    (pred.out_dir / WORK_DIR).mkdir(exist_ok=True)
    queue = WorkQueue(queue_url, run_key(pred.out_dir, info, pred.settings), lease_s=lease_s,
                      worker=Worker.this_process(rank), largest_first=largest_first)
    try:
        return queue, _drain_targets(pred, queue, targets, lengths, info, rank=rank,
                                     progress=progress, prefetch_workers=prefetch_workers,
                                     lookahead=lookahead)
    except BaseException:
        queue.close()            # the caller closes it only when it is returned
        raise


def _drain_targets(pred, queue: WorkQueue, targets: list, lengths: list, info: dict, *,
                   rank: int, progress: bool, prefetch_workers: int, lookahead: int) -> list:
    """Join `queue` with every target and predict claimed ones until none is left; the rows
    this process recorded."""
    queue.join([WorkItem(t.index, t.target_id, target_cost(lengths[t.index])) for t in targets],
               label=str(pred.out_dir))
    prefetch = FeaturePrefetcher(pred, targets, info, prefetch_workers) \
        if prefetch_workers > 0 else None

    def work(item: WorkItem) -> tuple[dict, bool]:
        if prefetch is not None:
            prefetch.take(item.idx)
        try:
            row = pred.predict_target(targets[item.idx], info)
        except FileExistsError:
            # another process published this prediction meanwhile (our lease ran out while
            # we were stalled): take its folder as it is (finished, or pending: completed)
            row = pred.predict_target(targets[item.idx], info)
        # the row as its JSON round trip, the form every process reads back from the queue
        return json_plain(row), row["status"] == "rejected"

    try:
        with RunProgress(queue, "predict", enabled=progress and rank == 0):
            mine = drain(queue, work, lookahead=lookahead if prefetch is not None else 0,
                         on_claim=None if prefetch is None else
                         (lambda item: prefetch.submit(item.idx)))
    finally:
        if prefetch is not None:
            prefetch.close()
    return [row for _, row in mine]

