"""`make demo`: the main job end to end on the real data in ../shared/data.

1. build the HDF5 family store from PAIRS.tsv (parse, clean, pack; rejects reported)
2. print the per-rank sharding summary for 2 data-parallel ranks
3. pretrain the small model on 2 CPU ranks (torchrun, --overlap-grad-reduce,
   --use-distributed-optimizer), printing the step-time breakdown and train/val lDDT
4. predict the held-out chains, route them through the confidence gate, enqueue the flagged
   ones in the SQLite review queue, and print the command that opens the review UI

Environment: PROTDP_DATA (data corpus), PROTDP_DEMO_OUT (default demo_out/),
PROTDP_DEMO_ITERS (training iterations; default from configs/train/demo.yaml).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from protdp.data.sampler import sharding_summary  # noqa: E402
from protdp.data.store import FamilyStore, build_store  # noqa: E402
from protdp.errors import ProtdpError  # noqa: E402
from protdp.inference.predictor import chains_from_pairs, predict_chains  # noqa: E402
from protdp.paths import data_root  # noqa: E402
from protdp.train.args import parse_args  # noqa: E402
from protdp.train.launch import demo_train_argv, run_demo_training  # noqa: E402
from protdp.train.trainer import split_families  # noqa: E402

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
                         config=REPO / "configs" / "data" / "default.yaml")
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

    banner("4/4 predict the held-out chains through the confidence gate")
    chains = chains_from_pairs(held_out_ids(store_path, demo_train_argv(store_path, run_dir, iters)))
    queue_url = f"sqlite:///{out / 'review_queue.sqlite'}"
    pred = predict_chains(run_dir, chains, out / "predictions", queue_url=queue_url)
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
