"""Target cost, and static dealing of targets to ranks (a pure function of the input, so every
rank computes the same plan without communicating).

Prediction itself no longer deals statically: ranks claim targets from the run's leased work
queue, costliest first by `target_cost` (`protdp.inference.work`, issue 45). `shard_by_cost`
still deals the MSA search of targets without an MSA (`protdp predict --db`) and is the
static baseline of `benchmarks/predict_throughput.py`.

Prediction cost grows with the pair representation and triangle updates, ~L^2 per pass (L^3
for triangle attention, but at the lengths of a proteome the L^2 terms dominate on a GPU), so
targets are dealt by cost: longest-processing-time-first, each target to the rank with the
least work so far (ties: lowest rank). Plain round-robin by index gives one rank all the long
chains when they cluster. Within a rank targets run shortest first when `sort_by_length`
(ColabFold's --sort-queries-by length), else in input order.
"""

from __future__ import annotations

import heapq


def target_cost(length: int | None) -> int:
    """Relative cost of a target of `length` residues (invalid ones: 1, they fail fast)."""
    return max(1, length or 0) ** 2


def shard_by_cost(lengths: list[int | None], world_size: int) -> list[list[int]]:
    """Target indices of each rank (LPT on `target_cost`)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    heap = [(0, r) for r in range(world_size)]
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-target_cost(lengths[i]), i)):
        load, r = heapq.heappop(heap)
        shards[r].append(i)
        heapq.heappush(heap, (load + target_cost(lengths[i]), r))
    return [sorted(s) for s in shards]


def run_order(indices: list[int], lengths: list[int | None], sort_by_length: bool) -> list[int]:
    if not sort_by_length:
        return sorted(indices)
    return sorted(indices, key=lambda i: (lengths[i] or 0, i))


def target_lengths(targets) -> list[int | None]:
    """Residue counts for sharding (None for a target already known to be bad); every rank
    and the MSA-search step compute the same list."""
    return [None if t.error else sum(1 for ch in t.raw_sequence if not ch.isspace())
            for t in targets]
