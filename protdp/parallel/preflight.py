"""Preflight: will the network hide this model's gradient traffic at this data-parallel size?

Megatron-LM's advice before a large run: assess the network first, start from pure data
parallelism, enable --overlap-grad-reduce and verify near-linear speed-up before anything else,
and watch the ratio of communication to computation. `run_preflight` (launched like training,
one process per rank) measures, on the ranks and network the run will use:

  - the model's forward and backward time per micro-batch, with every rank computing at once
    (co-located ranks share cores and memory bandwidth) and on rank 0 alone, plus when each
    gradient bucket's last gradient arrives in backward and when forward first needs each
    bucket's parameters (hooks on the real model);
  - the engine's bucket collectives at the engine's bucket sizes (`protdp.parallel.netperf`:
    all_reduce, reduce_scatter, all_gather, nccl-tests algbw / busbw) alone and back to back,
    the optimizer's small norm all_reduce, and the latency and bandwidth of every rank pair;
  - the optimizer step (AdamW + grad norm) over all parameters and over a 1/dp shard;

and predicts (`protdp.parallel.step_model`) the step time, exposed communication and scaling
efficiency of each engine configuration, names a link far slower than the others, and gives a
verdict. `render` prints the report as a table.
"""

from __future__ import annotations

import socket
import statistics
import time

import torch
import torch.distributed as dist

from protdp.parallel import netperf
from protdp.parallel.buffer import build_layout
from protdp.parallel.config import ParallelConfig
from protdp.parallel.step_model import (OPS, Contention, StepPieces, fit_contention,
                                        fit_latency_bandwidth, predict_all, slowest_link,
                                        verdict)
from protdp.parallel.workload import Workload

FORMAT = "protdp-preflight-v1"
MAX_SWEEP_SIZES = 6   # distinct bucket sizes measured one by one (others from the fit)
# fp32 elements measured besides the buckets (64 KiB, 1 MiB, 16 MiB) so the latency + bytes /
# bandwidth fit spans sizes (`protdp plan --network` extrapolates it to other dp and buckets)
PROBE_NUMELS = (2**14, 2**18, 2**22)


# ---------------------------------------------------------------------------- compute
def _bucket_hooks(model, buckets: list[tuple[str, ...]], marks: dict) -> list:
    """Record the last gradient time per bucket and the first forward use per bucket."""
    bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
    by_id = {id(p): bucket_of[n] for n, p in model.named_parameters() if n in bucket_of}
    handles = [p.register_post_accumulate_grad_hook(
        lambda _p, i=by_id[id(p)]: marks["ready"].__setitem__(i, time.perf_counter()))
        for p in model.parameters() if id(p) in by_id]

    def first_use(own: tuple[int, ...]):
        def hook(_module, _args):  # returns None: the module's inputs stay as they are
            for i in own:
                marks["need"].setdefault(i, time.perf_counter())
        return hook

    for mod in model.modules():
        own = tuple(sorted({by_id[id(p)] for p in mod.parameters(recurse=False) if id(p) in by_id}))
        if own:
            handles.append(mod.register_forward_pre_hook(first_use(own)))
    return handles


def profile_compute(model, loss_fn, buckets: list[tuple[str, ...]], reps: int,
                    device: torch.device) -> dict:
    """Median forward / backward seconds of one micro-batch and, per bucket (reduction order),
    when its last gradient arrived after backward start and when forward first used it."""
    marks: dict = {"ready": {}, "need": {}}
    handles = _bucket_hooks(model, buckets, marks)
    rows = []
    try:
        for rep in range(reps + 1):  # the first run is a warm-up (allocator, lazy init)
            # keep the gradient tensors: the engine accumulates into its preallocated buffer,
            # while fresh ones would cost allocation and page faults in every backward
            model.zero_grad(set_to_none=False)
            marks["ready"].clear()
            marks["need"].clear()
            netperf.synchronize(device)
            t0 = time.perf_counter()
            loss = loss_fn(model)
            netperf.synchronize(device)
            t1 = time.perf_counter()
            loss.backward()
            netperf.synchronize(device)
            t2 = time.perf_counter()
            if rep:
                rows.append({"forward_s": t1 - t0, "backward_s": t2 - t1,
                             "ready": [marks["ready"].get(i, t1) - t1 for i in range(len(buckets))],
                             "need": [marks["need"].get(i, t1) - t0 for i in range(len(buckets))]})
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {"forward_s": med("forward_s"), "backward_s": med("backward_s"),
            "bucket_ready_s": [statistics.median(r["ready"][i] for r in rows)
                               for i in range(len(buckets))],
            "bucket_need_s": [statistics.median(r["need"][i] for r in rows)
                              for i in range(len(buckets))]}


def _alone_on_rank0(model, loss_fn, buckets, reps, device) -> float | None:
    """fwd+bwd of rank 0 while the others wait in a blocking receive (no CPU spent)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1)
    dist.barrier()
    if rank == 0:
        prof = profile_compute(model, loss_fn, buckets, reps, device)
        for r in range(1, world):
            dist.send(token, r, tag=netperf.LINK_TAG + 1)
        return prof["forward_s"] + prof["backward_s"]
    dist.recv(token, 0, tag=netperf.LINK_TAG + 1)
    return None


def _time_adamw(numel: int, device: torch.device, reps: int) -> float:
    """Median seconds of the grad norm + one fused AdamW step over `numel` fp32 parameters."""
    from protdp.parallel.clip_grads import sum_of_squares_fp64

    flat = torch.zeros(numel, device=device, requires_grad=True)
    flat.grad = torch.full_like(flat, 1e-3)
    opt = torch.optim.AdamW([flat], lr=1e-4, fused=device.type in ("cpu", "cuda"))
    times = []
    for rep in range(reps + 1):  # the first step creates the Adam state
        netperf.synchronize(device)
        t0 = time.perf_counter()
        sum_of_squares_fp64(flat.grad)
        opt.step()
        netperf.synchronize(device)
        if rep:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_optimizer(numel: int, dp: int, device: torch.device, reps: int) -> dict:
    """The optimizer step over all parameters (plain DP) and over a 1/dp shard (distributed
    optimizer)."""
    return {"full_s": _time_adamw(numel, device, reps),
            "shard_s": _time_adamw(-(-numel // dp), device, reps)}


def profile_overlap(model, loss_fn, c: netperf.EngineCollectives, buckets: list[tuple[str, ...]],
                    numels: list[int], reps: int, device: torch.device) -> tuple[float, float]:
    """Median (backward end, last bucket reduced), seconds after backward start, with each
    bucket's all-reduce launched in bucket order as its last gradient arrives: the engine's
    --overlap-grad-reduce, so compute and communication share the host as they will."""
    bufs = [torch.zeros(n, device=device) for n in numels]
    bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
    state: dict = {}

    def launch_ready(force: bool = False):
        while state["next"] < len(bufs) and (
                force or state["counts"][state["next"]] >= len(buckets[state["next"]])):
            state["pending"].append(c.launch("all_reduce", bufs[state["next"]]))
            state["next"] += 1

    def ready(i: int):
        state["counts"][i] += 1
        launch_ready()

    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=bucket_of[n]: ready(i))
               for n, p in model.named_parameters() if n in bucket_of]
    rows = []
    try:
        for rep in range(reps + 1):
            state.update(counts=[0] * len(bufs), next=0, pending=[])
            model.zero_grad(set_to_none=False)
            dist.barrier()
            loss = loss_fn(model)
            netperf.synchronize(device)
            t0 = time.perf_counter()
            loss.backward()
            launch_ready(force=True)      # finish_grad_sync launches what is left
            netperf.synchronize(device)
            t_compute = time.perf_counter() - t0
            for pending in state["pending"]:
                if pending is not None:
                    pending.wait()
            netperf.synchronize(device)
            if rep:
                rows.append((t_compute, time.perf_counter() - t0))
    finally:
        for h in handles:
            h.remove()
    return (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))


# ---------------------------------------------------------------------------- network
def bucket_layout(workload: Workload, cfg: ParallelConfig, dp: int):
    """(params per bucket, padded numel per bucket) in reduction order, the parameter count and
    dtype: `build_layout` over the model's parameters built on the meta device."""
    shapes = workload.param_shapes()
    layouts = build_layout(shapes, dp, cfg.resolved_bucket_size, cfg.param_align)
    buckets = [(b.params, b.numel) for lay in layouts for b in lay.buckets]
    nparams = sum(int(torch.Size(s).numel()) for _, s, _ in shapes)
    return [p for p, _ in buckets], [n for _, n in buckets], nparams, layouts[0].dtype


def _sweep_sizes(numels: list[int], dp: int) -> list[int]:
    """The distinct bucket sizes, thinned to MAX_SWEEP_SIZES spread over their range, and the
    probe sizes (rounded up to split over dp ranks)."""
    sizes = sorted(set(numels))
    if len(sizes) > MAX_SWEEP_SIZES:
        step = (len(sizes) - 1) / (MAX_SWEEP_SIZES - 1)
        sizes = [sizes[round(i * step)] for i in range(MAX_SWEEP_SIZES)]
    return sorted(set(sizes) | {-(-n // dp) * dp for n in PROBE_NUMELS})


def measure_network(numels: list[int], param_dtype: torch.dtype, device: torch.device,
                    reps: int, link_bytes: int) -> dict:
    """The engine's collectives at its bucket sizes, back to back, the norm all_reduce, links."""
    c = netperf.EngineCollectives.for_group(None, device.type)
    return {"backend": c.backend, "engine_collectives": c.names,
            "sweep": netperf.sweep(c, _sweep_sizes(numels, c.ctx.dp), param_dtype, device, reps),
            "sequence_s": netperf.sequence(c, numels, param_dtype, device, reps),
            "norm_all_reduce_s": netperf.small_all_reduce_s(c.ctx.dp, device, 3 * reps),
            "links": netperf.measure_links(link_bytes, reps, device),
            "all_to_all": netperf.all_to_all_sweep(device, reps)}


def per_bucket_times(network: dict, numels: list[int], param_elem: int) -> dict:
    """Seconds per bucket for each op: a latency + bytes / bandwidth fit of the single-bucket
    sweep, scaled so the buckets add up to the measured back-to-back time (the comm thread keeps
    several in flight, which hides part of each one's latency)."""
    out = {}
    for op in OPS:
        elem = param_elem if op == "all_gather" else 4
        latency, bw = fit_latency_bandwidth([(r["bytes"], r["time_s"])
                                             for r in network["sweep"][op]])
        alone = [latency + n * elem / bw for n in numels]
        scale = network["sequence_s"][op] / sum(alone)
        out[op] = {"fit_latency_s": latency, "fit_algbw_Bps": bw, "overlap_scale": scale,
                   "per_bucket_s": [t * scale for t in alone]}
    return out


# ---------------------------------------------------------------------------- run
def run_preflight(workload: Workload, cfg: ParallelConfig, *, reps: int = 5,
                  link_bytes: int = 16 * 2**20, device: torch.device | None = None) -> dict | None:
    """Measure and predict (collective over the world; the report on rank 0, None elsewhere)."""
    from protdp.errors import ConfigError

    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.data_parallel_size != world:
        raise ConfigError(f"--dp {cfg.data_parallel_size} but the launcher started {world} "
                          f"rank(s); launch with {cfg.data_parallel_size} processes")
    device = device or torch.device("cpu")
    buckets, numels, nparams, dtype_name = bucket_layout(workload, cfg, world)
    model = workload.build().to(device)
    param_dtype = next(model.parameters()).dtype
    dist.barrier()
    compute = profile_compute(model, workload.loss, buckets, reps, device)
    alone = (_alone_on_rank0(model, workload.loss, buckets, reps, device) if world > 1
             else compute["forward_s"] + compute["backward_s"])
    optimizer = profile_optimizer(nparams, world, device, reps)
    network = together = None
    if world > 1:
        network = measure_network(numels, param_dtype, device, reps, link_bytes)
        together = profile_overlap(model, workload.loss, netperf.EngineCollectives.for_group(
            None, device.type), buckets, numels, 2 * reps, device)  # noisy: more repeats
    mine = {"rank": rank, "host": socket.gethostname(), "compute": compute,
            "optimizer": optimizer, "together": together}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank != 0:
        return None
    layout = {"parameters": nparams, "dtype": dtype_name, "bucket_size": cfg.resolved_bucket_size,
              "bucket_numel": numels, "grad_bytes": 4 * nparams}
    return build_report(workload, cfg, layout, ranks, alone, network, torch.tensor(
        [], dtype=param_dtype).element_size(), device)


def build_report(workload: Workload, cfg: ParallelConfig, layout: dict, ranks: list[dict],
                 alone_s: float, network: dict | None, param_elem: int,
                 device: torch.device) -> dict:
    """Pieces of the slowest rank (a synchronous step waits for it) -> predictions, verdict."""
    dp, numels = len(ranks), layout["bucket_numel"]
    slow = max(ranks, key=lambda r: r["compute"]["forward_s"] + r["compute"]["backward_s"])
    comp = slow["compute"]
    times = per_bucket_times(network, numels, param_elem) if network else None
    zeros = tuple(0.0 for _ in numels)
    pieces = StepPieces(
        dp=dp, forward_s=comp["forward_s"], backward_s=comp["backward_s"],
        optimizer_s=max(r["optimizer"]["full_s"] for r in ranks),
        optimizer_shard_s=max(r["optimizer"]["shard_s"] for r in ranks),
        bucket_ready_s=tuple(comp["bucket_ready_s"]), bucket_need_s=tuple(comp["bucket_need_s"]),
        all_reduce_s=tuple(times["all_reduce"]["per_bucket_s"]) if times else zeros,
        reduce_scatter_s=tuple(times["reduce_scatter"]["per_bucket_s"]) if times else zeros,
        all_gather_s=tuple(times["all_gather"]["per_bucket_s"]) if times else zeros,
        norm_all_reduce_s=network["norm_all_reduce_s"] if network else 0.0,
        num_micro_batches=cfg.num_micro_batches)
    contention, overlap = Contention(), None
    if network:
        together = [r["together"] for r in ranks]
        overlap = {"backward_end_s": max(t[0] for t in together),
                   "last_bucket_s": max(t[1] for t in together)}
        contention = fit_contention(pieces.backward_s, list(zip(pieces.bucket_ready_s,
                                                                 pieces.all_reduce_s)),
                                    overlap["backward_end_s"], overlap["last_bucket_s"])
    predictions = predict_all(pieces, alone_s, contention)
    return {
        "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "world": {"dp": dp, "device": device.type, "backend": network["backend"] if network
                  else dist.get_backend(), "hosts": sorted({r["host"] for r in ranks})},
        "workload": {"name": workload.name, **workload.description,
                     "global_batch_size": cfg.global_batch_size,
                     "num_micro_batches": cfg.num_micro_batches},
        "layout": layout,
        "compute": {"forward_s": comp["forward_s"], "backward_s": comp["backward_s"],
                    "fwd_bwd_alone_s": alone_s, "slowest_rank": slow["rank"],
                    "per_rank_fwd_bwd_s": [r["compute"]["forward_s"] + r["compute"]["backward_s"]
                                           for r in ranks],
                    "bucket_ready_s": comp["bucket_ready_s"],
                    "bucket_need_s": comp["bucket_need_s"],
                    "overlapped_all_reduce": overlap,
                    "optimizer_full_s": pieces.optimizer_s,
                    "optimizer_shard_s": pieces.optimizer_shard_s},
        "network": {**network, "per_bucket": times} if network else None,
        "slowest_link": slowest_link(network["links"]) if network else None,
        "predictions": predictions,
        "verdict": verdict(pieces, predictions),
    }


# ---------------------------------------------------------------------------- table
def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


def _gbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3f}"


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _network_lines(rep: dict) -> list[str]:
    net = rep["network"]
    lines = ["", f"{'collective (as the engine runs it)':<36}{'size':>9}{'time':>11}"
                 f"{'algbw':>9}{'busbw':>9}  GB/s (nccl-tests)"]
    for op in OPS:
        for row in net["sweep"][op]:
            lines.append(f"  {op + ' = ' + net['engine_collectives'][op]:<34}"
                         f"{_size(row['bytes']):>9}{_ms(row['time_s']):>11}"
                         f"{_gbs(row['algbw_Bps']):>9}{_gbs(row['busbw_Bps']):>9}")
    lines.append("  all buckets back to back: " + ", ".join(
        f"{op} {_ms(net['sequence_s'][op])}" for op in OPS)
        + f"; norm all_reduce {_ms(net['norm_all_reduce_s'])}")
    for row in net.get("all_to_all", []):   # DAP's axis switch (--dap-size over these ranks)
        lines.append(f"  {'all_to_all (DAP axis switch)':<34}{_size(row['bytes']):>9}"
                     f"{_ms(row['time_s']):>11}{_gbs(row['algbw_Bps']):>9}{_gbs(row['busbw_Bps']):>9}")
    lines.append("links (rank pairs, ping-pong):")
    for link in net["links"]:
        lines.append(f"  {link['ranks'][0]}-{link['ranks'][1]}: latency "
                     f"{1e6 * link['latency_s']:.0f} us, {_gbs(link['bandwidth_Bps'])} GB/s "
                     f"({8 * link['bandwidth_Bps'] / 1e9:.2f} Gbit/s)")
    worst = rep["slowest_link"]
    if worst and worst["far_below"]:
        lines.append(f"  SLOWEST LINK {worst['ranks'][0]}-{worst['ranks'][1]}: "
                     f"{worst['ratio_to_others']:.2f}x the median of the other links")
    return lines


def render(rep: dict) -> str:
    """The report as a readable table."""
    lay, comp, wl, world = rep["layout"], rep["compute"], rep["workload"], rep["world"]
    fb = comp["forward_s"] + comp["backward_s"]
    lines = [f"preflight: {wl['name']} model, {lay['parameters']:,} parameters in "
             f"{len(lay['bucket_numel'])} bucket(s) of <= {lay['bucket_size']:,} elements; dp "
             f"{world['dp']} ({world['backend']} on {world['device']}, "
             f"{len(world['hosts'])} host(s)); {wl['num_micro_batches']} micro-batch(es) per step",
             f"compute per micro-batch: forward {_ms(comp['forward_s'])}, backward "
             f"{_ms(comp['backward_s'])} (all ranks at once, slowest rank {comp['slowest_rank']}); "
             f"{_ms(comp['fwd_bwd_alone_s'])} on one rank alone "
             f"(x{fb / comp['fwd_bwd_alone_s']:.2f})",
             f"optimizer (AdamW + grad norm): {_ms(comp['optimizer_full_s'])} all parameters, "
             f"{_ms(comp['optimizer_shard_s'])} for a 1/{world['dp']} shard"]
    pred = rep["predictions"]
    if rep["network"]:
        lines += _network_lines(rep)
        lines.append(f"run together: compute x{pred['contention']['compute']:.2f}, "
                     f"communication x{pred['contention']['comm']:.2f} slower (shared host)")
    lines += ["", f"{'predicted per step':<44}{'step':>10}{'exposed':>11}{'exposed':>9}"
                  f"{'comm':>10}{'efficiency':>12}",
              f"  one rank alone{'':<28}{_ms(pred['single_rank_step_s']):>12}"]
    for name, row in pred["configs"].items():
        lines.append(f"  {name:<42}{_ms(row['step_s']):>10}{_ms(row['exposed_comm_s']):>11}"
                     f"{100 * row['exposed_fraction']:>8.0f}%{_ms(row['comm_s']):>10}"
                     f"{100 * row['scaling_efficiency']:>11.0f}%")
    v = rep["verdict"]
    lines += ["", f"verdict: {v['verdict'].upper()}: {v['advice']}",
              f"recommended flags: {v['recommended_flags']}"]
    return "\n".join(lines)
