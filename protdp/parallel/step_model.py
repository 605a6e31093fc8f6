"""Predicted step time, exposed communication and scaling of the data-parallel engine from
measured pieces (pure functions: no process group, no tensors).

Megatron concepts: gradient buckets are reduced in bucket order over one link (protdp's comm
thread on gloo, NCCL's communication stream on GPUs); with --overlap-grad-reduce a bucket's
collective starts as soon as its last gradient is accumulated during backward, so without
interference bucket i of n would finish at end_i = max(ready_i, end_{i-1}) + t_i, and what is
left when backward ends is the *exposed* communication, the time compute waits for the network.
Without overlap every bucket is ready when backward ends. Compute and communication also share
the host (CPU cores and memory bandwidth on gloo; SMs and HBM on GPUs): while both run each is
slowed by a measured factor (`Contention`, from running the two together), so `timeline`
simulates the two as processes sharing a machine rather than adding times. With the distributed
optimizer (ZeRO-1) the buckets are reduce-scattered instead (half the bytes), each rank steps
1/dp of the parameters, and the updated shards are all-gathered bucket by bucket in forward
order as each is stepped; with --overlap-param-gather the next forward waits only for the
bucket holding the layer it is about to run. `protdp.parallel.preflight` measures every input
(bucket ready / need times from hooks on the real model, the engine's own collectives at its
bucket sizes, the optimizer step); benchmarks/preflight_check.py compares these predictions
with the engine's measured steps on a simulated network.

nccl-tests conventions (`busbw`): algbw = bytes / time; busbw = algbw x 2(n-1)/n for
all_reduce and x (n-1)/n for reduce_scatter / all_gather (bytes = the whole buffer), so busbw is
the per-rank link speed a ring achieved, comparable across collectives and world sizes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Sequence

EXPOSED_OK = 0.10      # exposed communication up to this fraction of the step counts as hidden
FAR_BELOW = 0.5        # a link below this fraction of the other links' median is named
MAX_ACCUMULATION = 64  # the largest gradient accumulation the network-bound advice considers
LOW_EFFICIENCY = 0.80  # weak-scaling efficiency below this is named even when comm is hidden
NEAR_BEST = 1.02       # the simplest configuration within 2 % of the fastest is recommended
# Contention factors are capped: two threads per core slow each other about 2x, and a larger
# fitted factor means a rank was descheduled during the measurement (a shared host), not
# contention (benchmarks/results/preflight_netsim_*_evoformer.json hit 64 without the cap).
CONTENTION_CAP = 4.0
OPS = ("all_reduce", "reduce_scatter", "all_gather")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n for all_reduce, (n-1)/n for the others."""
    if op not in OPS:
        raise ValueError(f"op {op!r}: expected one of {OPS}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s (nccl-tests: the buffer size over the time)."""
    return nbytes / seconds if seconds > 0 else float("nan")


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s (nccl-tests): algbw x `bus_factor(op, n)`."""
    return algbw(nbytes, seconds) * bus_factor(op, n)


def fit_latency_bandwidth(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares fit of time = latency + bytes / bandwidth over (bytes, seconds) points.

    Returns (latency_s >= 0, bandwidth bytes/s). One point (or all sizes equal) gives no slope:
    latency 0 and the mean bandwidth. A non-positive slope (noise) falls back to the same."""
    if not points:
        raise ValueError("no measurements to fit")
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    mean_bw = sum(xs) / sum(ys)
    if len(set(xs)) < 2:
        return 0.0, mean_bw
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        return 0.0, mean_bw
    latency = my - slope * mx
    if latency < 0:  # through the origin instead: time = bytes / bandwidth
        return 0.0, sum(x * x for x in xs) / sum(x * y for x, y in zip(xs, ys))
    return latency, 1.0 / slope


@dataclass(frozen=True)
class Contention:
    """Slowdown of compute while the link is busy and of transfers while compute runs (>= 1;
    measured by running the engine's collectives during a forward+backward)."""

    compute: float = 1.0
    comm: float = 1.0


def timeline(work_s: float, transfers: Sequence[tuple[float, float]],
             waits: Sequence[tuple[float, int]] = (), contention: Contention = Contention()
             ) -> dict:
    """Compute of `work_s` seconds beside a serial link.

    transfers: (issue point, duration) in order; transfer j starts once compute has done
    `issue` seconds of its work and transfer j-1 is done (issue >= work_s: when compute ends).
    waits: (work point, transfer index): compute cannot pass the point before that transfer is
    done (a forward waiting for a parameter gather). Durations and points are uncontended
    seconds; while both run, each progresses at 1 / its `contention` factor. Returns wall times
    {"compute_end_s", "transfer_end_s": [...], "stalled_s": compute waiting on `waits`}."""
    eps = 1e-12
    issue = [min(i, work_s) for i, _ in transfers]
    rem = [d for _, d in transfers]
    waits = sorted(waits)
    t = w = stalled = 0.0
    j, started, ends, compute_end = 0, False, [], 0.0 if work_s <= 0 else None
    while j < len(rem) or compute_end is None:
        started = started or (j < len(rem) and w >= issue[j] - eps)
        link = j < len(rem) and started
        gate = next((p for p, k in waits if k >= len(ends)), None)      # first unmet wait
        blocked = compute_end is None and gate is not None and w >= gate - eps
        running = compute_end is None and not blocked
        rc = (1.0 / contention.compute if link else 1.0) if running else 0.0
        rl = (1.0 / contention.comm if running else 1.0) if link else 0.0
        steps = [rem[j] / rl] if link else []
        if running:
            points = [work_s] + [x for x in (gate, None if started or j >= len(rem) else issue[j])
                                 if x is not None and x > w + eps]
            steps.append((min(points) - w) / rc)
        if not steps:
            raise ValueError("a wait on a transfer that can never start")
        dt = max(0.0, min(steps))
        t, w = t + dt, min(work_s, w + rc * dt)
        stalled += dt if blocked else 0.0
        if link:
            rem[j] -= rl * dt
            if rem[j] <= eps * max(1.0, t):
                ends.append(t)
                j, started = j + 1, False
        if compute_end is None and w >= work_s - eps:
            compute_end = t
    return {"compute_end_s": compute_end, "transfer_end_s": ends, "stalled_s": stalled}


def _solve_increasing(f, target: float, lo: float = 1.0, hi: float = CONTENTION_CAP) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (bisection; clamped at the ends)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def fit_contention(work_s: float, transfers: Sequence[tuple[float, float]],
                   compute_end_s: float, comm_end_s: float, rounds: int = 30) -> Contention:
    """The factors with which `timeline(work_s, transfers)` ends compute and link when they were
    measured to end (a backward with the buckets' all-reduces launched as they become ready):
    each factor solved in turn for its own end time until neither moves."""
    def ends(cc: float, cm: float) -> tuple[float, float]:
        run = timeline(work_s, transfers, (), Contention(cc, cm))
        return run["compute_end_s"], run["transfer_end_s"][-1]

    cc = cm = 1.0
    for _ in range(rounds):
        cc_new = _solve_increasing(lambda x: ends(x, cm)[0], compute_end_s)
        cm_new = _solve_increasing(lambda x: ends(cc_new, x)[1], comm_end_s)
        done = abs(cc_new - cc) < 1e-4 and abs(cm_new - cm) < 1e-4
        cc, cm = cc_new, cm_new
        if done:
            break
    return Contention(cc, cm)


@dataclass(frozen=True)
class StepPieces:
    """Measured inputs of one optimizer step; bucket tuples are in reduction order (bucket 0 holds
    the last layers: it is ready first in backward and needed last in forward)."""

    dp: int
    forward_s: float                   # forward + loss of one micro-batch
    backward_s: float                  # its backward
    optimizer_s: float                 # AdamW + grad norm over all parameters (one rank)
    bucket_ready_s: tuple[float, ...]  # after backward start: the bucket's last gradient
    bucket_need_s: tuple[float, ...]   # after forward start: first use of the bucket's params
    all_reduce_s: tuple[float, ...]    # the engine's grad all-reduce of each bucket
    reduce_scatter_s: tuple[float, ...]
    all_gather_s: tuple[float, ...]    # the distributed optimizer's param gather
    norm_all_reduce_s: float = 0.0     # grad norm + non-finite vote (one small all_reduce)
    num_micro_batches: int = 1         # gradient accumulation steps
    optimizer_shard_s: float | None = None  # the same over a 1/dp shard (default optimizer_s/dp)

    def __post_init__(self):
        n = len(self.bucket_ready_s)
        for name in ("bucket_need_s", "all_reduce_s", "reduce_scatter_s", "all_gather_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} buckets, expected {n}")
        if self.dp < 1 or self.num_micro_batches < 1 or n < 1:
            raise ValueError("dp, num_micro_batches and the bucket count must be >= 1")

    @property
    def compute_s(self) -> float:
        return self.num_micro_batches * (self.forward_s + self.backward_s)


@dataclass(frozen=True)
class EngineConfig:
    """The engine switches a prediction is for (ParallelConfig's names)."""

    name: str
    overlap_grad_reduce: bool
    use_distributed_optimizer: bool = False
    overlap_param_gather: bool = False

    @property
    def flags(self) -> str:
        out = ["--overlap-grad-reduce" if self.overlap_grad_reduce else "--no-overlap-grad-reduce"]
        if self.use_distributed_optimizer:
            out.append("--use-distributed-optimizer")
        if self.overlap_param_gather:
            out.append("--overlap-param-gather")
        return " ".join(out)


CONFIGS = (
    EngineConfig("no_overlap", overlap_grad_reduce=False),
    EngineConfig("overlap", overlap_grad_reduce=True),
    EngineConfig("distributed_optimizer", True, use_distributed_optimizer=True),
    EngineConfig("distributed_optimizer_overlap_param_gather", True, True, True),
)


def _optimizer_and_forward(p: StepPieces, cfg: EngineConfig, optimizer_s: float,
                          contention: Contention) -> tuple[float, float]:
    """Wall time of the optimizer step + the next forward, and the parameter-gather waits in it.

    Distributed optimizer: shards are stepped in forward order (the last bucket first, the
    optimizer time split evenly) and each bucket's gather starts once its shard is stepped.
    Without --overlap-param-gather the step waits for every gather; with it the next forward
    waits, before each bucket's first use, for that bucket's gather."""
    if not cfg.use_distributed_optimizer:
        return optimizer_s + p.forward_s, 0.0
    order = list(reversed(range(len(p.all_gather_s))))          # forward order
    k = len(order)
    transfers = [(optimizer_s * (j + 1) / k, p.all_gather_s[i]) for j, i in enumerate(order)]
    waits = ([(optimizer_s + p.bucket_need_s[i], j) for j, i in enumerate(order)]
             if cfg.overlap_param_gather else [(optimizer_s, j) for j in range(k)])
    run = timeline(optimizer_s + p.forward_s, transfers, waits, contention)
    return run["compute_end_s"], run["stalled_s"]


def predict(p: StepPieces, cfg: EngineConfig, contention: Contention = Contention()) -> dict:
    """Step time, exposed and total communication (seconds) of one optimizer step in steady
    state: optimizer + first forward (parameter gathers), the accumulation micro-batches, the
    last backward beside the gradient buckets, what is left of them, the norm all_reduce."""
    compute = p.compute_s
    if p.dp == 1:  # nothing to communicate; the optimizer steps every parameter
        return {"config": cfg.name, "flags": cfg.flags, "step_s": compute + p.optimizer_s,
                "exposed_comm_s": 0.0, "grad_exposed_s": 0.0, "param_exposed_s": 0.0,
                "comm_s": 0.0, "compute_s": compute, "optimizer_s": p.optimizer_s,
                "backward_wall_s": p.backward_s}
    distopt = cfg.use_distributed_optimizer
    shard = p.optimizer_shard_s if p.optimizer_shard_s is not None else p.optimizer_s / p.dp
    optimizer = shard if distopt else p.optimizer_s
    head, param_exposed = _optimizer_and_forward(p, cfg, optimizer, contention)
    middle = (p.num_micro_batches - 1) * (p.forward_s + p.backward_s)
    grad_t = p.reduce_scatter_s if distopt else p.all_reduce_s
    ready = p.bucket_ready_s if cfg.overlap_grad_reduce else [p.backward_s] * len(grad_t)
    tail = timeline(p.backward_s, list(zip(ready, grad_t)), (), contention)
    grad_exposed = max(0.0, tail["transfer_end_s"][-1] - tail["compute_end_s"])
    comm = sum(grad_t) + (sum(p.all_gather_s) if distopt else 0.0) + p.norm_all_reduce_s
    step = head + middle + tail["compute_end_s"] + grad_exposed + p.norm_all_reduce_s
    return {"config": cfg.name, "flags": cfg.flags, "step_s": step,
            "exposed_comm_s": grad_exposed + p.norm_all_reduce_s + param_exposed,
            "grad_exposed_s": grad_exposed, "param_exposed_s": param_exposed, "comm_s": comm,
            "compute_s": compute, "optimizer_s": optimizer,
            "backward_wall_s": tail["compute_end_s"]}


def predict_all(p: StepPieces, single_rank_compute_s: float | None = None,
                contention: Contention = Contention()) -> dict:
    """Every engine configuration, the one-rank step and weak-scaling efficiency vs one rank.

    `single_rank_compute_s`: forward+backward of one micro-batch measured with the other ranks
    idle (co-located ranks slow each other's compute; one rank alone does not pay that)."""
    alone = replace(p, dp=1)
    if single_rank_compute_s is not None:
        scale = single_rank_compute_s / (p.forward_s + p.backward_s)
        alone = replace(alone, forward_s=p.forward_s * scale, backward_s=p.backward_s * scale)
    one = predict(alone, CONFIGS[0])["step_s"]
    configs = {}
    for cfg in CONFIGS:
        row = predict(p, cfg, contention)
        row["exposed_fraction"] = row["exposed_comm_s"] / row["step_s"]
        row["scaling_efficiency"] = one / row["step_s"]   # weak scaling: same work per rank
        configs[cfg.name] = row
    return {"single_rank_step_s": one, "configs": configs,
            "contention": {"compute": contention.compute, "comm": contention.comm}}


def accumulation_needed(p: StepPieces, cfg: EngineConfig, contention: Contention = Contention(),
                        target: float = EXPOSED_OK) -> int | None:
    """The fewest micro-batches per step (gradient accumulation) at which the exposed
    communication is at most `target` of the step; None if not within MAX_ACCUMULATION."""
    for k in range(p.num_micro_batches, MAX_ACCUMULATION + 1):
        row = predict(replace(p, num_micro_batches=k), cfg, contention)
        if row["exposed_comm_s"] <= target * row["step_s"]:
            return k
    return None


def slowest_link(pairs: Sequence[dict]) -> dict | None:
    """The pair with the lowest bandwidth; `far_below` when it is under FAR_BELOW x the median
    of the other pairs (a bad cable, a congested switch port, a node on a slower network)."""
    if not pairs:
        return None
    worst = min(pairs, key=lambda r: r["bandwidth_Bps"])
    others = [r["bandwidth_Bps"] for r in pairs if r is not worst]
    median = statistics.median(others) if others else None
    far = median is not None and worst["bandwidth_Bps"] < FAR_BELOW * median
    return {**worst, "others_median_Bps": median, "far_below": far,
            "ratio_to_others": worst["bandwidth_Bps"] / median if median else None}


def _compute_note(row: dict) -> str:
    """Communication is hidden, yet each rank computes slower than one rank alone (co-located
    ranks share cores and memory bandwidth): say so rather than call the run simply fine."""
    eff = row.get("scaling_efficiency")
    if eff is None or eff >= LOW_EFFICIENCY:
        return ""
    return (f"; but weak-scaling efficiency is only {100 * eff:.0f}% (< "
            f"{100 * LOW_EFFICIENCY:.0f}%): the ranks' compute slows down (ranks sharing a host's "
            f"CPU cores or memory bandwidth), not the network: fewer ranks per host or a GPU "
            f"per rank")


def verdict(p: StepPieces, predictions: dict) -> dict:
    """fine / overlap needed / network-bound, with the configuration and advice that follow."""
    rows = predictions["configs"]
    plain = rows["no_overlap"]
    fastest = min(rows[c.name]["step_s"] for c in CONFIGS[1:])
    best_name = next(c.name for c in CONFIGS[1:] if rows[c.name]["step_s"] <= NEAR_BEST * fastest)
    best = rows[best_name]
    cfg = next(c for c in CONFIGS if c.name == best_name)
    out = {"threshold_exposed_fraction": EXPOSED_OK, "recommended": best_name,
           "recommended_flags": cfg.flags}
    if p.dp == 1:
        return {**out, "verdict": "fine", "recommended": "no_overlap",
                "recommended_flags": CONFIGS[0].flags, "advice": "one rank: nothing to communicate"}
    if plain["exposed_fraction"] <= EXPOSED_OK:
        return {**out, "verdict": "fine", "advice": (
            f"communication is {100 * plain['exposed_fraction']:.0f}% of the step even without "
            f"overlap; {cfg.flags} predicts {1e3 * best['step_s']:.1f} ms per step"
            + _compute_note(best))}
    if best["exposed_fraction"] <= EXPOSED_OK:
        return {**out, "verdict": "overlap needed", "advice": (
            f"without overlap compute waits {1e3 * plain['exposed_comm_s']:.1f} ms per step "
            f"({100 * plain['exposed_fraction']:.0f}%); with {cfg.flags} the exposed part drops "
            f"to {1e3 * best['exposed_comm_s']:.1f} ms ({100 * best['exposed_fraction']:.0f}%)")}
    k = accumulation_needed(p, cfg, Contention(**predictions["contention"]))
    more = (f"gradient accumulation of {k} micro-batches per step (--global-batch-size = "
            f"micro-batch x dp x {k}) brings it under "
            f"{100 * EXPOSED_OK:.0f}%" if k is not None else
            f"even {MAX_ACCUMULATION} micro-batches per step do not bring it under "
            f"{100 * EXPOSED_OK:.0f}%: use fewer, faster-connected ranks")
    return {**out, "verdict": "network-bound", "accumulation_needed": k, "advice": (
        f"communication does not hide behind backward: with {cfg.flags} compute still waits "
        f"{1e3 * best['exposed_comm_s']:.1f} ms per step ({100 * best['exposed_fraction']:.0f}%); "
        f"consider gradient accumulation or a larger micro-batch (compute grows, communication "
        f"does not): {more}")}
