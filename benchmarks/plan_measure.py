"""Measured peak memory of one training forward + backward on CPU (the planner's reference).

Two independent readings of the same step:

- `rss`: the process's peak resident set (Linux `VmHWM`, reset through `/proc/self/clear_refs`)
  above the resident size just before the step. glibc is told to serve every allocation over
  16 KiB with mmap and to return it on free (`mallopt`), so resident memory follows the live
  tensors. Cheap; used by the test.
- `profiler`: PyTorch's own allocator events (`torch.profiler`, `profile_memory=True`): every
  CPU allocation and free, replayed in time order; the maximum running sum is the peak. Exact
  at op granularity but ~20x slower; used by the validation benchmark as a cross-check.

Parameters and the input batch exist before the step, so neither number includes them. Each
case first runs one step at its own shape (code pages, kernels and autograd machinery are
loaded then, not inside the measured step: among them oneDNN's primitives, created once per
GEMM shape and kept — for bf16 GEMMs ~25-30 MiB of resident memory at L64 that a first step at
a new shape would count as its own). Run in a fresh process (`python benchmarks/plan_measure.py`)
because the allocator settings stay for the life of the process.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protdp.data.residues import NUM_AA  # noqa: E402
from protdp.model.config import ModelConfig  # noqa: E402

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def synthetic_batch(L: int, n_seq: int, n_extra: int = 0, seed: int = 0) -> dict:
    """A batch of one example in the model's feature format (docs/batch_format.md) with random
    tokens and a random-walk backbone; memory depends on the shapes only."""
    g = torch.Generator().manual_seed(seed)
    rows = n_seq + n_extra
    msa = torch.randint(0, NUM_AA, (1, rows, L), generator=g)                        # [1, N, L]
    ca = torch.cumsum(torch.randn(1, L, 3, generator=g) * 2.2, dim=1)                 # [1, L, 3]
    offsets = torch.tensor([[-1.2, 0.8, 0.0], [0, 0, 0], [1.4, 0.3, 0.0], [2.0, 1.2, 0.3],
                            [-0.5, -0.8, -1.2]])                                      # N CA C O CB
    return {
        "aatype": msa[:, 0].clone(), "residue_index": torch.arange(L)[None],
        "seq_mask": torch.ones(1, L),
        "msa": msa, "msa_mask": torch.ones(1, rows, L),
        "has_deletion": torch.zeros(1, rows, L), "deletion_value": torch.zeros(1, rows, L),
        "true_msa": msa.clone(),
        "bert_mask": (torch.rand(1, rows, L, generator=g) < 0.15).float(),
        "backbone_positions": ca[:, :, None, :] + offsets,                            # [1, L, 5, 3]
        "backbone_mask": torch.ones(1, L, 5), "resolution": torch.tensor([2.0]),
    }


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _use_mmap_for_tensors() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, 16 * 1024)
    libc.mallopt(_M_TRIM_THRESHOLD, 64 * 1024)


def peak_from_profile(prof) -> int:
    """Maximum running sum of self-allocated bytes over the profiled ops, in time order."""
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        delta = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        if delta:
            live += delta
            peak = max(peak, live)
    return peak


def _step(model, batch, cfg) -> None:
    from protdp.model.losses import compute_loss
    out = model(batch, num_recycles=0)
    loss, _ = compute_loss(out, batch, cfg)
    loss.backward()
    if not math.isfinite(loss.item()):
        raise RuntimeError("non-finite loss in the memory measurement")


def measure_train_step(cfg: ModelConfig, L: int, n_seq: int, n_extra: int = 0,
                       method: str = "rss", seed: int = 0) -> int:
    """Peak bytes of forward (last recycling pass) + loss + backward above the starting point."""
    from protdp.model import build_model

    torch.manual_seed(seed)
    model = build_model(cfg, verbose=False).train()
    n_extra = n_extra if cfg.extra_msa else 0
    batch = synthetic_batch(L, n_seq, n_extra, seed)
    _step(model, batch, cfg)                                      # warm-up at the same shapes
    model.zero_grad(set_to_none=True)
    if method == "rss":
        _reset_peak_rss()
        base = _status_bytes("VmRSS")
        _step(model, batch, cfg)
        return _status_bytes("VmHWM") - base
    if method == "profiler":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _step(model, batch, cfg)
        return peak_from_profile(prof)
    raise ValueError(f"unknown method {method!r}")


def parse_case(text: str) -> dict:
    """'CONFIG:L:S[:recompute][:bf16]' (CONFIG a YAML path or tiny/small/af2)."""
    parts = text.split(":")
    if len(parts) < 3:
        raise ValueError(f"case {text!r}: expected CONFIG:L:S[:recompute][:bf16]")
    name = parts[0]
    path = name if name.endswith((".yaml", ".yml")) else f"configs/model/{name}.yaml"
    flags = set(parts[3:])
    return {"config": name, "path": path, "L": int(parts[1]), "S": int(parts[2]),
            "recompute": "recompute" in flags, "bf16": "bf16" in flags}


def main(argv: list[str] | None = None) -> int:
    """Measure cases in this (fresh) process; print one JSON list."""
    from protdp.config import load_config

    p = argparse.ArgumentParser(prog="python benchmarks/plan_measure.py")
    p.add_argument("cases", nargs="+", help="CONFIG:L:S[:recompute][:bf16]")
    p.add_argument("--method", choices=("rss", "profiler"), default="rss")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    method = args.method
    if method == "rss":
        try:
            _use_mmap_for_tensors()
            _reset_peak_rss()
        except OSError:          # no glibc or no /proc/self/clear_refs: the exact, slower way
            method = "profiler"
    results = []
    for text in args.cases:
        case = parse_case(text)
        cfg = load_config(ModelConfig, case["path"])
        cfg = dataclasses.replace(cfg, recompute=case["recompute"], bf16=case["bf16"])
        case["measured_bytes"] = measure_train_step(cfg, case["L"], case["S"], method=method)
        case["method"] = method
        results.append(case)
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
