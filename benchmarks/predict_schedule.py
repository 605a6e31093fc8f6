"""The scheduling and seed-batching parts of `predict_throughput.py` (issue 45).

Scheduling (simulated per-target cost, real queue): 200 targets with lengths drawn from a real
proteome (the bacterial proteome the pyhmmer wheel ships, 2100 proteins; else the queries of
the shared data's MSAs), capped at --max-len. A target's cost is c * L^2 (what static dealing
plans with), times a factor it cannot know: a quarter of the targets stop early
(--stop-at-score: 0.2-0.6 of the full cost) and every target varies +-15% (MSA search,
recycles). Two ranks are two processes draining the real work queue (SQLite, leases,
heartbeats) whose work is a sleep of the target's cost; static dealing is the same costs dealt
by `sharding.shard_by_cost` (LPT on L^2), computed exactly (no queue or process overhead,
which favours it). Then the same run with rank 1 killed (SIGKILL) at 50 % done.

Seeds (real model): `--seeds 5` of one L~100 target through configs/model/small.yaml (random
weights), batched (`ensemble.run_ensemble`) vs one seed at a time (a replaced forward never
batches), alternating, median of --repeats, with 1 and 2 torch threads; and the same at L = 8,
where a prediction is nearly all fixed per-call overhead: the most batching can remove, hence
its largest speedup at L~100 (`overhead_bound`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, os, sys, time
from protdp.workqueue import WorkQueue, Worker, WorkItem, drain
url, key, costs_file, rank, lease = sys.argv[1:6]
costs = json.loads(open(costs_file).read())
q = WorkQueue(url, key, lease_s=float(lease), worker=Worker.this_process(int(rank)))
q.join([WorkItem(i, f"t{i}", c["plan"]) for i, c in enumerate(costs)])
print("ready", flush=True)
while not os.path.exists(costs_file + ".go"):    # every rank starts together, as with torchrun
    time.sleep(0.01)
log = []
def work(it):
    t0 = time.time()
    time.sleep(costs[it.idx]["actual"])
    log.append((it.idx, t0, time.time()))
    return {"idx": it.idx, "rank": int(rank)}, False
drain(q, work, on_done=lambda it, r, kept: None, poll_s=0.05)
print(json.dumps(log), flush=True)
"""


def proteome_lengths() -> list[int]:
    """Lengths of a real proteome (pyhmmer's test proteome), else the shared MSAs' queries."""
    try:
        import pyhmmer
        faa = Path(pyhmmer.__file__).parent / "tests" / "data" / "seqs" / \
            "938293.PRJEB85.HG003687.faa"
        lengths, n = [], 0
        for line in faa.read_text().splitlines():
            if line.startswith(">"):
                if n:
                    lengths.append(n)
                n = 0
            else:
                n += len(line.strip())
        return lengths + [n]
    except (ImportError, OSError):
        from protdp.data.parse import parse_msa
        from protdp.paths import data_root
        out = []
        for f in sorted((data_root() / "msa").iterdir()):
            try:
                out.append(len(parse_msa(f).query))
            except Exception:   # noqa: BLE001
                continue
        return out


def make_costs(n: int, max_len: int, total_s: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    lengths = [min(max_len, L) for L in rng.choices(proteome_lengths(), k=n)]
    costs = []
    for L in lengths:
        factor = rng.uniform(0.85, 1.15)
        early = rng.random() < 0.25
        if early:
            factor *= rng.uniform(0.2, 0.6)
        costs.append({"length": L, "plan": L * L, "factor": factor, "early_stop": early})
    scale = total_s / sum(c["plan"] * c["factor"] for c in costs)
    for c in costs:
        c["actual"] = c["plan"] * c["factor"] * scale
    return costs


def static_makespan(costs: list[dict], world: int) -> dict:
    from protdp.inference.sharding import shard_by_cost
    shards = shard_by_cost([c["length"] for c in costs], world)
    busy = [sum(costs[i]["actual"] for i in s) for s in shards]
    return _report(busy, max(busy), costs, world)


def _report(busy: list[float], makespan: float, costs: list[dict], world: int) -> dict:
    total = sum(c["actual"] for c in costs)
    ideal = max(total / world, max(c["actual"] for c in costs))
    return {"makespan_s": round(makespan, 3), "ideal_s": round(ideal, 3),
            "makespan_over_ideal": round(makespan / ideal, 4),
            "busy_fraction": [round(b / makespan, 4) for b in busy],
            "busy_fraction_min": round(min(busy) / makespan, 4)}


def _start(url, key, costs_file, rank, lease):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", WORKER, url, key, str(costs_file), str(rank),
                             str(lease)], env=env, stdout=subprocess.PIPE, text=True)


def queue_run(costs: list[dict], tmp: Path, world: int, lease: float, name: str,
              kill_at: float | None = None) -> dict:
    """`world` worker processes drain one run; with `kill_at`, rank world-1 is killed with
    SIGKILL once that fraction of the targets is done."""
    from protdp.workqueue import WorkQueue
    costs_file = tmp / "costs.json"
    costs_file.write_text(json.dumps(costs))
    url, key = str(tmp / f"{name}.sqlite"), "ab" * 32
    go = Path(str(costs_file) + ".go")
    go.unlink(missing_ok=True)
    procs = [_start(url, key, costs_file, r, lease) for r in range(world)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    killed = None
    if kill_at is not None:
        while not Path(url).is_file():
            time.sleep(0.05)
        q = WorkQueue(url, key)
        while True:
            time.sleep(0.05)
            try:
                c = q.counts()
            except Exception:   # noqa: BLE001  (being created)
                continue
            if c["total"] and c["done"] >= kill_at * len(costs):
                break
        held = [r for r in __import__("protdp.workqueue", fromlist=["run_status"])
                .run_status(url)["running"] if r["pid"] == procs[-1].pid]
        os.kill(procs[-1].pid, signal.SIGKILL)
        killed = {"at": time.time(), "held": held}
        q.close()
    logs = []
    for p in procs:
        out, _ = p.communicate()
        logs.append(json.loads(out) if p.returncode == 0 and out.strip() else [])
    from protdp.workqueue import WorkQueue as Q
    q = Q(url, key)
    results = q.results()
    q.close()
    spans = [e for log in logs for e in log]
    start, end = min(s for _, s, _ in spans), max(e for _, _, e in spans)
    busy = [sum(e - s for _, s, e in log) for log in logs]
    rep = _report(busy if kill_at is None else busy[:-1], end - start, costs,
                  world if kill_at is None else world - 1)
    rep["every_target_once"] = results is not None and [r["idx"] for r in results] == list(
        range(len(costs)))
    if killed is not None:
        survivor = logs[0]
        after = [(s, e) for _, s, e in survivor if e > killed["at"]]
        busy_after = sum(e - max(s, killed["at"]) for s, e in after)
        idle = (end - killed["at"]) - busy_after
        redone = sum(killed["at"] - r["since"] for r in killed["held"]) if killed["held"] else 0.0
        rep.update(lease_s=lease, survivor_idle_after_kill_s=round(idle, 3),
                   redone_work_s=round(redone, 3), time_lost_s=round(idle + redone, 3),
                   time_lost_within_one_lease=idle + redone <= lease,
                   killed_at_fraction=kill_at)
        for k in ("busy_fraction", "busy_fraction_min", "makespan_over_ideal", "ideal_s"):
            rep.pop(k)
    return rep


def _seed_times(pred, model, length: int, repeats: int, unchunked: bool = False) -> dict:
    """Median seconds of the target's seeds batched and one at a time, alternating; with
    `unchunked` also batched at one seed's chunk (the whole batch's rows at once: B working
    sets per step), the choice `ensemble.batch_chunk` replaced."""
    from protdp.inference import ensemble

    rng = random.Random(1)
    seq = "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(length))
    seq_fwd = lambda batch, chunk, hook: model(batch, num_recycles=None)   # noqa: E731
    ensemble.run_ensemble(pred, seq, None, "q")                             # warm-up
    modes = ("sequential", "batched") + (("batched_unchunked",) if unchunked else ())
    times = {m: [] for m in modes}
    per_seed_chunk = ensemble.batch_chunk
    for _ in range(repeats):
        for mode in modes:
            if mode == "batched_unchunked":
                ensemble.batch_chunk = lambda chunk, length, group: chunk   # noqa: E731
            t0 = time.perf_counter()
            try:
                ensemble.run_ensemble(pred, seq, None, "q",
                                      forward=seq_fwd if mode == "sequential" else None)
            finally:
                ensemble.batch_chunk = per_seed_chunk
            times[mode].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
            "median_s": {k: round(v, 4) for k, v in med.items()},
            "speedup": round(med["sequential"] / med["batched"], 3),
            **({"speedup_unchunked": round(med["sequential"] / med["batched_unchunked"], 3)}
               if unchunked else {})}


def seeds_speedup(config: str, length: int, n_seeds: int, repeats: int,
                  threads: tuple[int, ...] = (1, 2), tiny_length: int = 8) -> dict:
    """Batched vs sequential seeds at `length` for each torch thread count, and the floor:
    at `tiny_length` a prediction is almost all fixed per-call overhead, so the sequential
    seconds per seed there bound the overhead batching can remove (N-1 of N such overheads),
    hence the largest speedup batching could give at `length`."""
    import torch

    from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
    from protdp.inference.predictor import PredictConfig, Predictor
    from protdp.model import build_model

    tmp = Path(tempfile.mkdtemp(prefix="seeds_"))
    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(config, verbose=False), None, tmp / "m.pt")
    loaded = load_model_checkpoint(ckpt, device="cpu")
    pred = Predictor(loaded, tmp / "out", release_gate="off",
                     config=PredictConfig(num_seeds=n_seeds, plots=False, batch_seeds="always"))
    by_threads, bound, load = {}, {}, {"start": [round(x, 2) for x in os.getloadavg()]}
    for n in threads:
        torch.set_num_threads(n)
        at = by_threads[str(n)] = _seed_times(pred, loaded.model, length, repeats,
                                              unchunked=True)
        tiny = _seed_times(pred, loaded.model, tiny_length, repeats)
        overhead = tiny["median_s"]["sequential"] / n_seeds
        seq = at["median_s"]["sequential"]
        bound[str(n)] = {"tiny": tiny, "per_seed_overhead_s": round(overhead, 4),
                         "sequential_per_seed_s": round(seq / n_seeds, 4),
                         "max_speedup": round(seq / (seq - (n_seeds - 1) * overhead), 3)}
        load[f"after_{n}_threads"] = [round(x, 2) for x in os.getloadavg()]
    first = by_threads[str(threads[0])]
    return {"config": str(Path(config).resolve().relative_to(ROOT)), "length": length,
            "seeds": n_seeds, "torch_threads": threads[0], "repeats": repeats,
            "seconds": first["seconds"], "median_s": first["median_s"],
            "speedup": first["speedup"], "by_threads": by_threads,
            "host_load_average": load, "host_cores": os.cpu_count(),
            "overhead_bound": {"tiny_length": tiny_length, "by_threads": bound,
                               "note": "per-seed fixed overhead = sequential seconds per "
                                       "seed at the tiny length (an upper bound); batching "
                                       "removes at most N-1 of the N overheads: max_speedup "
                                       "= sequential / (sequential - (N-1) overhead) at "
                                       "`length`"},
            "batched_chunk": "batched: attention / outer-product rows chunked to one seed's "
                             "working set (ensemble.batch_chunk); batched_unchunked: every "
                             "seed's rows at once (the chunk chosen for one seed)"}


def schedule_benchmark(n: int, max_len: int, total_s: float, lease: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="predict_schedule_"))
    costs = make_costs(n, max_len, total_s)
    return {
        "targets": n, "world": 2, "max_len": max_len,
        "lengths_from": "pyhmmer tests/data/seqs/938293.PRJEB85.HG003687.faa (2100 proteins)",
        "early_stop_targets": sum(c["early_stop"] for c in costs),
        "simulated_work_s": round(sum(c["actual"] for c in costs), 2),
        "static": static_makespan(costs, 2),
        "queue": queue_run(costs, tmp, 2, lease, "queue"),
        "queue_rank_killed_at_50pct": queue_run(costs, tmp, 2, lease, "killed", kill_at=0.5),
    }
