"""Worker side of the dynamic-axial-parallelism tests (spawned by tests/test_dap.py).

Workers never assert (a failed rank would leave its peers waiting in a collective): each rank
records numbers into a dict that the test process checks; an exception is recorded too.
Rank 0 also computes the single-process reference itself (same seeds), so no tensors travel;
every rank records a checksum of its weights so the test sees that all ranks agree.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from pathlib import Path

import multiprocessing as mp
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

L_RES, N_SEQ = 7, 13      # odd: both axes need padding at K = 2 and 4 (13 rows = 8 main + 5 extra)
STEPS, LR = 3, 1e-3
OUT_JOBS = ("training", "reload", "inference")   # jobs that get the spawn's folder as `out`


def _key(job: str, kw: dict) -> str:
    """Result name of a job: job_dap, plus _backend when the job names an attention backend."""
    return f"{job}_{kw.get('dap', '')}" + (f"_{kw['backend']}" if "backend" in kw else "")


def _entry(rank, world, port, jobs, outdir, timeout_s):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from protdp.parallel import init_distributed

    for job, kw in jobs:
        result: dict = {}
        try:
            if not dist.is_initialized():
                init_distributed(timeout=timeout_s)
            globals()[job](rank, world, result, **{**kw, **({"out": Path(outdir)}
                                                          if job in OUT_JOBS else {})})
        except BaseException as exc:
            result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        torch.save(result, Path(outdir) / f"{_key(job, kw)}_rank{rank}.pt")
    sys.stdout.flush()
    os._exit(0)


def spawn(jobs: list[tuple[str, dict]], world: int, outdir: Path, deadline_s: float = 150.0):
    """Run every (job, kwargs) in turn on `world` gloo ranks; {job_dap: [rank results]}."""
    import parallel_workers as pw

    ctx = mp.get_context("spawn")
    port = pw.free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, jobs, str(outdir), 60.0))
             for r in range(world)]
    for p in procs:
        p.start()
    t_end = time.monotonic() + deadline_s
    for p in procs:
        p.join(max(0.0, t_end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    return {_key(job, kw): [torch.load(Path(outdir) / f"{_key(job, kw)}_rank{r}.pt", weights_only=False)
                            for r in range(world)] for job, kw in jobs}


# ---------------------------------------------------------------------------- collectives
def collectives(rank, world, res, dap):
    """Backward of every DAP collective against its analytic expectation."""
    from protdp.parallel.groups import build_groups

    groups = build_groups(dap)
    comm = groups.axial_comm()
    k, r = comm.size, comm.rank

    def shard_of(q, shape):   # rank q's shard input, reproducible on every rank
        return torch.randn(shape, generator=torch.Generator().manual_seed(100 + q), dtype=torch.float64)

    def weight_of(q, shape):  # rank q's upstream gradient
        return torch.randn(shape, generator=torch.Generator().manual_seed(200 + q), dtype=torch.float64)

    shape = (3, 2, 5)
    x = shard_of(r, shape).requires_grad_()
    full = comm.gather(x, 1)
    expected_full = torch.cat([shard_of(q, shape) for q in range(k)], 1)
    res["gather_fwd"] = (full - expected_full).abs().max().item()
    (full * weight_of(r, full.shape)).sum().backward()
    # d/dx_r sum_q <w_q, gather(x)> = sum_q w_q[shard r]   (reduce-scatter SUM)
    expected = sum(weight_of(q, full.shape) for q in range(k)).narrow(1, 2 * r, 2)
    res["gather_bwd"] = (x.grad - expected).abs().max().item()
    res["gather_bwd_split_only_would_be"] = (
        x.grad - weight_of(r, full.shape).narrow(1, 2 * r, 2)).abs().max().item()

    x = shard_of(r, shape).requires_grad_()
    rep = comm.gather_replicated(x, 1)
    w = weight_of(0, rep.shape)     # replicated compute: the same upstream gradient on every rank
    (rep * w).sum().backward()
    res["gather_replicated_bwd"] = (x.grad - w.narrow(1, 2 * r, 2)).abs().max().item()

    full_in = shard_of(0, (3, 2 * k, 5)).requires_grad_()   # the same on every rank
    mine = comm.scatter(full_in, 1)
    (mine * weight_of(r, mine.shape)).sum().backward()
    expected = torch.cat([weight_of(q, mine.shape) for q in range(k)], 1)
    res["scatter_fwd"] = (mine - full_in.detach().narrow(1, 2 * r, 2)).abs().max().item()
    res["scatter_bwd"] = (full_in.grad - expected).abs().max().item()

    # all-to-all: rows-split [2, 4k, 3] -> columns-split [2k, 4, 3]... of a global [2k, 4k, 3]
    glob = shard_of(0, (2 * k, 4 * k, 3))
    x = glob.narrow(0, 2 * r, 2).clone().requires_grad_()
    y = comm.all_to_all(x, 1, 0)
    res["a2a_fwd"] = (y - glob.narrow(1, 4 * r, 4)).abs().max().item()
    gw = weight_of(0, glob.shape)     # loss = <gw, global>: d/dx = gw's row shard
    (y * gw.narrow(1, 4 * r, 4)).sum().backward()
    res["a2a_bwd"] = (x.grad - gw.narrow(0, 2 * r, 2)).abs().max().item()


# ---------------------------------------------------------------------------- model numerics
def _setup(extra=True, **over):
    from model_fixtures import random_batch, tiny_config
    from protdp.model import build_model

    cfg = tiny_config(extra_msa=extra, chunk_size=2, recompute=True, num_recycles=1, **over)
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False)
    with torch.no_grad():   # off the zero-initialised residual branches: every path carries signal
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model, random_batch(L=L_RES, N=N_SEQ, B=None, seed=3)


def _loss_and_grads(model, batch, seed):
    from protdp.model.losses import compute_loss

    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)                      # dropout masks: the same stream on every rank
    out = model(batch, num_recycles=1)
    loss, _ = compute_loss(out, batch, model.config)
    loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters()
                 if p.grad is not None}


def _rel(a: dict, b: dict, floor: float = 1e-3, only: str | None = None) -> float:
    """Worst per-tensor max |a - b| / max |b|; the denominator floored at `floor` x the largest
    gradient (a softmax-shift bias's gradient is 0 up to round-off, its own scale is noise)."""
    top = max(t.abs().max().item() for t in b.values())
    return max(((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(floor * top)).item()
               for n in ([only] if only else b))


def numerics(rank, world, res, dap, backend="auto"):
    """fp64 DAP vs one process: every output, every parameter gradient; the split-only gather
    backward for the negative check. Training mode: dropout, recycling, chunking, recompute;
    `backend`: the attention backend of both runs."""
    from protdp.model.axial import dap_sharded_parameters
    from protdp.parallel.dap import reduce_dap_grads
    from protdp.parallel.groups import build_groups

    groups = build_groups(dap)
    model, batch = _setup(attention_backend=backend)
    model = model.double().train()
    batch = {k: v.double() if torch.is_floating_point(v) else v for k, v in batch.items()
             if not isinstance(v, (str, list))}
    ref_out, ref_grads = _loss_and_grads(model, batch, seed=7) if rank == 0 else (None, None)
    for variant, split_only in (("", False), ("split_only_", True)):
        model.set_axial_comm(groups.axial_comm(split_only_gather_backward=split_only))
        out, _ = _loss_and_grads(model, batch, seed=7)
        reduce_dap_grads(dap_sharded_parameters(model), groups.dap_group)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        model.set_axial_comm(None)
        if rank != 0:
            continue
        if not split_only:
            res["outputs"] = max((out[k] - ref_out[k]).abs().max().item()
                                 for k in ("msa", "pair", "single", "final_atom_positions",
                                           "plddt_logits", "distogram_logits"))
            res["outputs_scale"] = ref_out["pair"].abs().max().item()
            res["grad_names"] = sorted(grads) == sorted(ref_grads) and len(grads) == len(
                list(model.parameters()))
        res[variant + "grads_rel"] = _rel(grads, ref_grads)
        res[variant + "worst"] = max(ref_grads, key=lambda n: _rel(grads, ref_grads, only=n))


# ---------------------------------------------------------------------------- training steps
def training(rank, world, res, dap, out):
    """fp32 training steps of the DP engine over the DP group with DAP inside (distributed
    optimizer, clipping) against a single process stepping torch's AdamW on the mean gradient of
    the same samples."""
    from protdp.model.axial import dap_sharded_parameters
    from protdp.model.losses import compute_loss
    from protdp.parallel import DataParallel, DistributedOptimizer, ParallelConfig
    from protdp.parallel.groups import build_groups
    from model_fixtures import random_batch

    groups = build_groups(dap)
    dp = groups.dp_size
    model, _ = _setup()
    ref = copy.deepcopy(model).train()
    batches = [[random_batch(L=L_RES, N=N_SEQ, B=None, seed=10 * s + d) for d in range(dp)]
               for s in range(STEPS)]
    for b in (x for step in batches for x in step):
        b.pop("family_id")

    cfg = ParallelConfig(data_parallel_size=dp, use_distributed_optimizer=dp > 1,
                         overlap_grad_reduce=True, bucket_size=20_000)
    model.set_axial_comm(groups.axial_comm())
    ddp = DataParallel(model.train(), cfg, process_group=groups.dp_group,
                       dap_params=dap_sharded_parameters(model), dap_group=groups.dap_group)
    opt = DistributedOptimizer(ddp, cfg, lr=LR, clip_grad=0.05, eps=1e-6, fused=False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, eps=1e-6, weight_decay=0.0, foreach=False)
    norms = []
    for s in range(STEPS):
        opt.zero_grad()
        torch.manual_seed(1000 * s + groups.dp_rank)
        loss, _ = compute_loss(ddp(batches[s][groups.dp_rank], num_recycles=1),
                               batches[s][groups.dp_rank], model.config)
        loss.backward()
        opt.step()
        if rank != 0:
            continue
        ref_opt.zero_grad()
        for d in range(dp):
            torch.manual_seed(1000 * s + d)
            ref_loss, _ = compute_loss(ref(batches[s][d], num_recycles=1), batches[s][d], ref.config)
            (ref_loss / dp).backward()
        norms.append((opt.last_grad_norm, torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05).item()))
        ref_opt.step()
    from protdp.parallel import save_checkpoint

    save_checkpoint(out / f"ckpt_dap{dap}", ddp, opt)   # only DAP rank 0 of each group writes
    own = dict(model.named_parameters())
    res["checksum"] = sum(p.detach().double().abs().sum().item() for p in own.values())
    if rank != 0:
        return
    res["weights_rel"] = max(((own[n] - p).abs().max() / p.abs().max().clamp_min(1e-12)).item()
                             for n, p in ref.named_parameters())
    res["moved"] = max((own[n] - p).abs().max().item() for n, p in
                       copy.deepcopy(_setup()[0]).named_parameters())
    res["norms"] = norms


# ---------------------------------------------------------------------------- inference
def inference(rank, world, res, dap, out):
    """`predict --dap-size` on the spawned world against `predict_batch` on one rank (run by
    rank 0 afterwards): the same PDB files and scores. Destroys the process group: run last."""
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.inference.cli import main
    from protdp.workflows import predict

    fasta, ckpt = out / "t.fasta", out / "model.pt"
    if rank == 0:
        model, _ = _setup()
        save_model_checkpoint(model, None, ckpt)
        fasta.write_text(">a\nMKTAYIAKQRQISFVKSHFSRQIEEKLGLIE\n>b\nMVLSPADKTNVKAAW\n")
    dist.barrier()
    main(["--checkpoint", str(ckpt), "--fasta", str(fasta), "--out", str(out / "dap"),
          "--allow-unreleased", "--no-progress", "--dap-size", str(dap),
          "--recycle-early-stop-tolerance", "1e6"])    # every rank stops where the leader does
    if rank != 0:
        return
    from protdp.inference.predictor import PredictConfig

    predict(ckpt, fasta, out / "one", progress=False, release_gate="review",
            config=PredictConfig(recycle_early_stop_tolerance=1e6))
    import json

    import numpy as np

    same, n, worst, worst_plddt = True, 0, 0.0, 0.0
    from protdp.inference.layout import current_prediction

    for t in ("a", "b"):
        folders = [current_prediction(out / run / "targets" / t) for run in ("dap", "one")]
        pdb = [[x for x in (d / f"{t}.pdb").read_text().splitlines() if x.startswith("ATOM")]
               for d in folders]
        scores = [json.loads((d / "scores.json").read_text()) for d in folders]
        n += len(pdb[0])
        # the same atoms and names; coordinates within the PDB's 1e-3 Å rounding and pLDDT
        # within its 0.01 rounding (fp32 sums in another order can round the last digit the
        # other way); the gate's band and reasons identical
        same = same and [x[:30] for x in pdb[0]] == [x[:30] for x in pdb[1]]
        worst = max(worst, max(abs(float(a[c:c + 8]) - float(b[c:c + 8])) for a, b in zip(*pdb)
                               for c in (30, 38, 46)))
        worst_plddt = max(worst_plddt, max(abs(float(a[60:66]) - float(b[60:66]))
                                           for a, b in zip(*pdb)),
                          float(np.max(np.abs(np.subtract(scores[0]["plddt"], scores[1]["plddt"])))))
        same = same and abs(scores[0]["mean_plddt"] - scores[1]["mean_plddt"]) <= 1e-2 and all(
            scores[0][k] == scores[1][k] for k in ("band", "reasons"))
    res["same"], res["atoms"], res["max_coord_diff"] = same, n, worst
    res["max_plddt_diff"] = worst_plddt


def reload(rank, world, res, dap, out, saved_dap=2):
    """The checkpoint `training` wrote at dp 1 x dap 2 loads at this run's dp x dap: the same
    weights, the optimizer state resharded, and a further step runs."""
    from protdp.model.axial import dap_sharded_parameters
    from protdp.model.losses import compute_loss
    from protdp.parallel import (DataParallel, DistributedOptimizer, ParallelConfig,
                                 load_checkpoint)
    from protdp.parallel.groups import build_groups
    from model_fixtures import random_batch

    groups = build_groups(dap)
    model, _ = _setup()
    cfg = ParallelConfig(data_parallel_size=groups.dp_size,
                         use_distributed_optimizer=groups.dp_size > 1, bucket_size=20_000)
    model.set_axial_comm(groups.axial_comm())
    ddp = DataParallel(model.train(), cfg, process_group=groups.dp_group,
                       dap_params=dap_sharded_parameters(model), dap_group=groups.dap_group)
    opt = DistributedOptimizer(ddp, cfg, lr=LR, clip_grad=0.05, eps=1e-6, fused=False)
    path = out / f"ckpt_dap{saved_dap}"
    load_checkpoint(path, ddp, opt)
    saved = torch.load(path / "model.pt", weights_only=True)["model"]
    res["weights_diff"] = max((p - saved[n]).abs().max().item() for n, p in model.named_parameters())
    res["optimizer_steps"] = [int(st["step"]) for shard in opt._shards
                              for st in shard.inner.state.values()][:1]
    batch = random_batch(L=L_RES, N=N_SEQ, B=None, seed=99 + groups.dp_rank)
    batch.pop("family_id")
    opt.zero_grad()
    compute_loss(ddp(batch, num_recycles=0), batch, model.config)[0].backward()
    res["stepped"] = opt.step()
