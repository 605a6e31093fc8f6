"""Model benchmark: forward+backward time and peak memory (tiny/small at L = 64/128/256),
activation recompute on/off, and inference peak memory at L = 512 with chunked vs unchunked
attention/transitions (AF2 supplement §1.11.8). Each case runs in its own subprocess so the
peak RSS (ru_maxrss) belongs to that case alone; memory is reported as the peak minus the RSS
just before the measured call (model and inputs already resident).

`--issue16` measures only the AlphaFold-compatibility additions and merges them into the
results file, keeping the other entries (benchmarks/model_af2.py):
all-atom vs backbone-only structure module (forward + backward with its losses, AF2 sizes),
`protdp weights import` of a random full-size model_1_ptm npz (wall time, peak RSS vs file
size), and the imported parameter count vs AlphaFold's.

Absolute times on a shared CPU are noise; compare the ratios within one run.

    python benchmarks/model.py [--quick] [--issue16] [--out benchmarks/results/model.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.model_params import param_counts  # noqa: E402


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batch(L: int, N: int):
    import torch
    g = torch.Generator().manual_seed(0)
    msa = torch.randint(0, 21, (1, N, L), generator=g)
    steps = torch.randn(1, L, 3, generator=g)
    ca = torch.cumsum(3.8 * steps / steps.norm(dim=-1, keepdim=True), dim=1)
    pos = ca[:, :, None, :] + torch.randn(1, L, 5, 3, generator=g)
    return {"aatype": msa[:, 0], "residue_index": torch.arange(L)[None], "seq_mask": torch.ones(1, L),
            "msa": msa, "msa_mask": torch.ones(1, N, L), "has_deletion": torch.zeros(1, N, L),
            "deletion_value": torch.zeros(1, N, L), "true_msa": msa,
            "bert_mask": (torch.rand(1, N, L, generator=g) < 0.15).float(),
            "backbone_positions": pos, "backbone_mask": torch.ones(1, L, 5),
            "resolution": torch.tensor([2.0])}


def run_case(case: dict) -> dict:
    """Executed in a subprocess: one measurement, returns times (s) and peak memory (MiB)."""
    import torch

    from protdp.config import read_yaml
    from protdp.model import build_model
    from protdp.model.losses import compute_loss

    torch.set_num_threads(case.get("threads", 1))
    cfg = read_yaml(ROOT / "configs" / "model" / f"{case['config']}.yaml")
    cfg.update(case.get("overrides", {}))
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False)
    batch = _batch(case["L"], case["N"])
    times, saved = [], {}

    def pack(t):  # bytes of tensors autograd keeps for backward, once per storage
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    if case["mode"] == "train":
        model.train()
        for _ in range(case["repeats"]):
            saved.clear()
            before = _rss_mib()
            t = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(batch, num_recycles=0)
                loss, _ = compute_loss(out, batch, model.config)
            loss.backward()
            times.append(time.perf_counter() - t)
            model.zero_grad(set_to_none=True)
            del out, loss
    else:
        model.eval()
        before = _rss_mib()
        with torch.no_grad():
            t = time.perf_counter()
            model(batch, num_recycles=0)
            times.append(time.perf_counter() - t)
    result = {"time_s": round(min(times), 4), "peak_mib": round(_peak_mib() - before, 1),
              "params": model.num_parameters()}
    if saved:  # checkpointed blocks keep only their inputs (not seen by this hook)
        result["saved_activations_mib"] = round(sum(saved.values()) / 2 ** 20, 1)
    return result


def measure(case: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {**case, "error": proc.stderr.strip().splitlines()[-1]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{case['name']:<46} {result['time_s']:8.3f} s  {result['peak_mib']:9.1f} MiB peak  "
          f"{result.get('saved_activations_mib', '-')} MiB saved", flush=True)
    return {**case, **result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="L = 64 only and L = 256 for inference")
    ap.add_argument("--issue16", action="store_true",
                    help="only the AF2-compatibility measurements, merged into --out")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "model.json"))
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return 0
    if args.issue16:
        from benchmarks.model_af2 import run_all
        return run_all(Path(args.out), quick=args.quick)

    lengths = (64,) if args.quick else (64, 128, 256)
    infer_L = 256 if args.quick else 512
    results = {"train": [], "recompute": [], "inference_chunking": []}
    for config in ("tiny", "small"):
        for L in lengths:
            results["train"].append(measure({"name": f"train {config} L={L}", "config": config, "L": L,
                                             "N": 16, "mode": "train", "repeats": 2}))
    for recompute in (False, True):   # 8 blocks so the per-block saving is visible
        results["recompute"].append(measure({
            "name": f"train small(8 blocks) L=128 recompute={recompute}", "config": "small", "L": 128,
            "N": 16, "mode": "train", "repeats": 2, "overrides": {"recompute": recompute, "n_blocks": 8}}))
    for chunk in (None, 64):
        results["inference_chunking"].append(measure({
            "name": f"inference small L={infer_L} chunk={chunk}", "config": "small", "L": infer_L,
            "N": 16, "mode": "infer", "overrides": {"chunk_size": chunk}}))

    def ratio(rows, key):
        if any("error" in r for r in rows):
            return None
        return round(rows[0][key] / max(rows[1][key], 1e-9), 2)

    summary = {
        "inference_peak_memory_unchunked_over_chunked": ratio(results["inference_chunking"], "peak_mib"),
        "inference_time_unchunked_over_chunked": ratio(results["inference_chunking"], "time_s"),
        "train_peak_memory_plain_over_recompute": ratio(results["recompute"], "peak_mib"),
        "train_saved_activations_plain_over_recompute": ratio(results["recompute"], "saved_activations_mib"),
        "train_time_plain_over_recompute": ratio(results["recompute"], "time_s"),
    }
    doc = {"benchmark": "protdp.model forward+backward / inference", "host": platform.node(),
           "cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0], "torch_threads": 1,
           "note": "shared CPU: absolute times are noisy; compare ratios", "summary": summary,
           "parameters": param_counts(), **results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
