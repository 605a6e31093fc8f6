"""One short device check of the parallel engine on CUDA (issue 4, items 1, 4, 7).

Run it where a GPU is lent (the `device` tool runs it as one prepared script, a minute or two):

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out $OUT/gpu_check.json

What a 2-core CPU machine cannot check: the process group a CUDA machine gets from
`init_distributed()` ('cpu:gloo,cuda:nccl': NCCL for CUDA tensors, gloo for the CPU-side metrics
and object collectives), CPU and CUDA tensors through it, and our `DataParallel` +
`DistributedOptimizer` on CUDA (fp32 and bf16 params, fused CUDA AdamW, grad norm and the
non-finite flag kept on the device) against `torch.optim.AdamW` + `clip_grad_norm_` on the same
batches, the grad norm against an fp64 norm of the same grads. One GPU means a world of 1 (NCCL
refuses two ranks on one GPU), so this checks device placement and numerics, not multi-rank NCCL
traffic. Exits 1 when a check fails.
`--device cpu` runs the same checks on CPU (how the script itself is tested).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from protdp.parallel import (DataParallel, DistributedOptimizer, ParallelConfig,  # noqa: E402
                             init_distributed)
from protdp.parallel.collectives import backend_for_device  # noqa: E402

STEPS, LR, CLIP, TIGHT = 12, 1e-3, 0.5, 1e-6


def make_net(device, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                         nn.Linear(512, 8)).to(device=device, dtype=dtype)


def batch(step: int, device):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(64, 256, generator=g), torch.randn(64, 8, generator=g)
    return x.to(device), y.to(device)


def loss_of(net, x, y):
    return (net(x.to(next(net.parameters()).dtype)).float() - y).square().mean()


def flat(net) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in net.parameters()])


def ours_vs_adamw(device, distopt: bool, dtype, nan_step: int | None = None) -> dict:
    """Our engine vs torch AdamW + clip_grad_norm_ (on fp32 copies for bf16 params)."""
    cfg = ParallelConfig(data_parallel_size=1, micro_batch_size=1, bucket_size=20_000,
                         overlap_grad_reduce=True, use_distributed_optimizer=distopt,
                         overlap_param_gather=distopt)
    net = make_net(device, dtype)
    ref = copy.deepcopy(net).float()
    model = DataParallel(net, cfg)
    model.broadcast_params()
    opt = DistributedOptimizer(model, cfg, lr=LR, weight_decay=0.1, clip_grad=CLIP)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=0.1)
    norms, applied = [], []
    for step in range(STEPS):
        x, y = batch(step, device)
        if step == nan_step:
            x[0, 0] = float("nan")
        opt.zero_grad()
        loss_of(model, x, y).backward()
        model.finish_grad_sync()
        norm64 = torch.cat([p.main_grad.reshape(-1) for p in model.parameters()]).double().norm()
        applied.append(opt.step())
        if applied[-1]:  # our norm vs an fp64 norm of the same grads
            norms.append(abs(opt.last_grad_norm - norm64.item()) / norm64.item())
            ref_opt.zero_grad()
            loss_of(ref, x, y).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
            ref_opt.step()
    model.finish_param_sync()
    rel = ((flat(model.module) - flat(ref)).abs().max() / flat(ref).abs().max()).item()
    # every model param is its fp32 master (rounded to the param dtype)
    rounded = all(torch.equal(s.param_view, s.master.to(s.param_view.dtype)) for s in opt._shards)
    return {"max_rel_param_diff": rel, "max_rel_norm_diff": max(norms), "applied": applied,
            "params_equal_rounded_masters": rounded,
            "master_dtypes": sorted({str(s.master.dtype) for s in opt._shards}),
            "param_device": str(next(model.parameters()).device),
            "fused": bool(opt._shards[0].inner.param_groups[0].get("fused"))}


def dap_group_of_one(device) -> dict:
    """Every DAP collective (`protdp.parallel.dap`) through the device's backend (NCCL on CUDA)
    on a group of 1: the tiny model with its blocks run split (`protdp.model.axial`) equals the
    plain model, outputs and gradients."""
    from protdp.config import load_config, read_yaml
    from protdp.model import ModelConfig, build_model
    from protdp.parallel.dap import AxialComm
    from protdp.paths import REPO_ROOT

    cfg = load_config(ModelConfig, {**read_yaml(REPO_ROOT / "configs/model/tiny.yaml"),
                                    "extra_msa": True})
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False).to(device).eval()
    g = torch.Generator().manual_seed(1)
    L, N = 11, 5
    msa = torch.randint(0, 21, (1, N, L), generator=g)
    batch = {"aatype": msa[:, 0], "residue_index": torch.arange(L)[None], "seq_mask": torch.ones(1, L),
             "msa": msa, "msa_mask": torch.ones(1, N, L), "has_deletion": torch.zeros(1, N, L),
             "deletion_value": torch.zeros(1, N, L)}
    batch = {k: v.to(device) for k, v in batch.items()}
    runs = []
    for comm in (None, AxialComm(dist.new_group([0]), 1, 0)):
        model.set_axial_comm(comm)
        model.zero_grad(set_to_none=True)
        out = model(batch, num_recycles=1)
        (out["pair"].square().mean() + out["final_atom_positions"].square().mean()).backward()
        runs.append((out["pair"].detach(), [p.grad.detach().clone() for p in model.parameters()
                                            if p.grad is not None]))
    (z0, g0), (z1, g1) = runs
    top = max(b.abs().max().item() for b in g0)   # floor: a softmax-shift bias's grad is ~0
    return {"pair_max_diff": (z0 - z1).abs().max().item(),
            "grad_max_rel_diff": max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3 * top))
                                     .item() for a, b in zip(g1, g0)), "grads": len(g0) == len(g1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    init_distributed(timeout=120)
    backend = dist.get_backend()
    res: dict = {"device": str(device), "torch": torch.__version__, "backend": backend,
                 "backend_for_device": backend_for_device(backend, device.type)}
    if device.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(device)
    checks: dict[str, bool] = {}
    # CPU tensors (metrics, object gathers) and device tensors through the same default group
    for where in sorted({"cpu", device.type}):
        t = torch.ones(3, dtype=torch.float64, device=where)
        dist.all_reduce(t)
        checks[f"all_reduce of a {where} tensor"] = bool((t == 1).all())
    gathered = [None]
    dist.all_gather_object(gathered, {"rank": 0})
    checks["all_gather_object"] = gathered == [{"rank": 0}]
    for distopt in (False, True):
        name = "distopt" if distopt else "plain"
        r = res[f"fp32_{name}"] = ours_vs_adamw(device, distopt, torch.float32)
        checks[f"fp32 {name}: params within 1e-6 of torch AdamW"] = r["max_rel_param_diff"] <= TIGHT
        checks[f"fp32 {name}: grad norm within 1e-6 of fp64"] = r["max_rel_norm_diff"] <= TIGHT
        checks[f"fp32 {name}: params on {device.type}"] = r["param_device"].startswith(device.type)
    r = res["bf16_distopt"] = ours_vs_adamw(device, True, torch.bfloat16)
    checks["bf16: fp32 master params"] = r["master_dtypes"] == ["torch.float32"]
    checks["bf16: every param is its fp32 master rounded"] = r["params_equal_rounded_masters"]
    checks["bf16: grad norm within 1e-6 of an fp64 norm"] = r["max_rel_norm_diff"] <= TIGHT
    r = res["nan_step"] = ours_vs_adamw(device, True, torch.float32, nan_step=5)
    checks["non-finite step skipped, the others applied"] = r["applied"] == [
        i != 5 for i in range(STEPS)]
    checks["after a skipped step: params match torch AdamW"] = r["max_rel_param_diff"] <= TIGHT
    r = res["dap_group_of_one"] = dap_group_of_one(device)
    checks["DAP collectives on a group of 1: outputs and grads equal the plain model"] = (
        r["grads"] and r["pair_max_diff"] <= 1e-5 and r["grad_max_rel_diff"] <= 1e-4)
    res["checks"] = checks
    res["seconds"] = round(time.perf_counter() - t0, 2)
    dist.destroy_process_group()
    failed = [k for k, ok in checks.items() if not ok]
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    where = (f"on {torch.cuda.get_device_name(device)}" if device.type == "cuda" else
             f"on {device.type.upper()} only (no GPU: the GPU code paths were NOT exercised)")
    print(f"FAILED {where}: " + "; ".join(failed) if failed
          else f"all {len(checks)} checks passed {where}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
