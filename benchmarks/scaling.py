"""Scaling check: speed-up and efficiency vs one rank at dp 1, 2 (, 4, ...), with and without
overlap, in one run (issue 22, item 6; 1 intra-op thread per rank).

Megatron's advice: start from pure data parallelism, enable --overlap-grad-reduce step by step and
verify near-linear speed-up before adding anything else. Weak scaling keeps the per-rank work
fixed (micro-batch 1, no accumulation, global batch = dp), so ideal throughput is dp x that of
one rank: speed-up = samples/s(dp) / samples/s(1), efficiency = speed-up / dp. At every dp > 1
four engine configurations run (gradient all-reduce or distributed optimizer, each with and
without --overlap-grad-reduce), and `protdp preflight` predicts the same efficiency beforehand
(`--no-preflight` skips it), so the table shows prediction next to measurement. Each run is a real
`torchrun -m protdp.train` on the small model; numbers come from its metrics.jsonl (first
iterations dropped as warm-up). Work per sample is equal across runs: every family of the default
store fills the crop and the MSA rows, and the number of recycles of micro-batch m of step i
comes from (seed, i, m), identical at every dp.

dp values: `--dps`, by default 1, 2 and further powers of two while they fit the cores (ranks
beyond the cores would measure the oversubscription, not the engine). On this 2-core shared
machine that is dp 1 and 2, with the ranks' compute and gloo's threads on the same cores (see
benchmarks/netsim.sh for a simulated network); the ratios are what the run measured.

    .venv/bin/python benchmarks/scaling.py [--data data.h5] [--dps 1 2 4] [--iters 16]
        [--repeats 2] [--no-preflight] [--out benchmarks/results/scaling.json]

Each configuration runs `--repeats` times, round-robin, and the best run is reported (all repeats
are kept in the JSON): other jobs on a shared machine only ever slow a run down.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from protdp.train.launch import torchrun_cmd, worker_env  # noqa: E402
from protdp.train.report import read_metrics  # noqa: E402

# The small model has 178k parameters: Megatron's default bucket (40M elements) would make one
# bucket that can only be reduced after the whole backward, so overlap could not differ from no
# overlap. 25k-element buckets (~8 buckets) let reductions start during backward.
BUCKET = "25000"
ENGINE_CONFIGS = {  # name -> (trainer flags, the preflight's name for the same configuration)
    "overlap_allreduce": (["--overlap-grad-reduce", "--no-use-distributed-optimizer"], "overlap"),
    "no_overlap_allreduce": (["--no-overlap-grad-reduce", "--no-use-distributed-optimizer"],
                             "no_overlap"),
    "overlap_distopt": (["--overlap-grad-reduce", "--use-distributed-optimizer"],
                        "distributed_optimizer"),
    "no_overlap_distopt": (["--no-overlap-grad-reduce", "--use-distributed-optimizer"], None),
}


def runs_to_make(dps: list[int]) -> list[tuple[str, int, list[str]]]:
    """(name, dp, flags): dp 1 once (nothing to overlap), every engine config at each dp > 1."""
    out = [("dp1", 1, ["--overlap-grad-reduce", "--use-distributed-optimizer"])]
    for dp in dps:
        if dp > 1:
            out += [(f"dp{dp}_{name}", dp, flags) for name, (flags, _) in ENGINE_CONFIGS.items()]
    return out


def run_config(name: str, dp: int, extra: list[str], args, work: Path) -> dict:
    run_dir = work / name
    argv = ["--data", str(args.data), "--model-config", args.model_config,
            "--crop-size", str(args.crop_size), "--max-msa-rows", str(args.max_msa_rows),
            "--micro-batch-size", "1", "--global-batch-size", str(dp), "--data-parallel-size", str(dp),
            "--train-iters", str(args.iters), "--eval-iters", "0", "--eval-interval", str(10 ** 6),
            "--log-interval", str(args.iters), "--log-dir", str(run_dir), "--wandb-mode", "disabled",
            "--no-progress-bar", "--val-fraction", "0", "--seed", "7", "--bucket-size", BUCKET,
            *extra]
    t0 = time.time()
    proc = subprocess.run(torchrun_cmd(argv, nproc=dp), env=worker_env(threads=1), cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{name}: run failed with exit code {proc.returncode}")
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    steady = train[args.warmup:]
    step = sum(r["time/step"] for r in steady)
    res = {
        "dp": dp, "flags": extra, "iterations_measured": len(steady), "wall_s": round(time.time() - t0, 1),
        "samples_per_s": sum(r["samples"] for r in steady) / step,
        "mean_step_s": step / len(steady),
        "residues_per_s": sum(r["residues"] for r in steady) / step,
        "median_step_s": statistics.median(r["time/step"] for r in steady),
        "exposed_comm_fraction": sum(r["time/exposed_comm"] for r in steady) / sum(r["time/step_mean"] for r in steady),
    }
    for phase in ("data_wait", "forward", "backward", "exposed_comm", "optimizer"):
        res[f"mean_{phase}_s"] = statistics.fmean(r[f"time/{phase}"] for r in steady)
    print(f"{name:<26} dp={dp} {res['samples_per_s']:.3f} samples/s  step "
          f"{1000 * res['median_step_s']:.0f} ms  exposed comm "
          f"{100 * res['exposed_comm_fraction']:.1f}%", flush=True)
    return res


def preflight(dp: int, args, work: Path) -> dict | None:
    """`protdp preflight` at `dp` with the runs' model, crop and buckets: predicted efficiency."""
    out = work / f"preflight_dp{dp}.json"
    cmd = [sys.executable, "-m", "protdp.cli", "preflight", "--model-config", args.model_config,
           "--dp", str(dp), "--crop-size", str(args.crop_size), "--max-msa-rows",
           str(args.max_msa_rows), "--bucket-size", BUCKET, "--reps", "3", "--out", str(out)]
    proc = subprocess.run(cmd, env=worker_env(threads=1), cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
        raise SystemExit(f"preflight at dp {dp} failed with exit code {proc.returncode}")
    rep = json.loads(out.read_text())
    return {"verdict": rep["verdict"]["verdict"],
            "efficiency": {name: rep["predictions"]["configs"][pf]["scaling_efficiency"]
                           for name, (_, pf) in ENGINE_CONFIGS.items() if pf is not None}}


def uniform_store(out_dir: Path, crop_size: int, msa_rows: int) -> Path:
    """A store of the real families (../shared/data/PAIRS.tsv) with >= crop_size observed
    residues and >= msa_rows MSA rows, so every sample costs the same: samples/s at every dp
    then compare equal work (with mixed lengths the runs draw different families)."""
    import csv

    from protdp.data.store import build_store
    from protdp.paths import data_root

    root = data_root()
    rows = list(csv.DictReader(open(root / "PAIRS.tsv"), delimiter="\t"))
    depth: dict[str, int] = {}
    for r in rows:
        depth[r["pair_id"]] = max(depth.get(r["pair_id"], 0), int(r["msa_depth"]))
    keep = [r for r in rows if int(r["observed_residues"]) >= crop_size and depth[r["pair_id"]] >= msa_rows]
    pairs = out_dir / "pairs.tsv"
    with open(pairs, "w") as fh:
        fh.write("pair_id\tmsa_file\tstructure_file\tchain\n")
        for r in keep:
            fh.write(f"{r['pair_id']}\t{root / r['msa_file']}\t{root / r['structure_file']}\t{r['chain']}\n")
    build_store(out_dir / "uniform.h5", pairs=pairs, progress=False, workers=2)
    print(f"uniform store: {len({r['pair_id'] for r in keep})} families with >= {crop_size} observed "
          f"residues and >= {msa_rows} MSA rows", flush=True)
    return out_dir / "uniform.h5"


def default_dps() -> list[int]:
    """1, 2 and the further powers of two that fit this machine's cores (one thread per rank)."""
    cores = len(os.sched_getaffinity(0))
    dps, dp = [1, 2], 4
    while dp <= cores:
        dps.append(dp)
        dp *= 2
    return dps


def summarize(results: dict, predicted: dict) -> dict:
    """Speed-up and efficiency vs one rank of every run; the preflight's prediction beside it."""
    one = results["dp1"]["samples_per_s"]
    rows = {}
    for name, res in results.items():
        dp = res["dp"]
        config = name.split("_", 1)[1] if dp > 1 else None
        row = {"dp": dp, "speedup": res["samples_per_s"] / one,
               "efficiency": res["samples_per_s"] / (dp * one),
               "exposed_comm_fraction": res["exposed_comm_fraction"]}
        pred = (predicted.get(dp) or {}).get("efficiency", {}).get(config)
        if pred is not None:
            row["predicted_efficiency"] = pred
        rows[name] = row
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None,
                   help="HDF5 store (default: build one of equal-cost real families, see uniform_store)")
    p.add_argument("--model-config", default="configs/model/small.yaml")
    p.add_argument("--crop-size", type=int, default=64)
    p.add_argument("--max-msa-rows", type=int, default=16)
    p.add_argument("--dps", type=int, nargs="+", default=None,
                   help="data-parallel sizes (default: 1, 2 and powers of two up to the cores)")
    p.add_argument("--iters", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3, help="iterations dropped from the statistics")
    p.add_argument("--repeats", type=int, default=2, help="runs per configuration (best is reported)")
    p.add_argument("--no-preflight", dest="preflight", action="store_false",
                   help="skip the preflight's predicted efficiency")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scaling.json")
    args = p.parse_args(argv)
    dps = sorted(set(args.dps or default_dps()) | {1})
    if dps[0] < 1:
        p.error("--dps: data-parallel sizes must be >= 1")
    load_before = os.getloadavg()
    plan = runs_to_make(dps)
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in plan}
    predicted = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.data is None:
            args.data = uniform_store(Path(tmp), args.crop_size, args.max_msa_rows)
        if args.preflight:
            predicted = {dp: preflight(dp, args, Path(tmp)) for dp in dps if dp > 1}
        for rep in range(args.repeats):  # round-robin, so load from other jobs hits all configs
            for name, dp, extra in plan:
                runs[name].append(run_config(name, dp, extra, args, Path(tmp) / f"r{rep}"))
    # best of the repeats: the least disturbed run of each configuration on a shared machine
    results = {name: {**max(rs, key=lambda r: r["samples_per_s"]),
                      "all_repeats_samples_per_s": [r["samples_per_s"] for r in rs],
                      "all_repeats_exposed_comm_fraction": [r["exposed_comm_fraction"] for r in rs]}
               for name, rs in runs.items()}
    summary = summarize(results, predicted)
    out = {"benchmark": f"weak scaling dp {dps}, small model, 1 thread per rank, with and "
                        "without overlap; preflight-predicted efficiency beside the measured",
           "settings": {k: str(v) for k, v in vars(args).items() if k != "data"},
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_average_before_after": [load_before[0], os.getloadavg()[0]],
                       "note": "shared machine: ranks and gloo threads compete for the same cores"},
           "configs": results, "preflight": {str(k): v for k, v in predicted.items()},
           "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\n{'run':<26}{'dp':>3}{'speed-up':>10}{'efficiency':>12}{'predicted':>11}{'exposed':>9}")
    for name, row in summary.items():
        pred = row.get("predicted_efficiency")
        print(f"{name:<26}{row['dp']:>3}{row['speedup']:>10.2f}{100 * row['efficiency']:>11.0f}%"
              f"{'-' if pred is None else f'{100 * pred:.0f}%':>11}"
              f"{100 * row['exposed_comm_fraction']:>8.1f}%")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
