"""Prepared GPU benchmark of the model (issue 29 D6): one command, a time budget, JSON out.

    PYTHONPATH=. python3 benchmarks/gpu_model.py --out $OUT/gpu_model.json [--budget-s 280]
        [--only block,bias_grad,train_step,inference] [--device cuda|cpu] [--tiny]

Sections (each records its own settings, and "skipped" when the budget ran out first):
- block: one Evoformer block (AF2 full widths) at N_res 256, N_msa 128 under bf16 autocast,
  forward / backward time and peak memory per attention backend (explicit, sdpa, recompute;
  lowmem for the forward only); the published A100-40GB rows (OpenFold 17.2 / 23.7 ms, 8.08 GB; FastFold 9.4 /
  20.2 ms, 7.81 GB) are copied into the JSON for side-by-side reading.
- bias_grad: each SDPA kernel of the device (CUDA: efficient, math, cuDNN, flash; CPU: math,
  flash) against the explicit path: output and dq / dk / dv / d(bias) max relative error, at
  lengths 1, 17, 64, 192, 256 (64 mod 128 is the H100 cuDNN bias bug), fp32 and bf16; a kernel
  that refuses is recorded with its message.
- train_step: full AF2 model training step (loss + backward) at crop 256 and 384, recompute on,
  bf16, 128 MSA clusters + 1024 extra rows: time, peak memory, achieved TFLOP/s (protdp.model.flops).
- inference: full model forward without recycling at L = 1000, 2000, 3000 (chunk 4 + lowmem
  attention), time and peak memory.

`--device cpu --tiny` runs every section with tiny sizes (the suite does, so it cannot rot).
Peak memory: torch.cuda.max_memory_allocated on CUDA; on CPU the growth of the process's peak
RSS (monotone, so only the first growth per section is meaningful).
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from protdp.fileio import atomic_write_json  # noqa: E402
from protdp.config import read_yaml  # noqa: E402
from protdp.model import build_model  # noqa: E402
from protdp.model.attention import (explicit_attention, resolved_backend,  # noqa: E402
                                    sdpa_attention)
from protdp.model.config import ModelConfig  # noqa: E402
from protdp.model.evoformer import EvoformerBlock  # noqa: E402
from protdp.model.flops import evoformer_block_flops, training_step_flops  # noqa: E402
from protdp.model.losses import compute_loss  # noqa: E402
from protdp.model.precision import trunk_autocast  # noqa: E402
from protdp.model.primitives import set_attention_backend  # noqa: E402

SECTIONS = ("block", "bias_grad", "train_step", "inference")
PUBLISHED_A100 = {"openfold_block": {"forward_ms": 17.2, "backward_ms": 23.7, "peak_gb": 8.08},
                  "fastfold_block": {"forward_ms": 9.4, "backward_ms": 20.2, "peak_gb": 7.81}}
FULL = {"block": {"n_res": 256, "n_seq": 128}, "bias_lengths": [1, 17, 64, 192, 256],
        "crops": [256, 384], "n_seq": 128, "n_extra": 1024, "infer_lengths": [1000, 2000, 3000],
        "infer_chunk": 4, "repeats": 3}
TINY = {"block": {"n_res": 24, "n_seq": 8}, "bias_lengths": [1, 17, 64],
        "crops": [16, 24], "n_seq": 8, "n_extra": 16, "infer_lengths": [32, 48],
        "infer_chunk": 4, "repeats": 1}


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_bytes(device, base):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() - base
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base


def _timed(fn, device):
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


def model_config(tiny: bool, **overrides) -> ModelConfig:
    cfg = read_yaml(ROOT / "configs" / "model" / ("tiny.yaml" if tiny else "af2.yaml"))
    cfg.update(msa_dropout=0.0, pair_dropout=0.0, sm_dropout=0.0, **overrides)
    return ModelConfig(**cfg)


def section_block(device, sizes, tiny, budget) -> dict:
    cfg = model_config(tiny, bf16=True)
    S, L = sizes["block"]["n_seq"], sizes["block"]["n_res"]
    g = torch.Generator(device="cpu").manual_seed(0)
    m0 = torch.randn(1, S, L, cfg.c_m, generator=g).to(device)
    z0 = torch.randn(1, L, L, cfg.c_z, generator=g).to(device)
    msa_mask, pair_mask = torch.ones(1, S, L, device=device), torch.ones(1, L, L, device=device)
    torch.manual_seed(0)
    block = EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att).to(device).train()
    for p in block.parameters():     # non-zero final layers so backward does real work
        torch.nn.init.normal_(p, std=0.02)
    flops = evoformer_block_flops(cfg, S, L)
    res = {"n_seq": S, "n_res": L, "widths": {"c_m": cfg.c_m, "c_z": cfg.c_z}, "dtype": "bf16 autocast",
           "forward_gflop": round(flops / 1e9, 4), "published_a100_40gb": PUBLISHED_A100, "backends": {}}
    for backend in ("explicit", "sdpa", "recompute", "lowmem"):
        if budget.left() < 5:
            res["backends"][backend] = {"skipped": "budget"}
            continue
        set_attention_backend(block, backend)
        row = {"kernel_train": resolved_backend(backend, device, bias_grad=True),
               "kernel_infer": resolved_backend(backend, device, bias_grad=False)}
        try:
            fwd, bwd = [], []
            for rep in range(sizes["repeats"] + 1):       # first repeat warms up
                m, z = m0.clone().requires_grad_(), z0.clone().requires_grad_()
                base = _reset_peak(device)
                if backend != "lowmem":
                    with trunk_autocast(device, True):
                        (mo, zo), tf = _timed(lambda: block(m, z, msa_mask, pair_mask), device)
                    loss = mo.float().square().mean() + zo.float().square().mean()
                    _, tb = _timed(loss.backward, device)
                    fwd.append(tf), bwd.append(tb)
                with torch.no_grad(), trunk_autocast(device, True):
                    _, ti = _timed(lambda: block(m0, z0, msa_mask, pair_mask), device)
                row.setdefault("inference_ms", []).append(ti * 1e3)
                if rep == 0:
                    row["peak_mib_first_call"] = round(_peak_bytes(device, base) / 2 ** 20, 1)
            if fwd:
                row["forward_ms"] = round(min(fwd[1:] or fwd) * 1e3, 2)
                row["backward_ms"] = round(min(bwd[1:] or bwd) * 1e3, 2)
                row["forward_tflops"] = round(flops / min(fwd[1:] or fwd) / 1e12, 2)
            row["inference_ms"] = round(min(row["inference_ms"][1:] or row["inference_ms"]), 2)
            base = _reset_peak(device)
            m, z = m0.clone().requires_grad_(), z0.clone().requires_grad_()
            if backend != "lowmem":
                with trunk_autocast(device, True):
                    mo, zo = block(m, z, msa_mask, pair_mask)
                (mo.float().square().mean() + zo.float().square().mean()).backward()
                row["peak_mib_train"] = round(_peak_bytes(device, base) / 2 ** 20, 1)
                del mo, zo
            base = _reset_peak(device)
            with torch.no_grad(), trunk_autocast(device, True):
                block(m0, z0, msa_mask, pair_mask)
            row["peak_mib_inference"] = round(_peak_bytes(device, base) / 2 ** 20, 1)
        except Exception as exc:  # an OOM or a refused kernel is a result, not a crash
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        res["backends"][backend] = row
    return res


def section_bias_grad(device, sizes, tiny, budget) -> dict:
    kernels = (["sdpa_efficient", "sdpa_math", "sdpa_cudnn", "sdpa_flash"] if device.type == "cuda"
               else ["sdpa_math", "sdpa_flash_cpu"])
    res = {"heads": 4, "c": 32, "rows": 4, "reference": "explicit in float64", "cases": []}
    for dtype in (torch.float32, torch.bfloat16):
        for n in sizes["bias_lengths"]:
            if budget.left() < 2:
                res["cases"].append({"skipped": "budget"})
                break
            g = torch.Generator(device="cpu").manual_seed(n)
            q, k, v = (torch.randn(1, 4, 4, n, 32, generator=g).to(device, dtype) for _ in range(3))
            bias = torch.randn(1, 1, 4, n, n, generator=g).to(device, dtype)
            mask = (torch.rand(1, 4, n, generator=g) > 0.2).float().to(device)
            mask[..., 0] = 1
            up = torch.randn(1, 4, 4, n, 32, generator=g).to(device, dtype)

            def run(fn, dt):
                leaves = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
                cast = [t.to(dt) for t in leaves]
                out = fn(*cast[:3], mask.to(dt), cast[3])
                out.backward(up.to(dt))
                return [out.double()] + [t.grad for t in leaves]

            ref = run(explicit_attention, torch.float64)          # fp64 truth
            for kernel in ["explicit"] + kernels:
                case = {"dtype": str(dtype).replace("torch.", ""), "length": n, "kernel": kernel}
                fn = explicit_attention if kernel == "explicit" else (
                    lambda a, b, c, m, bb, kernel=kernel: sdpa_attention(a, b, c, m, bb, kernel=kernel))
                try:
                    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), run(fn, dtype), ref):
                        err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                        case[f"{name}_max_rel"] = float(f"{err:.3g}")
                except Exception as exc:
                    case["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                res["cases"].append(case)
    return res


def make_batch(L: int, N: int, n_extra: int, device):
    g = torch.Generator().manual_seed(0)
    msa = torch.randint(0, 21, (1, N, L), generator=g)
    steps = torch.randn(1, L, 3, generator=g)
    ca = torch.cumsum(3.8 * steps / steps.norm(dim=-1, keepdim=True), dim=1)
    extra = torch.randint(0, 21, (1, n_extra, L), generator=g)
    batch = {"aatype": msa[:, 0], "residue_index": torch.arange(L)[None], "seq_mask": torch.ones(1, L),
             "msa": msa, "msa_mask": torch.ones(1, N, L), "has_deletion": torch.zeros(1, N, L),
             "deletion_value": torch.zeros(1, N, L), "true_msa": msa,
             "bert_mask": (torch.rand(1, N, L, generator=g) < 0.15).float(),
             "backbone_positions": ca[:, :, None, :] + torch.randn(1, L, 5, 3, generator=g),
             "backbone_mask": torch.ones(1, L, 5), "resolution": torch.tensor([2.0]),
             "extra_msa": extra, "extra_msa_mask": torch.ones(1, n_extra, L),
             "extra_has_deletion": torch.zeros(1, n_extra, L),
             "extra_deletion_value": torch.zeros(1, n_extra, L)}
    return {k: v.to(device) for k, v in batch.items()}


def section_train_step(device, sizes, tiny, budget) -> dict:
    res = {"recompute": True, "dtype": "bf16 autocast, fp32 params", "n_seq": sizes["n_seq"],
           "n_extra": sizes["n_extra"], "crops": {}}
    cfg = model_config(tiny, bf16=True, recompute=True, extra_msa=True)
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False).to(device).train()
    res["params"] = model.num_parameters()
    res["attention_kernel_train"] = resolved_backend(cfg.attention_backend, device, bias_grad=True)
    for L in sizes["crops"]:
        if budget.left() < 20 and not tiny:
            res["crops"][L] = {"skipped": "budget"}
            continue
        row = {}
        try:
            batch = make_batch(L, sizes["n_seq"], sizes["n_extra"], device)
            times = []
            for _ in range(2 if tiny else 3):
                base = _reset_peak(device)

                def step():
                    out = model(batch, num_recycles=0)
                    loss, _ = compute_loss(out, batch, model.config)
                    loss.backward()
                    model.zero_grad(set_to_none=True)
                    return float(loss.detach())
                loss, t = _timed(step, device)
                times.append(t)
                row["peak_mib"] = round(_peak_bytes(device, base) / 2 ** 20, 1)
            best = min(times[1:])
            flops = training_step_flops(cfg, sizes["n_seq"], L, sizes["n_extra"], recompute=True)
            row.update(step_s=round(best, 4), loss_finite=bool(torch.isfinite(torch.tensor(loss))),
                       tflop=round(flops / 1e12, 3), achieved_tflops=round(flops / best / 1e12, 2))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        res["crops"][L] = row
    return res


def section_inference(device, sizes, tiny, budget) -> dict:
    cfg = model_config(tiny, bf16=True, extra_msa=True, chunk_size=sizes["infer_chunk"],
                       attention_backend="lowmem")
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False).to(device).eval()
    res = {"chunk_size": cfg.chunk_size, "attention_backend": "lowmem", "num_recycles": 0,
           "n_seq": sizes["n_seq"], "n_extra": sizes["n_extra"], "lengths": {}}
    last = 0.0
    for L in sizes["infer_lengths"]:
        # the cost grows ~ L^3: skip a length its predecessor says will not fit in the budget
        if not tiny and last and budget.left() < last * 4:
            res["lengths"][L] = {"skipped": "budget"}
            continue
        row = {}
        try:
            batch = make_batch(L, sizes["n_seq"], sizes["n_extra"], device)
            base = _reset_peak(device)
            with torch.no_grad():
                out, t = _timed(lambda: model(batch, num_recycles=0), device)
            last = t
            row.update(time_s=round(t, 3), peak_mib=round(_peak_bytes(device, base) / 2 ** 20, 1),
                       finite=bool(torch.isfinite(out["final_atom_positions"]).all()))
            del out
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        res["lengths"][L] = row
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (the suite's CPU run)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--budget-s", type=float, default=280.0, help="wall-clock budget (s)")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"--only: unknown section(s) {bad}; choose from {list(SECTIONS)}")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    budget = Budget(args.budget_s)
    sizes = TINY if args.tiny else FULL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    result = {"device": name or "cpu",
              "torch": torch.__version__, "tiny": args.tiny, "budget_s": args.budget_s,
              "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
              "sections": {}}
    fns = {"block": section_block, "bias_grad": section_bias_grad,
           "train_step": section_train_step, "inference": section_inference}
    for name in only:
        if budget.left() <= 0:
            result["sections"][name] = {"skipped": "budget"}
            continue
        t = time.monotonic()
        result["sections"][name] = fns[name](device, sizes, args.tiny, budget)
        result["sections"][name]["wall_s"] = round(time.monotonic() - t, 1)
        print(f"{name}: {result['sections'][name]['wall_s']} s", flush=True)
    atomic_write_json(args.out, result, allow_nan=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
