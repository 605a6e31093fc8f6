"""CPU-device feed, this tree vs a baseline tree, side by side (issue 27 D5 (b) on the CPU path),
results in benchmarks/results/loader_cpu_feed.json.

Each configuration (workers, stand-in step) runs `loader.feed_run` (CPU path: workers run
featurize + collate; the training thread takes the batch with `feed.next`, then the step reads
its pages and sleeps like an accelerator) once with the baseline's `protdp` on the path and
once with this tree's, alternating, so both see the same machine load. The baseline source is
extracted with `git archive REV` into a temporary folder.

    python benchmarks/loader_cpu_feed.py [--baseline-rev REV] [--steps 12] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONFIGS = [(1, 0.5), (2, 0.5), (1, 1.0), (2, 1.0), (1, 4.0)]   # 4 s: every batch is ready


def child(args) -> None:
    """One configuration with the `protdp` on sys.path; prints one JSON line."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    import loader

    with tempfile.TemporaryDirectory() as tmp:
        fams = [loader.synthetic_family(args.rows, 384, s) for s in range(6)]
        store = Path(tmp) / "feed.h5"
        loader.build_store(store, fams)
        r = loader.feed_run(store, workers=args.workers, depth=2 * args.workers,
                            step_s=args.step, steps=args.steps, compact=False)
    import protdp
    r["protdp"] = str(Path(protdp.__file__).parent.parent)
    print("RESULT " + json.dumps(r), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline-rev", default="9ac1599")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--configs", default=None, help="W:STEP,... (default: all of CONFIGS)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/loader_cpu_feed.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--step", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    configs = ([(int(w), float(t)) for w, t in (c.split(":") for c in args.configs.split(","))]
               if args.configs else CONFIGS)
    runs = []
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "archive", args.baseline_rev], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        for rnd in range(args.rounds):
            for workers, step in configs:
                for tree, path in (("baseline", base), ("this tree", str(REPO))):
                    env = {**os.environ, "PYTHONPATH": path}
                    out = subprocess.run([sys.executable, __file__, "--child", "--rows", str(args.rows),
                                          "--steps", str(args.steps), "--workers", str(workers),
                                          "--step", str(step)], env=env, capture_output=True,
                                         text=True, cwd=path)
                    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
                    if not line:
                        print(out.stderr[-2000:], file=sys.stderr)
                        return 1
                    r = {"tree": tree, "round": rnd, **json.loads(line[0][7:])}
                    print(json.dumps({k: v for k, v in r.items() if k not in ("per_step_s", "families")}),
                          flush=True)
                    runs.append(r)
    summary = {}
    for workers, step in configs:
        for tree in ("baseline", "this tree"):
            sel = [r for r in runs if r["tree"] == tree and r["workers"] == workers
                   and r["stand_in_step_s"] == step]
            summary[f"{tree}, {workers} worker(s), {step} s step"] = {
                "data_wait_fraction": [round(r["data_wait_fraction"], 4) for r in sel],
                "mean_data_wait_ms": [round(1000 * r["mean_data_wait_s"], 1) for r in sel],
                "mean_data_wait_thread_cpu_ms": [round(1000 * r["mean_data_wait_thread_cpu_s"], 1)
                                                 for r in sel],
                "mean_step_s": [round(r["mean_step_s"], 3) for r in sel],
                "mean_first_touch_ms": [round(1000 * r["mean_first_touch_s"], 1) for r in sel],
                "load_avg_1m": [round(r["load_avg_1m"], 1) for r in sel]}
    result = {"benchmark": "loader_cpu_feed", "baseline_rev": args.baseline_rev,
              "family": f"{args.rows}x384", "summary": summary, "runs": runs,
              "machine": {"cpus": os.cpu_count(), "load_avg_1m_end": os.getloadavg()[0]}}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("->", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
