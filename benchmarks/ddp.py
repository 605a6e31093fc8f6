"""Side-by-side benchmark of data-parallel engines on the same model and batch (issue 4, item 9).

Configs (all torch's fused AdamW, same bucket size, same data, same global grad-norm clipping):
  torch_ddp        torch DistributedDataParallel + clip_grad_norm_ + torch.optim.AdamW
  torch_ddp_zero   torch DDP + clip_grad_norm_ + torch ZeroRedundancyOptimizer(AdamW)
  ours_no_overlap  protdp DataParallel, reduction launched in finish_grad_sync, plain AdamW
  ours_overlap     protdp DataParallel, buckets reduced during backward, plain AdamW
  ours_distopt     ours_overlap + DistributedOptimizer sharding (+ overlapped param gather)
  deepspeed_zero1  DeepSpeed's engine, ZeRO stage 1 (its optimizer wrapping torch's fused AdamW,
  deepspeed_zero2  overlap_comm, the same bucket size and clipping), ZeRO stage 2; DeepSpeed as
                   it ships on CPU: gloo, plus its shared-memory all-reduce when all ranks are
                   on one host (loopback; not across netsim's namespaces, one rank per "node")

Clipping is on by default (--clip-grad 1.0) because AF2/OpenFold training clips every step and
our optimizer computes the global grad norm every step anyway (clipping, non-finite detection,
logging): the torch loops then do the same work. --clip-grad 0 compares without it.

All configs live in the same two processes and are timed in interleaved rounds, so load from
other work on this shared machine hits them alike; ratios to torch DDP are the result, absolute
times are noise. Per config: median step time and ratio to torch DDP; CPU time of the process per
step (all threads; on 2 shared cores every engine is bound by it), and split by thread: the
training loop, protdp's comm thread, gloo's TCP loop (mostly kernel socket copies) and torch's
gloo work threads; exposed communication
(ours: time waiting in finish_grad_sync + param-gather waits; torch DDP: its fwd+bwd time minus
the same fwd+bwd without DDP) vs total communication time (ours: union of the intervals a bucket
collective was in flight; torch: one flat all_reduce of the same bytes); optimizer-state bytes per
rank; resident memory per config and peak RSS per rank; bus bandwidth of the bucketed reduction vs
a flat all_reduce of the same bytes; lower bounds on any ZeRO-1 step (`zero1_bounds`: the link
time of its bytes + the turnaround during which the link must idle; the chain all-gathers ->
forward of the last layers -> backward -> last reduce-scatter -> norm; or the compute) and where
ours_distopt and torch DDP stand against them. Also: gloo's all_reduce / reduce_scatter /
all_gather vs protdp's point-to-point rings for 16 MB (the measurement behind
protdp.parallel.collectives' per-backend choice).

  python benchmarks/ddp.py                      # spawns 2 local ranks -> benchmarks/results/ddp.json
  torchrun ... benchmarks/ddp.py --worker --out X.json   # under any launcher (netsim.sh uses it)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.parallel import (DataParallel, DistributedOptimizer, ParallelConfig,  # noqa: E402
                             init_distributed)
from protdp.parallel.buffer import build_layout  # noqa: E402
from protdp.parallel.ddp import dtype_name  # noqa: E402

CONFIGS = ["torch_ddp", "torch_ddp_zero", "ours_no_overlap", "ours_overlap", "ours_distopt",
           "deepspeed_zero1", "deepspeed_zero2"]
LR = 1e-4


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    """CPU time of this process (all its threads, user + system)."""
    t = os.times()
    return t.user + t.system


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """{thread id: (OS thread name, CPU seconds user + system)} of this process (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def thread_role(tid: int, name: str) -> str:
    """Who spends the CPU: the training loop, protdp's comm thread, gloo's threads."""
    from protdp.parallel import ring

    if tid == os.getpid():
        return "main"
    if tid == ring.comm_thread_id():
        return "protdp_comm"
    if name.startswith("gloo_tcp"):
        return "gloo_tcp_loop (kernel TCP)"
    if name.startswith("pt_gloo"):
        return "gloo_work (torch)"
    return "other"


def cpu_by_role(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per thread role between two `thread_cpu_s()` snapshots."""
    roles: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        used = cpu - before.get(tid, (name, 0.0))[1]
        if used > 0:
            role = thread_role(tid, name)
            roles[role] = roles.get(role, 0.0) + used
    return roles


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------- models
class _AcceleratorTime(torch.autograd.Function):
    """Identity whose forward sleeps `fwd_s` and backward `2 × fwd_s`: a kernel on an accelerator,
    during which the host CPU is free (sleep releases the GIL and the core)."""

    @staticmethod
    def forward(ctx, x, fwd_s):
        ctx.fwd_s = fwd_s
        time.sleep(fwd_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.fwd_s)
        return grad, None


class AcceleratorTime(nn.Module):
    def __init__(self, fwd_s: float):
        super().__init__()
        self.fwd_s = fwd_s

    def forward(self, x):
        return _AcceleratorTime.apply(x, self.fwd_s)


def mlp(width: int, depth: int, accel_ms: float = 0.0) -> nn.Module:
    """depth × (Linear, ReLU); with `accel_ms` > 0 each layer also spends accel_ms/depth of
    simulated accelerator time per fwd+bwd (1/3 forward, 2/3 backward) with the CPU idle."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
        if accel_ms > 0:
            layers.append(AcceleratorTime(accel_ms / depth / 3 / 1e3))
    return nn.Sequential(*layers)


def make_workload(args):
    """(model factory, batch, loss(model, batch)) for --model."""
    if args.model == "mlp":
        g = torch.Generator().manual_seed(1)
        x = torch.randn(args.batch, args.width, generator=g)

        def loss(model, x=x):
            return model(x).square().mean()
        return (lambda: mlp(args.width, args.depth, args.accel_ms)), loss
    if args.model == "evoformer":
        from protdp.model import build_model
        sys.path.insert(0, str(ROOT / "tests"))
        from model_fixtures import random_batch  # noqa: E402

        batch = random_batch(L=args.evo_len, N=args.evo_msa, B=args.batch, seed=1)

        def loss(model, batch=batch):
            out = model(batch, num_recycles=0)
            return sum(v.float().mean() for v in out.values()
                       if isinstance(v, torch.Tensor) and v.requires_grad)

        def factory():
            torch.manual_seed(0)
            return build_model(ROOT / "configs" / "model" / args.evo_config, verbose=False)
        return factory, loss
    raise SystemExit(f"unknown --model {args.model}")


# ---------------------------------------------------------------------------- engines
class Engine:
    """One config: `step()` runs forward/backward/reduce/update and returns timing details."""

    def __init__(self, name: str, factory, loss, args, world: int):
        self.name, self.loss = name, loss
        rss0 = rss_mb()
        net = factory()
        bucket_elems = int(args.bucket_mb * 2**20 / 4)
        self.exposed_from_wait = name.startswith("ours")
        if name.startswith("deepspeed"):
            self.model, self.opt = deepspeed_engine(net, int(name[-1]), bucket_elems, args,
                                                    world)
        elif name.startswith("torch"):
            self.model = torch.nn.parallel.DistributedDataParallel(
                net, bucket_cap_mb=args.bucket_mb)
            if name == "torch_ddp_zero":
                from torch.distributed.optim import ZeroRedundancyOptimizer
                self.opt = ZeroRedundancyOptimizer(net.parameters(),
                                                   optimizer_class=torch.optim.AdamW, lr=LR,
                                                   fused=True)
            else:  # the same fused AdamW kernel ours uses: the engines are compared, not kernels
                self.opt = torch.optim.AdamW(net.parameters(), lr=LR, fused=True)
        else:
            distopt = name == "ours_distopt"
            self.cfg = ParallelConfig(
                data_parallel_size=world, micro_batch_size=1, bucket_size=bucket_elems,
                overlap_grad_reduce=name != "ours_no_overlap", use_distributed_optimizer=distopt,
                overlap_param_gather=distopt)
            self.model = DataParallel(net, self.cfg)
            self.model.broadcast_params()
            self.opt = DistributedOptimizer(self.model, self.cfg, lr=LR, clip_grad=args.clip_grad)
        self.clip_grad = args.clip_grad
        self.net = net
        self.records: list[dict] = []
        self.cpu_by_role: dict[str, float] = {}  # CPU seconds per step by thread role
        self.step()  # creates optimizer state, so the resident size below includes it
        self.rss_mb = rss_mb() - rss0

    def state_bytes(self) -> int:
        if isinstance(self.opt, DistributedOptimizer):
            return self.opt.state_bytes()
        if self.name.startswith("deepspeed"):   # its ZeRO optimizer holds the local partition
            return sum(v.numel() * v.element_size() for st in self.opt.optimizer.state.values()
                       for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1)
        opt = self.opt.optim if hasattr(self.opt, "optim") else self.opt  # ZeRO: local shard
        return sum(v.numel() * v.element_size() for st in opt.state.values()
                   for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1)

    def step(self) -> dict:
        cpu0 = _cpu_s()
        rec = self._step()
        rec["cpu_s"] = _cpu_s() - cpu0
        return rec

    def _step(self) -> dict:
        t0 = time.perf_counter()
        if self.name.startswith("deepspeed"):   # reduction inside backward, gathers in step
            self.model.backward(self.loss(self.model))
            t_bwd = time.perf_counter()
            self.model.step()
            t1 = time.perf_counter()
            return {"step_s": t1 - t0, "fwd_bwd_s": t_bwd - t0, "opt_s": t1 - t_bwd}
        if isinstance(self.opt, DistributedOptimizer):
            self.opt.zero_grad()
            param_wait0 = self.model.comm_stats["param_sync_wait_s"]
            param_comm0 = self.model.comm_stats["param_sync_comm_s"]
            self.loss(self.model).backward()
            t_bwd = time.perf_counter()
            self.model.finish_grad_sync()
            t_sync = time.perf_counter()
            self.opt.step()
            t1 = time.perf_counter()
            rec = {"step_s": t1 - t0, "fwd_bwd_s": t_bwd - t0, "opt_s": t1 - t_sync,
                   "finish_grad_sync_s": t_sync - t_bwd,
                   "grad_wait_s": self.model.last_grad_sync["wait_s"],
                   "grad_comm_s": self.model.last_grad_sync["comm_s"],
                   # param gathers of the previous step waited for inside this forward
                   "param_wait_s": self.model.comm_stats["param_sync_wait_s"] - param_wait0,
                   "param_comm_s": self.model.comm_stats["param_sync_comm_s"] - param_comm0}
        else:
            self.opt.zero_grad(set_to_none=False)
            self.loss(self.model).backward()  # DDP waits for its allreduces inside backward
            t_bwd = time.perf_counter()
            if self.clip_grad > 0:  # grads are all-reduced: the local norm is the global norm
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip_grad)
            self.opt.step()
            t1 = time.perf_counter()
            rec = {"step_s": t1 - t0, "fwd_bwd_s": t_bwd - t0, "opt_s": t1 - t_bwd}
        return rec

    def settle(self):
        if isinstance(self.model, DataParallel):
            self.model.finish_param_sync()


def deepspeed_engine(net: nn.Module, stage: int, bucket_elems: int, args, world: int):
    """DeepSpeed's engine and ZeRO-`stage` optimizer over `net`, wrapping torch's fused AdamW
    (the same kernel as the other configs), with the same bucket size and clipping."""
    import logging

    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    config = {"train_batch_size": args.batch * world, "train_micro_batch_size_per_gpu": args.batch,
              "gradient_accumulation_steps": 1, "gradient_clipping": args.clip_grad,
              "steps_per_print": 2**31 - 1, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "overlap_comm": True,
                                    "reduce_bucket_size": bucket_elems,
                                    "allgather_bucket_size": bucket_elems,
                                    "contiguous_gradients": True, "reduce_scatter": True}}
    opt = torch.optim.AdamW(net.parameters(), lr=LR, fused=True)
    engine, zero_opt, _, _ = deepspeed.initialize(model=net, optimizer=opt, config=config,
                                                  dist_init_required=False)
    return engine, zero_opt


def timed(fn, reps: int, stat=statistics.median) -> float:
    ts = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return stat(ts)


def ring_transfers(x: torch.Tensor, world: int):
    """(reduce-scatter, all-gather) of `x` over the whole world with protdp's p2p rings, as
    blocking callables."""
    from protdp.parallel import ring

    ranks, rank = list(range(world)), dist.get_rank()
    return (lambda: ring.run_blocking(ring.ring_reduce_scatter(x, None, ranks, rank)),
            lambda: ring.run_blocking(ring.ring_all_gather(x, None, ranks, rank)))


def collective_choice(world: int, numel: int = 4 * 2**20, reps: int = 9) -> dict:
    """gloo: torch's all_reduce / reduce_scatter / all_gather vs protdp's point-to-point rings
    (protdp.parallel.ring), on the same 16 MB fp32 buffer: the measurement behind the per-backend
    choice in protdp.parallel.collectives."""
    x = torch.randn(numel)
    shard = torch.empty(numel // world)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ring_rs, ring_ag = ring_transfers(x, world)
    out = {"bytes": numel * 4, "backend": dist.get_backend()}
    for name, fn in [("all_reduce_s", lambda: dist.all_reduce(x)),
                     ("reduce_scatter_s", lambda: rs(shard, x)),
                     ("all_gather_s", lambda: ag(x, shard)),
                     ("ring_reduce_scatter_s", ring_rs), ("ring_all_gather_s", ring_ag)]:
        fn()
        out[name] = timed(fn, reps)
    for name in ("reduce_scatter", "all_gather", "ring_reduce_scatter", "ring_all_gather"):
        out[f"{name}_over_all_reduce"] = out[f"{name}_s"] / out["all_reduce_s"]
    return out


def critical_path_times(model: nn.Module, loss, layouts: list, reps: int = 5) -> dict:
    """Compute times on the dependency chain of a ZeRO-1 step (each the minimum over `reps`).

    Measured on a plain copy of the model (no DDP), with the engine's bucket `layouts`
    (`DataParallel.layouts`). Bucket 0 of buffer 0 (the last layers) is reduced first and, in
    forward order, all-gathered last:
      turnaround_s  first forward pre-hook of a module owning a bucket-0 param -> the last
                    bucket-0 grad accumulated: the link idles from that bucket's all-gather
                    until its reduce-scatter can start;
      fwd_tail_s    that first pre-hook -> the loss (forward left after the last all-gather);
      backward_s    backward call -> the last grad of the bucket reduced last accumulated;
    and last_bucket_fraction: the share of the gradient bytes in that bucket.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    first = set(layouts[0].buckets[0].params)
    last = layouts[-1].buckets[-1]
    marks: dict[str, list[float]] = {"need": [], "ready": [], "last": []}
    handles = []
    for prefix, mod in model.named_modules():
        own = {f"{prefix}.{n}" if prefix else n for n, _ in mod.named_parameters(recurse=False)}
        if own & first:
            handles.append(mod.register_forward_pre_hook(
                lambda m, a: marks["need"].append(time.perf_counter())))
    for n, p in named:
        for key, bucket_params in (("ready", first), ("last", last.params)):
            if n in bucket_params:
                handles.append(p.register_post_accumulate_grad_hook(
                    lambda t, key=key: marks[key].append(time.perf_counter())))
    runs = []
    try:
        for _ in range(reps):
            for times in marks.values():
                times.clear()
            value = loss(model)
            t_loss = time.perf_counter()
            value.backward()
            model.zero_grad(set_to_none=False)
            need = min(marks["need"])
            runs.append({"turnaround_s": max(marks["ready"]) - need,
                         "fwd_tail_s": t_loss - need, "backward_s": max(marks["last"]) - t_loss})
    finally:
        for h in handles:
            h.remove()
    out = {k: min(r[k] for r in runs) for k in runs[0]}
    out["last_bucket_fraction"] = last.numel / sum(lay.numel for lay in layouts)
    return out


def zero1_bounds(result: dict, path: dict, transfers: dict) -> dict:
    """Lower bounds on any ZeRO-1 step with global-norm clipping (pure arithmetic on measured
    times, each the fastest of several tries, so rank skew and scheduling noise do not raise
    them) and where the measured distributed-optimizer step and torch DDP stand against them.
    `path`: critical_path_times; `transfers`: one ring reduce-scatter and one ring all-gather
    of all the gradient / param bytes and the norm all-reduce, each alone on the link.

    link: the reduce-scatters + all-gathers move the bytes of both transfers (or of the flat
      all_reduce, if faster); besides, the link idles for the turnaround and for the norm
      all-reduce (after the last reduce-scatter, before the first all-gather: clipping needs
      the norm).
    schedule: the all-gathers all precede the forward of the last layers, the backward follows
      that forward, the last bucket's reduce-scatter (its share of the bytes) follows the
      backward, the norm all-reduce follows it, the next step's first all-gather follows that.
    compute: forward + backward without communication. floor = the largest.
    """
    rs, ag, norm = (transfers[k] for k in ("reduce_scatter_s", "all_gather_s", "norm_allreduce_s"))
    link = min(result["flat_all_reduce_s"], rs + ag) + path["turnaround_s"] + norm
    schedule = (ag + path["fwd_tail_s"] + path["backward_s"] + rs * path["last_bucket_fraction"]
                + norm)
    floor = max(link, schedule, result["compute_s"])
    out = {**path, **transfers, "link_bound_s": link, "schedule_bound_s": schedule,
           "compute_bound_s": result["compute_s"], "floor_s": floor}
    ddp = result["configs"].get("torch_ddp", {}).get("step_s")
    ours = result["configs"].get("ours_distopt", {}).get("step_s")
    out["floor_ratio_to_torch_ddp"] = floor / ddp if ddp else None
    out["ours_distopt_over_floor"] = ours / floor if ours else None
    return out


def zero1_transfers(numel: int, world: int, reps: int = 3) -> dict:
    """The fastest of `reps` ring reduce-scatters / all-gathers of `numel` fp32 elements (the
    transport ours uses on gloo) and of the optimizer's norm/flag all-reduce."""
    ring_rs, ring_ag = ring_transfers(torch.zeros(-(-numel // world) * world), world)  # padded
    stats = torch.zeros(1 + world, dtype=torch.float64)  # what the optimizer all-reduces
    return {"reduce_scatter_s": timed(ring_rs, reps, stat=min),
            "all_gather_s": timed(ring_ag, reps, stat=min),
            "norm_allreduce_s": timed(lambda: dist.all_reduce(stats), 3 * reps, stat=min)}


def bus_bw(nbytes: int, seconds: float, world: int) -> float:
    """NCCL-tests convention: all_reduce bus bandwidth = bytes/time × 2(n-1)/n, in GB/s."""
    return nbytes / seconds * 2 * (world - 1) / world / 1e9 if seconds > 0 else float("nan")


# ---------------------------------------------------------------------------- worker
def _run_rounds(engines: dict, plain: nn.Module, loss, flat: torch.Tensor, args):
    """Warm up, then interleaved timed rounds (load changes hit every config alike); also the
    plain fwd+bwd and a flat all_reduce of all the gradient bytes each round."""
    compute, flat_s = [], []
    for _ in range(args.warmup):
        for e in engines.values():
            e.step()
            e.settle()
    for _ in range(args.rounds):
        for e in engines.values():
            dist.barrier()
            threads0 = thread_cpu_s()
            for _ in range(args.steps):
                e.records.append(e.step())
            e.settle()
            for role, cpu in cpu_by_role(threads0, thread_cpu_s()).items():
                e.cpu_by_role[role] = e.cpu_by_role.get(role, 0.0) + cpu / args.steps / args.rounds
        dist.barrier()
        for _ in range(2):
            t0 = time.perf_counter()
            loss(plain).backward()  # the same fwd+bwd without any communication
            compute.append(time.perf_counter() - t0)
            plain.zero_grad(set_to_none=False)
        flat_s.append(timed(lambda: dist.all_reduce(flat), 2))
    return compute, flat_s


def _config_row(e, result: dict, grad_bytes: int, world: int) -> dict:
    """Medians of one config's steps: time, CPU, memory, exposed vs total communication."""
    med = {k: statistics.median(r[k] for r in e.records) for k in e.records[0]}
    row = {"step_s": med["step_s"], "fwd_bwd_s": med["fwd_bwd_s"], "opt_s": med["opt_s"],
           "cpu_s": statistics.mean(r["cpu_s"] for r in e.records),
           "cpu_s_by_thread": {k: round(v, 5) for k, v in sorted(e.cpu_by_role.items())},
           "step_s_all": [round(r["step_s"], 4) for r in e.records],
           "optimizer_state_bytes": e.state_bytes(), "resident_mb": round(e.rss_mb, 1)}
    if "grad_wait_s" in med:
        row["exposed_comm_s"] = med["grad_wait_s"] + med["param_wait_s"]
        row["total_comm_s"] = med["grad_comm_s"] + med["param_comm_s"]
        row["grad_exposed_s"], row["grad_comm_s"] = med["grad_wait_s"], med["grad_comm_s"]
        row["param_exposed_s"], row["param_comm_s"] = med["param_wait_s"], med["param_comm_s"]
        row["bucketed_busbw_gbs"] = bus_bw(grad_bytes, med["grad_comm_s"], world)
        row["comm_measured"] = "exposed = waits in finish_grad_sync/param gather; total = " \
                               "union of in-flight intervals of the bucket collectives"
    else:
        row["exposed_comm_s"] = max(0.0, med["fwd_bwd_s"] - result["compute_s"])
        row["total_comm_s"] = result["flat_all_reduce_s"]
        row["comm_measured"] = "exposed = DDP fwd+bwd - plain fwd+bwd; total ~ flat all_reduce"
    row["exposed_over_total_comm"] = (row["exposed_comm_s"] / row["total_comm_s"]
                                      if row["total_comm_s"] > 0 else None)
    return row


def _describe_run(result: dict, args, rank: int, world: int, nparams: int) -> None:
    """Per-rank memory/state, workload and backend (collective: every rank calls it)."""
    result["peak_rss_mb"] = peak_rss_mb()
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "peak_rss_mb": result["peak_rss_mb"],
                                      "host": socket.gethostname(),
                                      "state_bytes": {n: r["optimizer_state_bytes"]
                                                      for n, r in result["configs"].items()}})
    result.update(per_rank=gathered, world_size=world, num_params=nparams, grad_bytes=4 * nparams,
                  backend=dist.get_backend())
    result["workload"] = {k: getattr(args, k) for k in (
        "model", "width", "depth", "batch", "bucket_mb", "accel_ms", "steps", "rounds", "warmup",
        "threads", "clip_grad")}
    if args.model == "evoformer":
        result["workload"].update(evo_config=args.evo_config, evo_len=args.evo_len,
                                  evo_msa=args.evo_msa)


def worker(args) -> dict | None:
    torch.set_num_threads(args.threads)
    init_distributed(timeout=300)
    rank, world = dist.get_rank(), dist.get_world_size()
    factory, loss = make_workload(args)
    plain = factory()
    nparams = sum(p.numel() for p in plain.parameters())
    engines = {name: Engine(name, factory, loss, args, world) for name in args.configs}
    compute, flat_s = _run_rounds(engines, plain, loss, torch.zeros(nparams), args)
    result = {"compute_s": statistics.median(compute), "flat_all_reduce_s": statistics.median(flat_s),
              "configs": {}}
    result["flat_busbw_gbs"] = bus_bw(4 * nparams, result["flat_all_reduce_s"], world)
    for name, e in engines.items():
        result["configs"][name] = _config_row(e, result, 4 * nparams, world)
    base = result["configs"].get("torch_ddp", {}).get("step_s")
    for row in result["configs"].values():
        row["ratio_to_torch_ddp"] = row["step_s"] / base if base else None
    ours = [e.model for e in engines.values() if isinstance(e.model, DataParallel)]
    layouts = ours[0].layouts if ours else build_layout(  # the layout ours would use
        [(n, tuple(p.shape), dtype_name(p.dtype)) for n, p in plain.named_parameters()], world,
        int(args.bucket_mb * 2**20 / 4), ParallelConfig().param_align)
    result["zero1_bounds"] = zero1_bounds(result, critical_path_times(plain, loss, layouts),
                                          zero1_transfers(nparams, world))
    result["collectives"] = collective_choice(world)
    _describe_run(result, args, rank, world, nparams)
    for e in engines.values():
        e.settle()
    dist.barrier()
    dist.destroy_process_group()  # a clean exit (an exit with live gloo pairs can abort)
    return result if rank == 0 else None


def table(res: dict) -> str:
    lines = [f"{res['workload']['model']}: {res['num_params'] / 1e6:.2f}M params, "
             f"{res['world_size']} ranks ({res['backend']}); compute {1e3 * res['compute_s']:.1f} "
             f"ms, flat all_reduce {1e3 * res['flat_all_reduce_s']:.1f} ms "
             f"({res['flat_busbw_gbs']:.2f} GB/s bus)",
             f"{'config':<16} {'step ms':>8} {'ratio':>6} {'cpu ms':>7} {'exposed':>8} {'comm':>7} "
             f"{'exp/comm':>8} {'opt MB':>7} {'res MB':>7} {'busbw':>6}"]
    for name, r in res["configs"].items():
        ratio = r["exposed_over_total_comm"]
        rel = r["ratio_to_torch_ddp"]
        lines.append(f"{name:<16} {1e3 * r['step_s']:8.1f} {'-' if rel is None else f'{rel:.2f}':>6} "
                     f"{1e3 * r['cpu_s']:7.1f} "
                     f"{1e3 * r['exposed_comm_s']:8.1f} {1e3 * r['total_comm_s']:7.1f} "
                     f"{'-' if ratio is None else f'{ratio:.2f}':>8} "
                     f"{r['optimizer_state_bytes'] / 2**20:7.1f} {r['resident_mb']:7.1f} "
                     f"{r.get('bucketed_busbw_gbs', float('nan')):6.2f}")
    lines.append("cpu ms/step by thread: " + "; ".join(
        f"{name} " + " ".join(f"{role.split()[0]} {1e3 * cpu:.1f}"
                              for role, cpu in r.get("cpu_s_by_thread", {}).items())
        for name, r in res["configs"].items()))
    b = res.get("zero1_bounds")
    if b:
        rel = b["floor_ratio_to_torch_ddp"]
        over = b["ours_distopt_over_floor"]
        ms = {k: 1e3 * v for k, v in b.items() if k.endswith("_s")}
        lines.append(f"ZeRO-1 floor {ms['floor_s']:.1f} ms = max(link "
                     f"{ms['link_bound_s']:.1f} [transfers + turnaround "
                     f"{ms['turnaround_s']:.1f} + norm all_reduce {ms['norm_allreduce_s']:.2f}], "
                     f"schedule {ms['schedule_bound_s']:.1f}, compute {ms['compute_bound_s']:.1f})"
                     f"; floor/torch_ddp {'-' if rel is None else f'{rel:.3f}'}, "
                     f"ours_distopt/floor {'-' if over is None else f'{over:.3f}'}")
    c = res["collectives"]
    lines.append(f"{c['backend']} 16 MB: all_reduce {1e3 * c['all_reduce_s']:.1f} ms; vs that: "
                 + ", ".join(f"{n} {1e3 * c[n + '_s']:.1f} ms ({c[n + '_over_all_reduce']:.2f}x)"
                             for n in ("reduce_scatter", "all_gather", "ring_reduce_scatter",
                                       "ring_all_gather")))
    lines.append("peak RSS per rank: " + ", ".join(f"rank {p['rank']} {p['peak_rss_mb']:.0f} MB"
                                                  for p in res["per_rank"]))
    return "\n".join(lines)


def _spawned(rank: int, world: int, port: int, args, queue):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    res = worker(args)
    if res is not None:
        queue.put(res)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help="run as one rank under a launcher")
    ap.add_argument("--nproc", type=int, default=2, help="local ranks to spawn (not --worker)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ddp.json")
    ap.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    ap.add_argument("--model", default="mlp", choices=["mlp", "evoformer"])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8, help="8 × 1024² ≈ 8.4M params")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--accel-ms", type=float, default=0.0,
                    help="mlp: simulated accelerator time per fwd+bwd (sleeps, CPU idle), as on a "
                         "GPU cluster where the host CPU is free while kernels run; 0 = off")
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per config per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--clip-grad", type=float, default=1.0,
                    help="global grad-norm clipping in every config (AF2/OpenFold training clips; "
                         "ours computes the global norm every step anyway); 0 = off")
    ap.add_argument("--evo-config", default="small.yaml")
    ap.add_argument("--evo-len", type=int, default=32)
    ap.add_argument("--evo-msa", type=int, default=16)
    ap.add_argument("--label", default="", help="free text stored in the result (e.g. netsim)")
    args = ap.parse_args(argv)
    if args.accel_ms < 0:
        ap.error(f"--accel-ms {args.accel_ms}: expected >= 0 (simulated accelerator ms per step)")
    if args.accel_ms > 0 and args.model != "mlp":
        ap.error("--accel-ms applies to --model mlp only")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        res = worker(args)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [ctx.Process(target=_spawned, args=(r, args.nproc, port, args, queue))
                 for r in range(args.nproc)]
        for p in procs:
            p.start()
        res = queue.get(timeout=3600)
        for p in procs:
            p.join()
    if res is None:
        return 0
    res["label"] = args.label
    res["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["torch"] = torch.__version__
    print(table(res))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.model == "mlp":  # the main result; rows of other models already there are kept
        if "other_models" in existing:
            res["other_models"] = existing["other_models"]
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    else:
        existing.setdefault("other_models", {})[args.model] = res
        args.out.write_text(json.dumps(existing, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
