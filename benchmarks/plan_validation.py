"""Planner check: estimated vs measured peak memory of one training forward+backward on CPU.

For tiny/small at several crops, with and without recompute (and the bf16 autocast path), and
for the AF2 config at crop 32, the peak is measured in a fresh process
(`benchmarks/plan_measure.py`: resident-set peak; tiny/small also with the PyTorch profiler's
allocator events) and compared with `protdp.planning.memory.train_step_bytes`.
Writes benchmarks/results/plan_validation.json and prints a table.

    .venv/bin/python benchmarks/plan_validation.py [--no-profiler]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.config import load_config  # noqa: E402
from protdp.model.config import ModelConfig  # noqa: E402
from protdp.planning.memory import Shape, train_step_bytes  # noqa: E402

CASES = [f"{c}:{L}:{S}{flags}" for c in ("tiny", "small") for L, S in ((32, 8), (64, 16), (96, 8))
         for flags in ("", ":recompute")] + ["tiny:64:16:bf16", "small:64:16:recompute:bf16"]
# AF2 sizes (c_m 256, c_z 128, 48 blocks) at a crop a CPU can run; RSS only (the profiler would
# take many minutes here).
AF2_CASES = ["af2:32:8", "af2:32:8:recompute"]


def measure(cases: list[str], method: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plan_measure.py"), "--method", method, *cases],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-profiler", action="store_true", help="skip the slow profiler cross-check")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/plan_validation.json"))
    args = ap.parse_args()
    rss = measure(CASES, "rss") + measure(AF2_CASES, "rss")
    prof = {} if args.no_profiler else {r["config"] + str((r["L"], r["S"], r["recompute"], r["bf16"])):
                                        r["measured_bytes"] for r in measure(CASES, "profiler")}
    rows = []
    for r in rss:
        cfg = load_config(ModelConfig, ROOT / r["path"])
        est = train_step_bytes(cfg, Shape(r["L"], r["S"]), r["recompute"], bf16=r["bf16"])
        key = r["config"] + str((r["L"], r["S"], r["recompute"], r["bf16"]))
        row = {k: r[k] for k in ("config", "L", "S", "recompute", "bf16")}
        row.update(estimated_bytes=est["total"], measured_rss_bytes=r["measured_bytes"],
                   measured_profiler_bytes=prof.get(key),
                   rel_error_vs_rss=(est["total"] - r["measured_bytes"]) / r["measured_bytes"])
        if prof.get(key):
            row["rel_error_vs_profiler"] = (est["total"] - prof[key]) / prof[key]
        rows.append(row)
    errs = [abs(r["rel_error_vs_rss"]) for r in rows if not r["bf16"]]
    result = {"description": "estimate = protdp.planning.memory.train_step_bytes (activations fp32 "
                             "+ param grads on their timeline); measured = peak above the pre-step baseline of forward "
                             "(no recycling) + loss + backward on CPU, fp32 unless bf16 (autocast)",
              "max_abs_rel_error_fp32": max(errs), "mean_abs_rel_error_fp32": sum(errs) / len(errs),
              "cases": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':<34}{'estimate MiB':>13}{'rss MiB':>10}{'prof MiB':>10}{'err':>8}")
    for r in rows:
        name = f"{r['config']} L{r['L']} S{r['S']}{' rc' if r['recompute'] else ''}{' bf16' if r['bf16'] else ''}"
        p = r["measured_profiler_bytes"]
        print(f"{name:<34}{r['estimated_bytes'] / 2**20:13.1f}{r['measured_rss_bytes'] / 2**20:10.1f}"
              f"{(p / 2**20 if p else float('nan')):10.1f}{r['rel_error_vs_rss']:+8.1%}")
    print(f"max |error| (fp32) {result['max_abs_rel_error_fp32']:.1%}, mean {result['mean_abs_rel_error_fp32']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
