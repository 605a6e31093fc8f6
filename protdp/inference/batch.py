"""Batch prediction: every target of a FASTA / folder / CSV dealt to this rank, run by one
`Predictor`, then rank 0 merges the per-rank parts into summary.tsv / summary.csv /
summary.json (issue 30: a failed target is a row, the rest go on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from protdp.data.screening import ScreeningList
from protdp.errors import ConfigError, InputError, ProtdpError
from protdp.gating import ROUTES, GatePolicy, load_gate_policy
from protdp.inference.af_outputs import write_summary_csv
from protdp.inference.checkpoint import LoadedModel, load_model_checkpoint
from protdp.inference.complexes import read_complex_targets
from protdp.inference.predictor import (CLINICAL_NOTICE, PARTS_DIR, PredictConfig, Predictor,
                                        ReviewSink, RunResult)
from protdp.inference.writers import write_json, write_summary


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
                  sort_by_length: bool = False, templates: tuple[str, ...] = ()) -> RunResult:
    """Predict every target of `fasta` (a FASTA file, a folder of FASTA/a3m files or a CSV,
    see `inputs`) owned by this rank, flagged ones handed to `sink`; rank 0 merges
    summary.tsv / summary.csv after `barrier()` (pass one when world_size > 1).
    `checkpoint`: one checkpoint or a list (an ensemble, AlphaFold's model_1..5).
    Targets are dealt to ranks by cost (length^2, `sharding`), shortest first when
    `sort_by_length`. `release_gate`: "enforce" (an unreleased checkpoint is refused),
    "review" (it runs, every prediction to review) or "off" (evaluation tools only)."""
    from protdp.inference.inputs import read_inputs
    from protdp.inference.sharding import run_order, shard_by_cost, target_lengths

    fasta = Path(fasta)
    if msa_dir is not None and not Path(msa_dir).is_dir():
        raise InputError("MSA directory not found", path=msa_dir)
    if world_size > 1 and barrier is None:
        raise ConfigError("world_size > 1 needs a barrier to merge the summary")
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
    pred = Predictor(loaded, out_dir, config=config, policy=load_gate_policy(gating),
                     screening=screen, screening_path=screening, sink=sink,
                     device=device, rank=rank, world_size=world_size, msa_search=msa_search,
                     release_gate=release_gate, templates=tuple(templates))
    info = {"path": str(fasta.resolve()), "sha256": input_sha,
            "msa_dir": None if msa_dir is None else Path(msa_dir).resolve()}
    lengths = target_lengths(targets)
    order = run_order(shard_by_cost(lengths, world_size)[rank], lengths, sort_by_length)
    rows = []
    try:
        for i in tqdm(order, desc=f"predict [rank {rank}]" if world_size > 1 else "predict",
                      unit="target", position=rank, disable=not progress, leave=True):
            rows.append(pred.predict_target(targets[i], info))
    finally:
        pred.close()
    parts = pred.out_dir / PARTS_DIR
    parts.mkdir(exist_ok=True)
    part = parts / f"rank{rank:05d}-of-{world_size:05d}.json"
    write_json(part, {"fasta_sha256": info["sha256"], "rows": rows})
    if barrier is not None:
        barrier()
    summary_path = None
    if rank == 0:
        rows = _merge_parts(parts, world_size, info["sha256"], len(targets))
        summary_path = write_summary(pred.out_dir / "summary.tsv", rows)
        write_summary_csv(pred.out_dir / "summary.csv", rows)
        write_json(pred.out_dir / "summary.json", {"counts": _counts(rows), "rows": rows,
                                                   "queue_url": pred.sink.display,
                                                   "notice": CLINICAL_NOTICE})
    return RunResult(pred.out_dir, rows, pred.sink.display, summary_path, _counts(rows),
                     sum(1 for r in rows if r["status"] == "skipped"))


def _merge_parts(parts: Path, world_size: int, fasta_sha: str, n_targets: int) -> list[dict]:
    rows = []
    for r in range(world_size):
        data = json.loads((parts / f"rank{r:05d}-of-{world_size:05d}.json").read_text())
        if data["fasta_sha256"] != fasta_sha:
            raise ProtdpError(f"rank {r} summary part is from another FASTA")
        rows += data["rows"]
    if sorted(r["index"] for r in rows) != list(range(n_targets)):
        raise ProtdpError(f"summary parts cover {len(rows)} of {n_targets} targets")
    return sorted(rows, key=lambda r: r["index"])
