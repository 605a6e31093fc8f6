"""`make demo`: the main job end to end on the real data in ../shared/data.

1. build the HDF5 family store from PAIRS.tsv (parse, clean, pack; rejects reported)
2. print the per-rank sharding summary for 2 data-parallel ranks
3. pretrain the small model on 2 CPU ranks (torchrun, --overlap-grad-reduce,
   --use-distributed-optimizer), printing the step-time breakdown and train/val lDDT
   and the release record of the final checkpoint (calibration, red-team, screening);
4. predict the held-out chains, route them through the confidence gate, enqueue the flagged
   ones in the SQLite review queue, and print the command that opens the review UI

Environment: PROTDP_DATA (data corpus), PROTDP_DEMO_OUT (default demo_out/),
PROTDP_DEMO_ITERS (training iterations; default from configs/train/demo.yaml).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from protdp.data.parse import merge_msas, parse_msa  # noqa: E402
from protdp.data.sampler import sharding_summary  # noqa: E402
from protdp.data.store import FamilyStore, build_store  # noqa: E402
from protdp.errors import InputError, ProtdpError  # noqa: E402
from protdp.gating import GatePolicy  # noqa: E402
from protdp.inference.predictor import PredictConfig, RunResult  # noqa: E402
from protdp.inference.writers import safe_name  # noqa: E402
from protdp.paths import data_root  # noqa: E402
from protdp.resources import config_file  # noqa: E402
from protdp.safety.release import check_line  # noqa: E402
from protdp.train.args import parse_args  # noqa: E402
from protdp.train.checkpointing import checkpoint_digest, latest_checkpoint  # noqa: E402
from protdp.train.launch import torchrun_cmd, worker_env  # noqa: E402
from protdp.train.release_record import RELEASE_FILE, read_release  # noqa: E402
from protdp.train.trainer import split_families  # noqa: E402
from protdp.workflows import predict, review_commands  # noqa: E402


def demo_train_argv(store: str | Path, out_dir: str | Path, train_iters: int | None = None
                    ) -> list[str]:
    """The demo's flags: small model, 2 CPU ranks, overlap + distributed optimizer
    (iterations from configs/train/demo.yaml unless `train_iters` is given)."""
    argv = ["--config", str(config_file("train/demo.yaml")), "--data", str(store),
            "--save", str(out_dir), "--load", str(out_dir)]
    return argv + (["--train-iters", str(train_iters)] if train_iters else [])


def run_demo_training(store: str | Path, out_dir: str | Path, train_iters: int | None = None,
                      nproc: int = 2) -> int:
    """What `make demo` runs after building the store: torchrun on `python -m protdp.train`."""
    cmd = torchrun_cmd(demo_train_argv(store, out_dir, train_iters), nproc=nproc, max_restarts=2)
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=worker_env(), cwd=REPO).returncode


@dataclass
class DemoPrediction:
    counts: dict             # {"accepted": n, "needs_review": n, "rejected": n}
    review_command: str      # what to run to open the review UI on these predictions
    summary_path: Path
    queue_url: str
    result: RunResult


def chains_from_pairs(pair_ids: Sequence[str], pairs_tsv: str | Path | None = None
                      ) -> list[tuple[str, str, list[Path]]]:
    """(pair_id, sequence, MSA files) for families of the data corpus's PAIRS.tsv (e.g. the
    demo's held-out families); the sequence is the merged MSA query, as the data store uses."""
    pairs_tsv = Path(pairs_tsv) if pairs_tsv else data_root() / "PAIRS.tsv"
    files: dict[str, list[Path]] = {}
    with open(pairs_tsv, newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            files.setdefault(row["pair_id"], []).append(pairs_tsv.parent / row["msa_file"])
    missing = [p for p in pair_ids if p not in files]
    if missing:
        raise InputError(f"pair id(s) {missing} not in {pairs_tsv}", path=pairs_tsv)
    out = []
    for pid in pair_ids:
        msas = [parse_msa(f) for f in files[pid]]
        out.append((pid, merge_msas(msas).query, files[pid]))
    return out


def predict_chains(checkpoint: str | Path, chains: Sequence[tuple], out_dir: str | Path, *,
                   queue_url: str | None = None, gating: str | Path | GatePolicy | None = None,
                   screening: str | Path | None = None, config: PredictConfig | None = None,
                   progress: bool = True, release_gate: str = "enforce") -> DemoPrediction:
    """Predict `(target_id, sequence, msa)` chains, `msa` a path, a list of paths (merged) or
    None (e.g. `chains_from_pairs(held_out_ids)`): writes `out_dir/inputs/targets.fasta`,
    links the MSAs into `out_dir/inputs/msa/`, runs `predict`, and returns the route counts
    and the command that opens the review UI on the flagged predictions."""
    out_dir = Path(out_dir).resolve()
    msa_dir = out_dir / "inputs" / "msa"
    shutil.rmtree(msa_dir, ignore_errors=True)
    msa_dir.mkdir(parents=True)
    lines = []
    for target_id, sequence, msa in chains:
        lines += [f">{target_id}", sequence]
        if msa is None:
            continue
        paths = [Path(m).resolve() for m in ([msa] if isinstance(msa, (str, Path)) else msa)]
        folder = msa_dir / safe_name(target_id)
        folder.mkdir()
        for i, src in enumerate(paths):   # links, never copies of the data corpus
            (folder / f"{i:02d}_{src.stem}{src.suffix.lower()}").symlink_to(src)
    fasta = out_dir / "inputs" / "targets.fasta"
    fasta.write_text("\n".join(lines) + "\n")
    result = predict(checkpoint, fasta, out_dir, msa_dir=msa_dir, config=config, gating=gating,
                     release_gate=release_gate,
                     screening=screening, queue_url=queue_url, progress=progress)
    return DemoPrediction(result.counts, review_commands(result.queue_url), result.summary_path,
                          result.queue_url, result)


def show_release_record(run_dir: Path) -> bool:
    """Print the release record the trainer's release check wrote for the final checkpoint;
    True when it may serve predictions."""
    ckpt = latest_checkpoint(run_dir)
    record = ckpt / RELEASE_FILE if ckpt else None
    if record is None or not record.is_file():
        print(f"no release record for {ckpt} (see its release.log)")
        return False
    doc = json.loads(record.read_text())
    print(f"release record {record}:")
    for c in doc["checks"]:
        print("  " + check_line(c))
    status = read_release(ckpt, checkpoint_digest(ckpt))     # what `protdp predict` will decide
    print(f"  verdict: {doc['verdict']}" + ("" if status.released else f" ({status.reason})"))
    return status.released


def banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)), flush=True)


def held_out_ids(store_path: Path, train_argv: list[str]) -> list[str]:
    """Family ids the trainer held out for validation (same split as the training run)."""
    return split_families(list(FamilyStore(store_path).family_ids), parse_args(train_argv))[1]


def main() -> int:
    out = Path(os.environ.get("PROTDP_DEMO_OUT", REPO / "demo_out")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    store_path = out / "data.h5"
    run_dir = out / "run"
    t0 = time.time()

    banner("1/4 build the HDF5 store from real MSAs + structures")
    report = build_store(store_path, pairs=data_root() / "PAIRS.tsv", workers=2,
                         config=config_file("data/default.yaml"))
    print(report.summary())

    banner("2/4 family sharding across 2 data-parallel ranks")
    print(sharding_summary(store_path, world_size=2, crop_size=64))

    banner("3/4 pretrain the small model: torchrun, 2 CPU ranks, overlap + distributed optimizer")
    iters = int(os.environ.get("PROTDP_DEMO_ITERS", "0")) or None
    # a fresh run each time (resume is `--load`); its predictions and queue start empty too
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out / "predictions", ignore_errors=True)
    for f in out.glob("review_queue.sqlite*"):          # the database and its WAL files
        f.unlink()
    rc = run_demo_training(store_path, run_dir, train_iters=iters)
    if rc != 0:
        print(f"demo: training failed with exit code {rc}", file=sys.stderr)
        return rc
    print(f"plots: protdp report {run_dir}")
    released = show_release_record(run_dir)

    banner("4/4 predict the held-out chains through the confidence gate")
    chains = chains_from_pairs(held_out_ids(store_path, demo_train_argv(store_path, run_dir, iters)))
    queue_url = f"sqlite:///{out / 'review_queue.sqlite'}"
    if not released:
        print("the demo checkpoint is not released: predicting with --allow-unreleased, so every "
              "prediction goes to human review (reason unreleased_checkpoint)")
    pred = predict_chains(run_dir, chains, out / "predictions", queue_url=queue_url,
                          release_gate="enforce" if released else "review")
    c = pred.counts
    print(f"held-out chains: {len(chains)}  accepted: {c.get('accepted', 0)}  "
          f"sent to review: {c.get('needs_review', 0)}  rejected: {c.get('rejected', 0)}")
    print(f"summary: {pred.summary_path}")
    print("open the review UI:\n" + pred.review_command)
    print(f"\ndemo finished in {time.time() - t0:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ProtdpError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        sys.exit(2)
