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

import torch  # noqa: E402

from protdp.config import load_config  # noqa: E402
from protdp.model.config import ModelConfig  # noqa: E402
from protdp.planning.memory import Shape, train_step_bytes  # noqa: E402

CASES = [f"{c}:{L}:{S}{flags}" for c in ("tiny", "small") for L, S in ((32, 8), (64, 16), (96, 8))
         for flags in ("", ":recompute")] + [f"{c}:64:16{rc}:bf16" for c in ("tiny", "small")
                                             for rc in ("", ":recompute")]
# AF2 sizes (c_m 256, c_z 128, 48 blocks) at a crop a CPU can run; RSS only (the profiler would
# take many minutes here).
AF2_CASES = ["af2:32:8", "af2:32:8:recompute", "af2:32:8:bf16", "af2:32:8:recompute:bf16"]
# one Evoformer block (Alg. 6) and one extra-MSA block (Alg. 18) whose saved-for-backward
# bytes are counted by dtype: (config, L, S, global column)
BLOCK_CASES = [("small", 64, 16, False), ("small", 64, 64, True)]


def block_saved_bytes(name: str, L: int, S: int, global_column: bool) -> dict:
    """Bytes autograd keeps for one training block in fp32 and under bf16 autocast, by dtype
    (saved_tensors_hooks, each storage once, parameters and masks left out), next to
    `protdp.planning.memory.evoformer_block_saved`."""
    from protdp.model.evoformer import EvoformerBlock
    from protdp.planning.memory import Saved, evoformer_block_saved

    cfg = load_config(ModelConfig, ROOT / f"configs/model/{name}.yaml")
    c_m = cfg.c_e if global_column else cfg.c_m
    c_h = cfg.c_hidden_extra_att if global_column else cfg.c_hidden_msa_att
    torch.manual_seed(0)
    block = EvoformerBlock(cfg, c_m, c_h, global_column=global_column).train()
    masks = torch.ones(1, S, L), torch.ones(1, L, L)
    skip = {t.untyped_storage().data_ptr() for t in [*block.parameters(), *masks]}
    est = sum(evoformer_block_saved(cfg, L, S, c_m, c_h, global_column).values(), Saved())
    out = {"config": name, "L": L, "S": S, "block": "extra_msa" if global_column else "evoformer"}
    for bf16 in (False, True):
        seen = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in skip:
                seen[t.untyped_storage().data_ptr()] = (str(t.dtype).replace("torch.", ""),
                                                        t.untyped_storage().nbytes())
            return t
        m = torch.randn(1, S, L, c_m, requires_grad=True)
        z = torch.randn(1, L, L, cfg.c_z, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            block(m, z, *masks)
        by = {}
        for dtype, n in seen.values():
            by[dtype] = by.get(dtype, 0) + n
        out["bf16" if bf16 else "fp32"] = {"measured_bytes_by_dtype": by,
                                           "measured_bytes": sum(by.values()),
                                           "estimated_bytes": est.bytes(bf16)}
    out["bf16_over_fp32"] = out["bf16"]["measured_bytes"] / out["fp32"]["measured_bytes"]
    return out


DESCRIPTION = (
    "estimate = protdp.planning.memory.train_step_bytes (activations by dtype, "
    "memory.evoformer_block_saved: fp32 residual streams / statistics / softmax, compute-dtype "
    "projections, autocast-only weight casts; + fp32 param grads on their timeline); measured = "
    "peak above the pre-step baseline of forward (no recycling) + loss + backward on CPU, after "
    "one warm-up step at the same shape, fp32 unless bf16 (trunk under bf16 autocast). "
    "block_saved_bytes: what autograd keeps for one training block (saved_tensors_hooks) in fp32 "
    "and under bf16 autocast, by dtype. Under autocast the fp32 part is the residual streams "
    "m, z that every LayerNorm keeps as its input, LayerNorm/softmax statistics and the "
    "softmax weights; the rest is bf16, and no tensor is kept both as fp32 and as its bf16 cast. "
    "bf16 keeps less than fp32 per block and per step; the first bf16 step at a new shape "
    "(without the same-shape warm-up) reads ~25-30 MiB more resident memory: oneDNN's "
    "per-shape GEMM primitives and scratch, created once and kept (not step memory).")


def measure(cases: list[str], method: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plan_measure.py"), "--method", method, *cases],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-profiler", action="store_true", help="skip the slow profiler cross-check")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/plan_validation.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
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
    errs16 = [r["rel_error_vs_rss"] for r in rows if r["bf16"]]
    result = {"description": DESCRIPTION,
              "max_abs_rel_error_fp32": max(errs), "mean_abs_rel_error_fp32": sum(errs) / len(errs),
              "max_abs_rel_error_bf16": max(map(abs, errs16)), "min_rel_error_bf16": min(errs16),
              "block_saved_bytes": [block_saved_bytes(*c) for c in BLOCK_CASES],
              "cases": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':<34}{'estimate MiB':>13}{'rss MiB':>10}{'prof MiB':>10}{'err':>8}")
    for r in rows:
        name = f"{r['config']} L{r['L']} S{r['S']}{' rc' if r['recompute'] else ''}{' bf16' if r['bf16'] else ''}"
        p = r["measured_profiler_bytes"]
        print(f"{name:<34}{r['estimated_bytes'] / 2**20:13.1f}{r['measured_rss_bytes'] / 2**20:10.1f}"
              f"{(p / 2**20 if p else float('nan')):10.1f}{r['rel_error_vs_rss']:+8.1%}")
    print(f"max |error| (fp32) {result['max_abs_rel_error_fp32']:.1%}, mean {result['mean_abs_rel_error_fp32']:.1%}; "
          f"max |error| (bf16) {result['max_abs_rel_error_bf16']:.1%}")
    for b in result["block_saved_bytes"]:
        print(f"{b['config']} {b['block']} block L{b['L']} S{b['S']} saved: fp32 {b['fp32']['measured_bytes']} B "
              f"(est {b['fp32']['estimated_bytes']}), bf16 {b['bf16']['measured_bytes_by_dtype']} "
              f"(est {b['bf16']['estimated_bytes']}), bf16/fp32 {b['bf16_over_fp32']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
