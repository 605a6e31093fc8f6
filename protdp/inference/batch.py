"""Batch prediction: every target of a FASTA / folder / CSV, claimed from the run's leased work
queue (`protdp.inference.work`) by every process of the run and predicted by one `Predictor`;
summary.tsv / summary.csv / summary.json are written from the queue once every target is final
(issue 30: a failed target is a row, the rest go on; issue 45: each target exactly once,
whatever process dies when)."""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from protdp.data.screening import ScreeningList
from protdp.errors import ConfigError, InputError
from protdp.gating import ROUTES, GatePolicy, load_gate_policy
from protdp.inference.checkpoint import LoadedModel, load_model_checkpoint
from protdp.inference.claimed_search import ClaimedSearch, SearchingPredictor
from protdp.inference.complexes import read_complex_targets
from protdp.inference.predictor import (CLINICAL_NOTICE, PARTS_DIR, PredictConfig, Predictor,
                                        ReviewSink, RunResult)
from protdp.inference.af_outputs import write_summary_csv
from protdp.inference.work import WORK_DIR, default_queue_url, predict_queued
from protdp.inference.writers import write_json, write_summary
from protdp.workqueue import DEFAULT_LEASE_S, WorkQueue

SUMMARY_LOCK = "summary.lock"


def _counts(rows: list[dict]) -> dict:
    return {r: sum(1 for row in rows if row["route"] == r) for r in ROUTES}


def predict_batch(checkpoint: str | Path | LoadedModel | list, fasta: str | Path,
                  out_dir: str | Path, *,
                  sink: ReviewSink | None = None, msa_dir: str | Path | None = None,
                  config: PredictConfig | None = None,
                  gating: str | Path | GatePolicy | None = None,
                  screening: str | Path | None = None, rank: int = 0, world_size: int = 1,
                  barrier: Callable[[], None] | None = None,
                  device: str | torch.device | None = None, progress: bool = True,
                  msa_search: dict | None = None, release_gate: str = "enforce",
                  sort_by_length: bool = False, templates: tuple[str, ...] = (),
                  work_queue_url: str | None = None, lease_s: float = DEFAULT_LEASE_S,
                  prefetch_workers: int = 0,
                  claimed_search: ClaimedSearch | None = None) -> RunResult:
    """Predict every target of `fasta` (a FASTA file, a folder of FASTA/a3m files or a CSV,
    see `inputs`) claimed by this process from the run's work queue (`work_queue_url`, default
    `work.default_queue_url`; leases of `lease_s`), flagged ones handed to `sink`; the
    summary is written from the queue when every target is final (`barrier()`, when given, is
    called before: DAP followers are released by it). `checkpoint`: one checkpoint or a list
    (an ensemble, AlphaFold's model_1..5). Targets are claimed costliest first (length^2,
    `sharding`), shortest first when `sort_by_length`; `prefetch_workers` processes prepare
    the next target's MSA and features meanwhile (`prefetch`); with `claimed_search` (--db)
    each claimed target without an MSA is searched first (`claimed_search`). `release_gate`: "enforce" (an unreleased checkpoint is refused),
    "review" (it runs, every prediction to review) or "off" (evaluation tools only)."""
    from protdp.inference.inputs import read_inputs
    from protdp.inference.sharding import target_lengths

    fasta = Path(fasta)
    if msa_dir is not None and not Path(msa_dir).is_dir():
        raise InputError("MSA directory not found", path=msa_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ckpts = checkpoint if isinstance(checkpoint, (list, tuple)) else [checkpoint]
    loaded = [c if isinstance(c, LoadedModel) else load_model_checkpoint(c, device=device)
              for c in ckpts]
    # a multimer checkpoint reads the input as complexes (issue 32), a monomer one as chains
    targets, input_sha = (read_complex_targets if loaded[0].is_multimer else read_inputs)(fasta)
    screen = ScreeningList.from_fasta(screening) if screening else None
    parts_link = Path(out_dir).resolve() / PARTS_DIR
    if parts_link.is_symlink():              # never written through a planted link
        raise ConfigError(f"{parts_link} is a symbolic link; protdp never writes through a "
                          "link in its output folder: remove it")
    kw = dict(config=config, policy=load_gate_policy(gating), screening=screen,
              screening_path=screening, sink=sink, device=device, rank=rank,
              world_size=world_size, msa_search=msa_search, templates=tuple(templates))
    pred = (Predictor(loaded, out_dir, release_gate=release_gate, **kw)
            if claimed_search is None else   # --db: a Predictor searching what it claims
            SearchingPredictor(loaded, out_dir, release_gate=release_gate,
                               claimed_search=claimed_search, **kw))
    info = {"path": str(fasta.resolve()), "sha256": input_sha,
            "msa_dir": None if msa_dir is None else Path(msa_dir).resolve()}
    lengths = target_lengths(targets)
    url = default_queue_url(pred.out_dir, work_queue_url)
    try:
        queue, mine = predict_queued(pred, targets, lengths, info, queue_url=url, rank=rank,
                                     lease_s=lease_s, largest_first=not sort_by_length,
                                     progress=progress, prefetch_workers=prefetch_workers)
    finally:
        pred.close()
    try:
        if barrier is not None:
            barrier()
        rows, summary_path = queue.results(), None
        if rows is None:   # a later process restarted the finished run: it writes the summary
            rows = sorted(mine, key=lambda r: r["index"])
        else:
            summary_path = write_run_summary(pred.out_dir, queue, rows, {
                "counts": _counts(rows), "queue_url": pred.sink.display,
                "notice": CLINICAL_NOTICE})
    finally:
        queue.close()
    return RunResult(pred.out_dir, rows, pred.sink.display, summary_path, _counts(rows),
                     sum(1 for r in rows if r["status"] == "skipped"))


@contextmanager
def _summary_lock(out_dir: Path):
    with open(out_dir / WORK_DIR / SUMMARY_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_run_summary(out_dir: Path, queue: WorkQueue, rows: list[dict], extra: dict) -> Path:
    """summary.tsv / .csv / .json of a finished run, once per generation (the first process
    to get here writes; the others find it written)."""
    stamp = {"run_key": queue.run_key, "generation": queue.results_generation}   # the rows' own
    with _summary_lock(out_dir):
        try:
            done = json.loads((out_dir / "summary.json").read_text()).get("run") == stamp
        except (OSError, ValueError, AttributeError):
            done = False
        if not done:
            write_summary(out_dir / "summary.tsv", rows)
            write_summary_csv(out_dir / "summary.csv", rows)
            write_json(out_dir / "summary.json", {**extra, "rows": rows, "run": stamp})
    return out_dir / "summary.tsv"
