"""Accuracy and time of the gradient norm: one fp32 vector_norm, blocked fp32 norms summed in fp64
(`protdp.parallel.clip_grads.sum_of_squares_fp64`, what the optimizer uses) and an fp64 sum of
squares, on 1M and 4M-element buckets of fp32 and bf16-valued gradients (1 thread).
Writes benchmarks/results/grad_norm.json.

    .venv/bin/python benchmarks/grad_norm.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.parallel.clip_grads import NORM_BLOCK, sum_of_squares_fp64  # noqa: E402


def best_ms(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def main() -> int:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for numel in (1 << 20, 1 << 22):
        for kind in ("fp32", "bf16_values"):
            g = torch.randn(numel, generator=gen) * 1e-3
            if kind == "bf16_values":
                g = g.bfloat16().float()
            exact = float(g.double().square().sum())
            methods = {
                "fp32_vector_norm": lambda: torch.linalg.vector_norm(g).double().square(),
                f"blocked_{NORM_BLOCK}_fp64_sum": lambda: sum_of_squares_fp64(g),
                "blocked_4096_fp64_sum": lambda: sum_of_squares_fp64(g, block=4096),
                "fp64_sum_of_squares": lambda: g.double().square().sum(),
            }
            for name, fn in methods.items():
                rows.append({"numel": numel, "grads": kind, "method": name,
                             "rel_error_sum_of_squares": abs(float(fn()) - exact) / exact,
                             "ms": round(best_ms(fn), 3)})
    out = ROOT / "benchmarks" / "results" / "grad_norm.json"
    out.write_text(json.dumps({"benchmark": "grad_norm", "threads": 1, "rows": rows}, indent=1) + "\n")
    for r in rows:
        print(f"{r['numel']:>8} {r['grads']:<12} {r['method']:<24} rel.err {r['rel_error_sum_of_squares']:.1e}"
              f"  {r['ms']:8.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
