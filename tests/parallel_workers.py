"""Worker side of the multi-process parallel tests (spawned by tests/test_parallel_dist.py).

Workers never assert: a failed assertion on one rank would leave the others waiting in a
collective. Each rank records numbers/flags into a dict that the test process checks; an
unexpected exception is recorded too. Processes exit with os._exit (no teardown that could hang).
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import multiprocessing as mp
from torch import nn

IN, HID, OUT, MB = 6, 24, 3, 2
CKPT_GLOBAL = 12  # samples per step in the checkpoint chain: same at dp 3, 2 and 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- spawning
def _entry(rank: int, world: int, port: int, jobs: list[str], outdir: str, timeout_s: float):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from protdp.parallel import init_distributed

    for job in jobs:  # one process group serves several jobs: spawning is the slow part
        result: dict = {}
        try:
            if not dist.is_initialized():
                init_distributed(timeout=timeout_s)
            getattr(sys.modules[__name__], job)(rank, world, Path(outdir), result)
        except BaseException as exc:  # recorded for the test process, never re-raised here
            result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        torch.save(result, Path(outdir) / f"{job}_rank{rank}.pt")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(jobs: str | list[str], world: int, outdir: Path, timeout_s: float = 60.0,
          deadline_s: float = 170.0) -> dict[str, list[dict]]:
    """Run each `job(rank, world, outdir, result)` in turn on `world` gloo ranks (one process
    group); return {job: [result of rank 0, rank 1, ...]}.

    Plain spawned processes (not torch's ProcessContext, which kills all ranks as soon as one
    exits non-zero — test (i) needs the survivors to keep running until they report).
    """
    jobs = [jobs] if isinstance(jobs, str) else list(jobs)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, jobs, str(outdir), timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    t_end = time.monotonic() + deadline_s
    try:
        for p in procs:
            p.join(max(0.0, t_end - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        if hung:
            raise TimeoutError(f"{jobs} on {world} ranks: ranks {hung} still running after "
                               f"{deadline_s} s")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return {job: [torch.load(outdir / f"{job}_rank{r}.pt", weights_only=False)
                  for r in range(world)] for job in jobs}


# ---------------------------------------------------------------------------- helpers
def make_net(seed: int = 0, hidden: int = HID, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, OUT)).to(dtype)


def global_batch(step: int, size: int, nan: bool = False):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(size, IN, generator=g), torch.randn(size, OUT, generator=g)
    return x, y


def local_rows(micro: int, rank: int, world: int) -> slice:
    """Rows of micro-batch `micro` of a global batch that `rank` processes."""
    start = (micro * world + rank) * MB
    return slice(start, start + MB)


def loss_fn(model, x, y):
    return ((model(x).float() - y) ** 2).mean()


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in module.parameters()])


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def cfg(world: int, acc: int = 1, **kw):
    from protdp.parallel import ParallelConfig

    kw.setdefault("bucket_size", 300)
    kw.setdefault("param_align", 4)
    return ParallelConfig(data_parallel_size=world, micro_batch_size=MB,
                          global_batch_size=MB * world * acc, **kw)


def train_ours(world, rank, config, steps, net=None, start_step=0, opt_kw=None, nan_at=(),
               nan_rank=None, model=None, opt=None):
    """Run `steps` optimizer steps with our engine; returns (model, opt, step results)."""
    from protdp.parallel import DataParallel, DistributedOptimizer

    if model is None:
        model = DataParallel(net if net is not None else make_net(), config)
        model.broadcast_params()
        opt = DistributedOptimizer(model, config, **(opt_kw or {"lr": 1e-2, "weight_decay": 0.1}))
    acc = config.num_micro_batches
    applied = []
    for step in range(start_step, start_step + steps):
        x, y = global_batch(step, MB * world * acc)
        opt.zero_grad()
        for i in range(acc):
            rows = local_rows(i, rank, world)
            xi = x[rows].clone()
            if step in nan_at and rank == nan_rank:
                xi[0, 0] = float("nan")
            ctx = model.no_sync() if i < acc - 1 else contextlib.nullcontext()
            with ctx:
                (loss_fn(model, xi.to(next(model.parameters()).dtype), y[rows]) / acc).backward()
        applied.append(opt.step())
    model.finish_param_sync()
    return model, opt, applied


def train_reference(steps, world, acc=1, clip=0.0, start=None, opt_kw=None, start_step=0):
    """Single process, full global batch, torch.optim.AdamW (+ clip_grad_norm_)."""
    net = make_net() if start is None else start
    ref = torch.optim.AdamW(net.parameters(), **(opt_kw or {"lr": 1e-2, "weight_decay": 0.1}))
    norms = []
    for step in range(start_step, start_step + steps):
        x, y = global_batch(step, MB * world * acc)
        ref.zero_grad()
        loss_fn(net, x, y).backward()
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip)))
        ref.step()
    return net, norms


def ranks_agree(t: torch.Tensor, world: int) -> float:
    """Max abs difference of `t` between this rank and every other rank."""
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return max((o - t).abs().max().item() for o in out)


# ---------------------------------------------------------------------------- jobs
def suite(rank: int, world: int, outdir: Path, res: dict):
    """Checks (a)–(f) and the unused-parameter policy on one process group."""
    from protdp.errors import ConfigError
    from protdp.parallel import DataParallel, DistributedOptimizer, NonFiniteGradientError

    # (a) grads after our sync == torch DDP == single process on the full batch
    x, y = global_batch(0, MB * world)
    rows = local_rows(0, rank, world)
    ours = DataParallel(make_net(), cfg(world))
    ours.broadcast_params()
    loss_fn(ours, x[rows], y[rows]).backward()
    ours.finish_grad_sync()
    g_ours = torch.cat([p.main_grad.reshape(-1) for p in ours.module.parameters()])
    ddp = torch.nn.parallel.DistributedDataParallel(make_net())
    loss_fn(ddp, x[rows], y[rows]).backward()
    g_ddp = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()])
    single = make_net()
    loss_fn(single, x, y).backward()
    g_single = torch.cat([p.grad.reshape(-1) for p in single.parameters()])
    res["a_ours_vs_ddp"] = max_rel(g_ours, g_ddp)
    res["a_ours_vs_single"] = max_rel(g_ours, g_single)
    res["a_num_buckets"] = len(ours.layouts[0].buckets)
    res["a_comm"] = dict(ours.last_grad_sync)
    del ddp

    # (b) 20 steps of ours + distributed optimizer == single-process AdamW
    ref20, _ = train_reference(20, world)
    m, opt, _ = train_ours(world, rank, cfg(world, use_distributed_optimizer=True), 20)
    res["b_distopt_vs_ref"] = max_rel(flat(m.module), flat(ref20))
    res["b_state_bytes"] = opt.state_bytes()
    res["b_auto_collectives"] = (m.grad_collective, m.param_collective)
    # every gradient-reduction / param-gather collective, overlapped, against the reference
    ref6, _ = train_reference(6, world)
    res["b_by_collective"] = {}
    for grc in ("all_reduce", "reduce_scatter", "ring_reduce_scatter"):
        for pgc in ("all_gather", "ring_all_gather"):
            mc, _, _ = train_ours(world, rank, cfg(
                world, use_distributed_optimizer=True, overlap_param_gather=True,
                grad_reduce_collective=grc, param_gather_collective=pgc), 6)
            res["b_by_collective"][f"{grc}+{pgc}"] = max_rel(flat(mc.module), flat(ref6))
    for grc in ("all_reduce", "ring_all_reduce"):  # without the distributed optimizer
        mc, _, _ = train_ours(world, rank, cfg(world, grad_reduce_collective=grc), 6)
        res["b_by_collective"][f"{grc} (plain)"] = max_rel(flat(mc.module), flat(ref6))
        res[f"b_ranks_agree_{grc}"] = ranks_agree(flat(mc.module), world)
    m, opt, _ = train_ours(world, rank, cfg(world), 20)
    res["b_plain_vs_ref"] = max_rel(flat(m.module), flat(ref20))
    res["b_plain_state_bytes"] = opt.state_bytes()
    res["b_auto_plain"] = m.grad_collective
    res["b_total_params"] = sum(p.numel() for p in m.module.parameters())
    res["b_ranks_agree"] = ranks_agree(flat(m.module), world)

    # SGD with momentum, sharded, against torch.optim.SGD
    sgd_kw = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}
    m, _, _ = train_ours(world, rank, cfg(world, use_distributed_optimizer=True), 10,
                         opt_kw={"optimizer": "sgd", **sgd_kw})
    net = make_net()
    sgd = torch.optim.SGD(net.parameters(), **sgd_kw)
    for step in range(10):
        xs, ys = global_batch(step, MB * world)
        sgd.zero_grad()
        loss_fn(net, xs, ys).backward()
        sgd.step()
    res["b_sgd_vs_ref"] = max_rel(flat(m.module), flat(net))

    # (c) overlap on vs off -> bitwise identical params (plus overlapped param gather)
    finals = {}
    for name, kw in {"off": dict(overlap_grad_reduce=False),
                     "on": dict(overlap_grad_reduce=True),
                     "on+param_gather": dict(overlap_grad_reduce=True, overlap_param_gather=True)
                     }.items():
        m, _, _ = train_ours(world, rank, cfg(world, use_distributed_optimizer=True, **kw), 6)
        finals[name] = flat(m.module)
    res["c_bitwise_on_off"] = bool(torch.equal(finals["on"], finals["off"]))
    res["c_bitwise_param_gather"] = bool(torch.equal(finals["on+param_gather"], finals["off"]))

    # (d) accumulation over 3 micro-batches == one big batch
    acc = 3
    x, y = global_batch(0, MB * world * acc)
    m = DataParallel(make_net(), cfg(world, acc=acc))
    for i in range(acc):
        ctx = m.no_sync() if i < acc - 1 else contextlib.nullcontext()
        with ctx:
            r = local_rows(i, rank, world)
            (loss_fn(m, x[r], y[r]) / acc).backward()
    m.finish_grad_sync()
    g_acc = torch.cat([p.main_grad.reshape(-1) for p in m.module.parameters()])
    big = make_net()
    loss_fn(big, x, y).backward()
    res["d_grad_vs_big_batch"] = max_rel(g_acc, torch.cat([p.grad.reshape(-1)
                                                           for p in big.parameters()]))
    m, _, _ = train_ours(world, rank, cfg(world, acc=acc, use_distributed_optimizer=True), 8)
    ref_acc, _ = train_reference(8, world, acc=acc)
    res["d_params_vs_ref"] = max_rel(flat(m.module), flat(ref_acc))

    # (e) clipping: our global norm vs an fp64 reference; clipped training vs clip_grad_norm_
    # (SGD: linear in the clipped grad, so params check the clip coefficient tightly; AdamW on
    # clipped grads of ~eps size amplifies fp32 rounding: fp32 vs fp64 torch differ by ~3e-6)
    clip = 0.05
    sgd_kw = {"lr": 0.05, "momentum": 0.9}
    m, opt, _ = train_ours(world, rank, cfg(world, use_distributed_optimizer=True), 5,
                           opt_kw={"optimizer": "sgd", "clip_grad": clip, **sgd_kw})
    net = make_net()
    sgd = torch.optim.SGD(net.parameters(), **sgd_kw)
    ref_norms = []
    for step in range(5):
        xs, ys = global_batch(step, MB * world)
        sgd.zero_grad()
        loss_fn(net, xs, ys).backward()
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip)))
        sgd.step()
    res["e_params_vs_ref"] = max_rel(flat(m.module), flat(net))
    # norm of step 5's gradient (the last one) in fp64 from the same params before that step
    m4, _, _ = train_ours(world, rank, cfg(world, use_distributed_optimizer=True), 4,
                          opt_kw={"optimizer": "sgd", "clip_grad": clip, **sgd_kw})
    net64 = copy.deepcopy(m4.module).double()
    xs, ys = global_batch(4, MB * world)
    loss_fn(net64, xs.double(), ys.double()).backward()
    norm64 = torch.sqrt(sum((p.grad ** 2).sum() for p in net64.parameters())).item()
    res["e_norm_ours"] = opt.last_grad_norm
    res["e_norm_fp64"] = norm64
    res["e_norm_torch_fp32"] = ref_norms[-1]
    res["e_clip_active"] = norm64 > clip
    # the same at a realistic bucket size: one 2M-element bucket, each rank's shard >= 0.7M
    # elements (a single fp32 vector_norm over a shard that size is off by ~3e-5)
    from protdp.parallel import DataParallel, DistributedOptimizer
    torch.manual_seed(7)
    big = nn.Linear(2048, 1024)
    big64 = copy.deepcopy(big).double()
    model = DataParallel(big, cfg(world, use_distributed_optimizer=True, bucket_size=2**22))
    opt = DistributedOptimizer(model, lr=0.0, clip_grad=1e-3)
    g = torch.Generator().manual_seed(8)
    xb, yb = torch.randn(4 * world, 2048, generator=g), torch.randn(4 * world, 1024, generator=g)
    rows = slice(4 * rank, 4 * rank + 4)
    loss_fn(model, xb[rows], yb[rows]).backward()
    opt.step()
    loss_fn(big64, xb.double(), yb.double()).backward()
    res["e_big_norm_ours"] = opt.last_grad_norm
    res["e_big_norm_fp64"] = torch.sqrt(sum((p.grad ** 2).sum() for p in big64.parameters())).item()

    # (f) NaN on the last rank at step 2 -> every rank skips that step and stays in sync
    nan_rank = world - 1
    config = cfg(world, use_distributed_optimizer=True, max_consecutive_skipped_steps=3)
    m, opt, _ = train_ours(world, rank, config, 2)
    before = flat(m.module)
    m, opt, applied = train_ours(world, rank, config, 1, start_step=2, nan_at={2},
                                 nan_rank=nan_rank, model=m, opt=opt)
    res["f_applied_nan_step"] = applied[0]
    res["f_params_unchanged"] = bool(torch.equal(before, flat(m.module)))
    res["f_skipped_ranks"] = opt.last_skipped_ranks
    m, opt, applied = train_ours(world, rank, config, 2, start_step=3, model=m, opt=opt)
    res["f_applied_after"] = applied
    res["f_skipped_steps"] = opt.skipped_steps
    res["f_ranks_agree"] = ranks_agree(flat(m.module), world)
    try:
        train_ours(world, rank, config, 5, start_step=5, nan_at={5, 6, 7, 8, 9},
                   nan_rank=nan_rank, model=m, opt=opt)
        res["f_abort"] = None
    except NonFiniteGradientError as exc:
        res["f_abort"] = str(exc)

    # unused-parameter policy: error naming the param by default, zero grads when allowed
    for allow in (False, True):
        net = make_net()
        net.register_parameter("unused", nn.Parameter(torch.ones(5)))  # Sequential ignores it
        m = DataParallel(net, cfg(world, allow_unused_parameters=allow))
        loss_fn(m, x[rows], y[rows]).backward()
        try:
            m.finish_grad_sync()
            res[f"unused_allow{allow}"] = ("ok", float(m.module.unused.main_grad.abs().sum()))
        except ConfigError as exc:
            res[f"unused_allow{allow}"] = ("error", str(exc))

    # bf16 model params with fp32 masters (dist-opt): all ranks hold identical bf16 params
    m, opt, _ = train_ours(world, rank, cfg(world, use_distributed_optimizer=True), 5,
                           net=make_net(dtype=torch.bfloat16))
    res["bf16_params"] = flat(m.module)
    res["bf16_ranks_agree"] = ranks_agree(flat(m.module), world)
    res["bf16_master_dtype"] = str(opt._shards[0].master.dtype)


class SharedNet(nn.Module):
    """One hidden Linear applied twice, each time under reentrant activation checkpointing: its
    gradient is accumulated twice per backward (two inner backward passes), so its hook fires
    twice. Without checkpointing the same function (the reference)."""

    def __init__(self, reentrant: bool):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.shared, self.out = nn.Linear(IN, HID), nn.Linear(HID, HID), nn.Linear(HID, OUT)
        self.reentrant = reentrant

    def _block(self, h):
        return torch.tanh(self.shared(h))

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for _ in range(2):
            h = (torch.utils.checkpoint.checkpoint(self._block, h, use_reentrant=True)
                 if self.reentrant else self._block(h))
        return self.out(h)


def shared_params(rank: int, world: int, outdir: Path, res: dict):
    """Parameters used more than once per backward: counts learned on the first step."""
    ref, _ = train_reference(5, world, start=SharedNet(reentrant=False))
    for name, kw in {"plain": {}, "distopt": dict(use_distributed_optimizer=True)}.items():
        m, _, _ = train_ours(world, rank, cfg(world, **kw), 5, net=SharedNet(reentrant=True))
        res[f"shared_{name}_vs_ref"] = max_rel(flat(m.module), flat(ref))
        res[f"shared_{name}_expected"] = dict(m.expected_grads)


def checkpoints(rank: int, world: int, outdir: Path, res: dict):
    """(g) save/load with resharding; run in the order world 3 -> 2 -> 1 on one directory."""
    from protdp.parallel import load_checkpoint, save_checkpoint

    config = cfg(world, acc=CKPT_GLOBAL // (MB * world), use_distributed_optimizer=True)
    load_from = {3: None, 2: outdir / "ckpt_w3", 1: outdir / "ckpt_w2"}[world]
    if load_from is None:
        m, opt, _ = train_ours(world, rank, config, 3)
    else:
        m, opt, _ = train_ours(world, rank, config, 0)
        extra = load_checkpoint(load_from, m, opt)
        res["extra"] = extra
    save_checkpoint(outdir / f"ckpt_w{world}", m, opt, extra={"step": 3, "world": world})
    m, opt, _ = train_ours(world, rank, config, 3, start_step=3, model=m, opt=opt)
    res["continued_params"] = flat(m.module)
    res["continued_ranks_agree"] = ranks_agree(flat(m.module), world)
    res["state_step"] = opt.state_dict()["step"]
    if world == 1:  # a crash in the middle of a save leaves the previous checkpoint loadable
        path = outdir / "ckpt_w1"
        class Boom(RuntimeError):
            pass

        def crash():
            raise Boom("simulated crash while writing the optimizer shard")

        opt.state_dict = crash
        try:
            save_checkpoint(path, m, opt)
        except Boom:
            res["crash_raised"] = True
        del opt.state_dict
        m2, opt2, _ = train_ours(world, rank, config, 0)
        load_checkpoint(path, m2, opt2)
        res["after_crash_loaded_extra_world"] = torch.load(
            path / "model.pt", weights_only=True)["extra"]["world"]
        res["after_crash_tmp_left"] = (outdir / "ckpt_w1.tmp").exists()
        from protdp.errors import InputError
        wrong, wrong_opt, _ = train_ours(world, rank, config, 0, net=make_net(hidden=HID + 2))
        try:
            load_checkpoint(path, wrong, wrong_opt)
            res["wrong_model_error"] = None
        except InputError as exc:
            res["wrong_model_error"] = str(exc)


def ring_window(rank: int, world: int, outdir: Path, res: dict):
    """Many ring collectives in flight on the comm thread while the ranks submit them with
    random skew (the pattern that deadlocked 3 ranks when the worker waited on the oldest posted
    step instead of the oldest op); every result must equal the exact sum."""
    import random

    from protdp.parallel import ring

    worker = ring.shared_worker()
    ranks = list(range(world))
    rng = random.Random(1000 + rank)  # different skew on every rank
    ops = (ring.ring_all_reduce, ring.ring_reduce_scatter, ring.ring_all_gather)
    worst = 0.0
    t0 = time.monotonic()
    for it in range(40):
        bufs, futures = [], []
        for k in range(6):
            op = ops[(it + k) % len(ops)]
            buf = torch.arange(world * (7 + 13 * k), dtype=torch.float64) * (rank + 1)
            bufs.append((op, buf.clone(), buf))
            futures.append(worker.submit(
                lambda seq, op=op, b=buf: op(b, None, ranks, rank, seq), group=None))
            time.sleep(rng.random() * 0.002)
        for (op, orig, buf), fut in zip(bufs, futures):
            fut.result(timeout=30)
            chunks = buf.view(world, -1)
            base = orig.view(world, -1) / (rank + 1)
            total = base * (world * (world + 1) / 2)
            if op is ring.ring_all_gather:  # chunk r of every rank came from rank r
                want = torch.stack([base[r] * (r + 1) for r in range(world)])
                worst = max(worst, (chunks - want).abs().max().item())
            elif op is ring.ring_reduce_scatter:
                worst = max(worst, (chunks[rank] - total[rank]).abs().max().item())
            else:
                worst = max(worst, (chunks - total).abs().max().item())
    res["ring_window_max_err"] = worst
    res["ring_window_seconds"] = time.monotonic() - t0
    res["ring_window_size"] = worker.window


def failures(rank: int, world: int, outdir: Path, res: dict):
    """(h) layout mismatch -> clear error everywhere; (i) a rank dies -> others fail in time."""
    from protdp.errors import DistributedError
    from protdp.parallel import DataParallel, DistributedOptimizer

    from protdp.errors import ConfigError
    try:  # params on two devices: refused before any buffer is built or collective issued
        DataParallel(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta")), cfg(world))
        res["device_error"] = None
    except ConfigError as exc:
        res["device_error"] = str(exc)
    try:  # gloo's rings on a non-CPU device: refused with the way out, before any collective
        DataParallel(nn.Linear(2, 2, device="meta"), cfg(world))
        res["ring_device_error"] = None
    except ConfigError as exc:
        res["ring_device_error"] = str(exc)
    t0 = time.monotonic()
    try:
        DataParallel(make_net(hidden=HID + (1 if rank == world - 1 else 0)), cfg(world))
        res["h_error"] = None
    except DistributedError as exc:
        res["h_error"] = str(exc)
    res["h_seconds"] = time.monotonic() - t0
    # the group is still usable after the mismatch was reported
    model = DataParallel(make_net(), cfg(world, use_distributed_optimizer=True))
    opt = DistributedOptimizer(model, lr=1e-2)
    dist.barrier()
    if rank == world - 1:
        torch.save(res, outdir / f"failures_rank{rank}.pt")
        os._exit(1)  # dies without a word
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        x, y = global_batch(0, MB * world)
        loss_fn(model, x[local_rows(0, rank, world)], y[local_rows(0, rank, world)]).backward()
        opt.step()
        res["i_error"] = None
    except DistributedError as exc:
        res["i_error"] = str(exc)
    res["i_seconds"] = time.monotonic() - t0


def timeouts(rank: int, world: int, outdir: Path, res: dict):
    """A live peer that skips a collective: the waiting rank gets a timeout naming rank + op."""
    from datetime import timedelta

    from protdp.errors import DistributedError
    from protdp.parallel import DataParallel

    group = dist.new_group(timeout=timedelta(seconds=3))  # short timeout only for this check
    model = DataParallel(make_net(), cfg(world), process_group=group)
    if rank == world - 1:
        time.sleep(6)  # alive but diverged: never joins the broadcast below
        return
    t0 = time.monotonic()
    try:
        model.broadcast_params()
        res["timeout_error"] = None
    except DistributedError as exc:
        res["timeout_error"] = str(exc)
    res["timeout_seconds"] = time.monotonic() - t0
