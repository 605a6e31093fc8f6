"""The network as the engine uses it: its bucket collectives at its bucket sizes, and every link.

Megatron concept: before scaling out, measure the fabric (nccl-tests' all_reduce_perf /
reduce_scatter_perf / all_gather_perf and point-to-point bandwidth). Here the collectives are
not torch's generic ones but exactly what `DataParallel` will issue: the names resolved by
`protdp.parallel.collectives` for this backend (gloo: point-to-point rings on the comm thread;
nccl: torch's) driven through the same `protdp.parallel.strategy` reducer / gatherer objects,
on fp32 gradient buckets (and model-dtype parameter buckets) of the layout's sizes. Besides one
collective at a time, all buckets are also issued back to back as `finish_grad_sync` does,
which lets the comm thread keep several in flight.

Links: every pair of ranks is timed with a point-to-point ping-pong (a small message for the
latency, a large one for the bandwidth), scheduled as a round-robin tournament (the circle
method: n-1 rounds in which every rank is in at most one pair), so n ranks need n-1 rounds,
not n(n-1)/2.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from protdp.parallel import collectives as coll
from protdp.parallel.step_model import OPS, algbw, busbw
from protdp.parallel.strategy import GroupContext, grad_reducer, param_gatherer

LINK_TAG = 7919  # point-to-point tag of the link ping-pong


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA kernels run asynchronously to the host)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], None], reps: int, device: torch.device, group=None) -> list[float]:
    """Seconds of `reps` calls of `fn`, each started together on every rank (barrier)."""
    out = []
    for _ in range(reps):
        dist.barrier(group)
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


@dataclass
class EngineCollectives:
    """The engine's collectives on `group`, resolved as `DataParallel` resolves them."""

    ctx: GroupContext
    backend: str
    names: dict  # op -> the engine's collective ("ring_all_reduce", "reduce_scatter", ...)

    @classmethod
    def for_group(cls, group, device_type: str) -> "EngineCollectives":
        rank, dp = dist.get_rank(group), dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dp))
        backend = coll.backend_for_device(dist.get_backend(group), device_type)
        names = {"all_reduce": coll.grad_reduce_collective("auto", backend, False),
                 "reduce_scatter": coll.grad_reduce_collective("auto", backend, True),
                 "all_gather": coll.param_gather_collective("auto", backend)}
        return cls(GroupContext(group, ranks, rank, dp), backend, names)

    def launch(self, op: str, data: torch.Tensor):
        """Start `op` on a whole bucket `data` [dp x shard] as the engine would; a Pending."""
        ctx = self.ctx
        shard = data.view(ctx.dp, -1)[ctx.rank]
        what = f"{self.names[op]}(preflight)"
        if op == "all_gather":
            return param_gatherer(ctx, self.names[op]).launch(data, shard, what, None)
        finite = lambda: torch.isfinite(data.sum())  # noqa: E731  (the engine's local check)
        return grad_reducer(ctx, self.names[op]).launch(data, shard, what, finite, None)

    def run(self, op: str, buffers: Sequence[torch.Tensor]) -> None:
        """Issue `op` on every buffer back to back, then wait for all (finish_grad_sync)."""
        pending = [self.launch(op, b) for b in buffers]
        for p in pending:
            if p is not None:
                p.wait()


def _row(op: str, numel: int, elem: int, times: list[float], dp: int) -> dict:
    nbytes = numel * elem
    med = statistics.median(times)
    return {"numel": numel, "bytes": nbytes, "time_s": med, "min_s": min(times),
            "algbw_Bps": algbw(nbytes, med), "busbw_Bps": busbw(op, nbytes, med, dp)}


def sweep(c: EngineCollectives, numels: Sequence[int], param_dtype: torch.dtype,
          device: torch.device, reps: int) -> dict:
    """Each op alone at each bucket size: {op: [row per size]} (nccl-tests columns)."""
    out = {op: [] for op in OPS}
    for numel in numels:
        for op in OPS:
            dtype = param_dtype if op == "all_gather" else torch.float32
            buf = torch.zeros(numel, dtype=dtype, device=device)
            c.run(op, [buf])  # warm-up: connections, comm thread
            times = time_calls(lambda: c.run(op, [buf]), reps, device, c.ctx.group)
            out[op].append(_row(op, numel, buf.element_size(), times, c.ctx.dp))
    return out


def sequence(c: EngineCollectives, numels: Sequence[int], param_dtype: torch.dtype,
             device: torch.device, reps: int) -> dict:
    """Median seconds of every bucket issued back to back and awaited, per op."""
    out = {}
    for op in OPS:
        dtype = param_dtype if op == "all_gather" else torch.float32
        bufs = [torch.zeros(n, dtype=dtype, device=device) for n in numels]
        c.run(op, bufs)
        out[op] = statistics.median(time_calls(lambda: c.run(op, bufs), reps, device,
                                               c.ctx.group))
    return out


DAP_ALL_TO_ALL_NUMELS = (2**16, 2**20, 2**22)   # fp32 elements per rank: 256 KiB .. 16 MiB


def all_to_all_sweep(device: torch.device, reps: int, group=None,
                     numels: Sequence[int] = DAP_ALL_TO_ALL_NUMELS) -> list[dict]:
    """The all-to-all that switches DAP's split axis (`protdp.parallel.dap`: all_to_all_single)
    at a few sizes per rank; nccl-tests alltoall_perf columns (busbw = algbw x (n-1)/n)."""
    n = dist.get_world_size(group)
    rows = []
    for numel in numels:
        numel = -(-numel // n) * n
        src = torch.zeros(numel, device=device)
        dst = torch.empty_like(src)
        dist.all_to_all_single(dst, src, group=group)   # warm-up
        med = statistics.median(time_calls(lambda: dist.all_to_all_single(dst, src, group=group),
                                           reps, device, group))
        nbytes = 4 * numel
        rows.append({"numel": numel, "bytes": nbytes, "time_s": med,
                     "algbw_Bps": algbw(nbytes, med), "busbw_Bps": algbw(nbytes, med) * (n - 1) / n})
    return rows


def small_all_reduce_s(dp: int, device: torch.device, reps: int, group=None) -> float:
    """Latency of the optimizer's grad-norm + non-finite all_reduce ((1 + dp) fp64 values)."""
    stats = torch.zeros(1 + dp, dtype=torch.float64, device=device)
    dist.all_reduce(stats, group=group)
    return statistics.median(time_calls(lambda: dist.all_reduce(stats, group=group), reps,
                                        device, group))


# ---------------------------------------------------------------------------- links
def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin tournament over ranks 0..n-1 (circle method): every pair exactly once, each
    rank in at most one pair per round; n-1 rounds (n rounds with a bye when n is odd)."""
    if n < 2:
        return []
    players = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = [(players[i], players[m - 1 - i]) for i in range(m // 2)]
        rounds.append([tuple(sorted(p)) for p in pairs if None not in p])
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


def _pingpong(peer: int, first: bool, buf: torch.Tensor, reps: int,
              device: torch.device) -> list[float]:
    """Round-trip seconds of `buf` to `peer` and back (valid on the `first` side)."""
    rtts = []
    for _ in range(reps + 1):  # the first exchange is a warm-up
        synchronize(device)
        t0 = time.perf_counter()
        if first:
            dist.send(buf, peer, tag=LINK_TAG)
            dist.recv(buf, peer, tag=LINK_TAG)
        else:
            dist.recv(buf, peer, tag=LINK_TAG)
            dist.send(buf, peer, tag=LINK_TAG)
        synchronize(device)
        rtts.append(time.perf_counter() - t0)
    return rtts[1:]


def measure_links(large_bytes: int, reps: int, device: torch.device) -> list[dict]:
    """Latency and bandwidth of every rank pair of the world (collective; every rank returns
    the full list). bandwidth = bytes / (one-way time of the large message - latency)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    small = torch.zeros(1, device=device)
    large = torch.zeros(max(1, large_bytes // 4), device=device)
    mine = []
    for pairs in pair_rounds(world):
        dist.barrier()
        pair = next((p for p in pairs if rank in p), None)
        if pair is None:
            continue
        peer = pair[1] if pair[0] == rank else pair[0]
        first = rank == pair[0]
        lat = statistics.median(_pingpong(peer, first, small, 4 * reps, device)) / 2
        one_way = statistics.median(_pingpong(peer, first, large, reps, device)) / 2
        if first:
            wire = one_way - lat if one_way > lat else one_way
            mine.append({"ranks": list(pair), "latency_s": lat, "bytes": large.numel() * 4,
                         "one_way_s": one_way, "bandwidth_Bps": large.numel() * 4 / wire})
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    return sorted((r for part in gathered for r in part), key=lambda r: r["ranks"])
