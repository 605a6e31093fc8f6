"""Length -> memory table of prediction (issue 30): the predictor's memory model
(`protdp.inference.memory.predicted_peak_bytes`) against the measured peak of one inference
pass, unchunked and chunked, and the chunk size `--max-memory` would choose.

CPU (default): each case runs in a fresh process; the peak is the resident high-water mark
(`VmHWM`, reset through /proc/self/clear_refs, glibc serving tensors with mmap so resident
memory follows live tensors; `benchmarks/plan_measure.py`) above the resident size before the
pass (weights and inputs exist before it, so the weights are left out of both numbers).
CUDA (where a device is lent): `torch.cuda.max_memory_allocated` around the same pass.

    python benchmarks/predict_memory.py [--config configs/model/small.yaml] [--device cuda]
writes benchmarks/results/predict_memory[_cuda].json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from protdp.config import load_config  # noqa: E402
from protdp.inference.memory import (TargetSize, choose_chunk_size,  # noqa: E402
                                     predicted_peak_bytes, set_chunk_size)
from protdp.model.config import ModelConfig  # noqa: E402

MIB = 1024 ** 2


def _measure(config: str, L: int, S: int, chunk: int | None, device: str) -> int:
    from plan_measure import (_reset_peak_rss, _status_bytes, _use_mmap_for_tensors,
                              synthetic_batch)

    from protdp.model import build_model
    torch.set_num_threads(1)
    if device == "cpu":
        _use_mmap_for_tensors()
    torch.manual_seed(0)
    model = build_model(config, verbose=False).eval().to(device)
    set_chunk_size(model, chunk)
    with torch.no_grad():
        model({k: v.to(device) for k, v in synthetic_batch(16, 4).items()}, num_recycles=0)
        batch = {k: v.to(device) for k, v in synthetic_batch(L, S).items()}
        if device == "cpu":
            _reset_peak_rss()
            base = _status_bytes("VmRSS")
            model(batch, num_recycles=0)
            return _status_bytes("VmHWM") - base
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model(batch, num_recycles=0)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=str(ROOT / "configs" / "model" / "small.yaml"))
    p.add_argument("--lengths", default="64,128,256,384")
    p.add_argument("--msa-rows", type=int, default=64)
    p.add_argument("--chunks", default="none,16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # L,S,chunk: child process
    args = p.parse_args(argv)
    if args.one:
        L, S, c = args.one.split(",")
        print(_measure(args.config, int(L), int(S), None if c == "none" else int(c), args.device))
        return 0
    cfg = load_config(ModelConfig, args.config)
    from protdp.model import build_model
    n_params = build_model(cfg, verbose=False).num_parameters()
    rows = []
    for L in (int(x) for x in args.lengths.split(",")):
        for c in args.chunks.split(","):
            chunk = None if c == "none" else int(c)
            out = subprocess.run([sys.executable, __file__, "--config", args.config,
                                  "--device", args.device, "--one", f"{L},{args.msa_rows},{c}"],
                                 capture_output=True, text=True, check=True)
            measured = int(out.stdout.strip().splitlines()[-1])
            predicted = predicted_peak_bytes(cfg, TargetSize(L, args.msa_rows), chunk, n_params) \
                - 4 * n_params
            rows.append({"length": L, "msa_rows": args.msa_rows, "chunk": chunk,
                         "measured_mib": round(measured / MIB, 1),
                         "predicted_mib": round(predicted / MIB, 1),
                         "predicted_over_measured": round(predicted / max(measured, 1), 2)})
            print(json.dumps(rows[-1]), flush=True)
    budget = {f"{g} GiB": choose_chunk_size(cfg, TargetSize(L, args.msa_rows), n_params,
                                            int(g * 1024 ** 3))[0]
              for g in (0.25, 1, 4) for L in [max(int(x) for x in args.lengths.split(","))]}
    doc = {"config": str(Path(args.config).relative_to(ROOT)), "device": args.device,
           "n_params": n_params, "rows": rows,
           "chunk_chosen_for_longest_at_budget": budget,
           "note": "measured: peak above the resident size before the pass (weights excluded); "
                   "predicted: protdp.inference.memory.predicted_peak_bytes minus the weights"}
    name = "predict_memory.json" if args.device == "cpu" else f"predict_memory_{args.device}.json"
    (ROOT / "benchmarks" / "results" / name).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
