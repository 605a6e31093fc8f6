"""A straggler and a poisonous family in a 2-rank training feed: the ordered feed (today's
behaviour, the baseline) vs the tolerant feed with per-family deadlines (issue 44), in the same
script; results in benchmarks/results/loader_tail.json.

Two ranks (processes, gloo) each run `BatchFeed` on their shard of a synthetic store (CPU path:
workers featurize, the ready thread collates) and a stand-in accelerator step: `sleep(step)`
(no host CPU) then an all-reduce, the collective that couples the ranks as a gradient
reduction does, so the slowest rank sets every step. The faults come from the explicit test
hook (`protdp.data.pipeline.faults`, PROTDP_DATA_FAULTS): featurizing one family of rank 0
takes 100x its own time (`times_slower`: it sleeps 99x its real featurize time after it, so the
factor holds under any machine load), one family of rank 1 kills its worker (SIGKILL, as the OOM killer). The baseline feed waits for the straggler on
every rank and ends at the dead worker (WorkerError); the tolerant feed sets both aside,
replaces them and writes quarantine.jsonl.

Reported per mode: max and median step time (the slowest rank's, warm-up step excluded), their
ratio, data wait p50/p99 per step (both ranks' steps), the quarantine records, how the run
ended. The deadline is configured for the benchmark's small families (floor
`--deadline-floor`, multiple 10 x the running median: the production default floor of 30 s is
for AF2-sized featurization).

A step is hidden from a straggler when the prefetch covers the deadline and the replacement:
prefetch_depth x step >= deadline + one featurization; the deadline (10 x the running median)
is then the whole cost of a straggler, paid off the critical path.

    python benchmarks/loader_tail.py [--steps 36] [--step 2.0] [--workers 2] [--depth 8]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KW = dict(crop_size=128, max_msa_rows=64, max_extra_msa_rows=256, msa_samples=1, training=True)
FAMILIES, ROWS, LENGTH = 48, 5000, 256
SLOW_FACTOR = 100.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(args) -> None:
    """One rank: feed + stand-in step + all-reduce per step; writes its timings as JSON."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from protdp.data.pipeline.quarantine import DeadlinePolicy
    from protdp.data.sampler import FamilySampler
    from protdp.data.store import FamilyStore
    from protdp.train.feed import BatchFeed
    from protdp.train.sources import PDB, Source

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=2, timeout=timedelta(seconds=60))
    store = FamilyStore(args.store)
    sources = {PDB: Source(PDB, store, FamilySampler(store, 2, args.rank, 1, seed=0,
                                                     crop_size=KW["crop_size"]))}
    deadline = (DeadlinePolicy(floor_s=args.deadline_floor) if args.mode == "quarantine"
                else None)
    feed = BatchFeed(sources=sources, seed_of=lambda it, m: 1000 * it + args.rank,
                     source_of=lambda s: sources[PDB], example_seed=lambda s, k: s + k,
                     kwargs=KW, start_iteration=0, num_micro=1, device=torch.device("cpu"),
                     workers=args.workers, prefetch_depth=args.depth, timeout=600,
                     deadline=deadline, rank=args.rank, run_dir=args.run_dir)
    waits, steps, ended = [], [], "completed"
    flag = torch.zeros(1)
    try:
        for it in range(args.steps):
            t0 = time.perf_counter()
            _, fids, batch = feed.next(it, 0)
            waits.append(time.perf_counter() - t0)
            del batch
            time.sleep(args.step)                          # the accelerator's step
            dist.all_reduce(flag)                          # the gradient reduction's coupling
            steps.append(time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - the baseline ends here: recorded, not raised
        ended = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        feed.close()
    Path(args.out).write_text(json.dumps({"rank": args.rank, "waits": waits, "steps": steps,
                                          "ended": ended}))
    os._exit(0)          # a peer may be gone (baseline): no process-group teardown to hang in


def median_featurize_s(store_path: str) -> float:
    from protdp.data.features import featurize
    from protdp.data.store import FamilyStore

    store = FamilyStore(store_path)
    times = []
    for f in store.family_ids[:8]:
        fam = store.read(f)
        t0 = time.perf_counter()
        featurize(fam, seed=0, **KW)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pick_faulty(store_path: str, steps: int) -> tuple[str, str]:
    """(a family of rank 0 served at step ~steps/4, one of rank 1 served at ~steps/2)."""
    from protdp.data.sampler import FamilySampler
    from protdp.data.store import FamilyStore

    store = FamilyStore(store_path)
    plans = [FamilySampler(store, 2, r, 1, seed=0, crop_size=KW["crop_size"]).rank_plan()
             for r in (0, 1)]
    return plans[0][max(2, steps // 4)][0], plans[1][max(4, steps // 2)][0]


def run_mode(mode: str, args, store: str, tmp: Path, env: dict) -> dict:
    run_dir = tmp / mode
    run_dir.mkdir()
    port, procs = _free_port(), []
    for rank in (0, 1):
        cmd = [sys.executable, __file__, "--rank", str(rank), "--mode", mode, "--store", store,
               "--run-dir", str(run_dir), "--out", str(run_dir / f"rank{rank}.json"),
               "--steps", str(args.steps), "--step", str(args.step), "--workers",
               str(args.workers), "--depth", str(args.depth), "--deadline-floor",
               str(args.deadline_floor)]
        procs.append(subprocess.Popen(cmd, env={**env, "MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": str(port)}, cwd=REPO))
    for p in procs:
        p.wait(timeout=1800)
    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    n = min(len(r["steps"]) for r in ranks)
    step = [max(r["steps"][i] for r in ranks) for i in range(1, n)]     # warm-up excluded
    waits = sorted(w for r in ranks for w in r["waits"][1:n])
    pct = lambda p: waits[min(len(waits) - 1, int(round(p / 100 * (len(waits) - 1))))] if waits else None  # noqa: E731
    records = [json.loads(x) for x in (run_dir / "quarantine.jsonl").read_text().splitlines()] \
        if (run_dir / "quarantine.jsonl").exists() else []
    med = statistics.median(step) if step else None
    return {"steps_completed": n, "ended": [r["ended"] for r in ranks],
            "median_step_s": med, "max_step_s": max(step) if step else None,
            "max_step_over_median": max(step) / med if step else None,
            "data_wait_p50": pct(50), "data_wait_p99": pct(99),
            "per_step_s": [round(s, 3) for s in step], "records": records}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=36)
    ap.add_argument("--step", type=float, default=2.0, help="stand-in accelerator step, s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--deadline-floor", type=float, default=2.0)
    ap.add_argument("--modes", default="baseline,quarantine")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/loader_tail.json"))
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args)
        return 0
    sys.path.insert(0, str(HERE))
    import loader

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = str(tmp / "tail.h5")
        loader.build_store(Path(store), [loader.synthetic_family(ROWS, LENGTH, s)
                                         for s in range(FAMILIES)])
        median = median_featurize_s(store)
        slow, killer = pick_faulty(store, args.steps)
        spec = {slow: {"times_slower": SLOW_FACTOR}, killer: {"kill": True}}
        (tmp / "faults.json").write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "PROTDP_DATA_FAULTS": str(tmp / "faults.json")}
        result = {"benchmark": "loader_tail", "steps": args.steps, "stand_in_step_s": args.step,
                  "workers_per_rank": args.workers, "prefetch_depth": args.depth,
                  "families": f"{FAMILIES} x {ROWS} rows x {LENGTH}", "featurize": KW,
                  "median_featurize_s_unloaded": median, "slow_family": slow,
                  "slow_family_times_slower": SLOW_FACTOR, "killing_family": killer,
                  "deadline": {"floor_s": args.deadline_floor, "multiple": 10.0}}
        for mode in args.modes.split(","):
            result[mode] = run_mode(mode, args, store, tmp, env)
            print(mode, json.dumps({k: v for k, v in result[mode].items()
                                    if k not in ("records", "per_step_s")}),
                  len(result[mode]["records"]), "records", flush=True)
    result["machine"] = {"cpus": os.cpu_count(), "load_avg_1m_end": os.getloadavg()[0]}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("->", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
