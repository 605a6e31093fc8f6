"""Ring collectives through the comm thread with 1 vs 4 collectives posted at once
(`PROTDP_COMM_WINDOW`): 2 gloo ranks on loopback, eight 4 MB fp32 buckets per collective kind,
best of several rounds. Writes benchmarks/results/ring_window.json.

    .venv/bin/python benchmarks/ring_window.py
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.parallel import ring  # noqa: E402

BUCKETS, NUMEL, ROUNDS = 8, 1 << 20, 7
KINDS = {"all_gather": ring.ring_all_gather, "reduce_scatter": ring.ring_reduce_scatter,
         "all_reduce": ring.ring_all_reduce}


def _worker(rank: int, world: int, port: int, out: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ranks = list(range(world))
    results = {}
    for window in (1, 4):
        worker = ring.CommWorker(name=f"bench-w{window}", window=window)
        for kind, op in KINDS.items():
            data = [torch.randn(NUMEL) for _ in range(BUCKETS)]
            best = float("inf")
            for _ in range(ROUNDS):
                dist.barrier()
                t0 = time.perf_counter()
                futs = [worker.submit(lambda seq, d=d: op(d, None, ranks, rank, seq)) for d in data]
                for f in futs:
                    f.result()
                best = min(best, time.perf_counter() - t0)
            results[f"{kind}_window{window}_ms"] = round(best * 1e3, 2)
        worker.close(join_s=5.0)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = ROOT / "benchmarks" / "results" / ".ring_window.tmp"
    mp.spawn(_worker, args=(2, port, str(tmp)), nprocs=2)
    res = json.loads(tmp.read_text())
    tmp.unlink()
    doc = {"benchmark": "ring_window", "ranks": 2, "transport": "gloo loopback",
           "buckets": BUCKETS, "bucket_bytes": NUMEL * 4, "rounds_best_of": ROUNDS, **res,
           "ratio_window4_over_window1": {k: round(res[f"{k}_window4_ms"] / res[f"{k}_window1_ms"], 3)
                                          for k in KINDS}}
    (ROOT / "benchmarks" / "results" / "ring_window.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
