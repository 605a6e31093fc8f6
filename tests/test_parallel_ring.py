"""Ring schedules of protdp.parallel.ring as pure functions (no process group), simulated
chunk by chunk; the multi-process runs are in test_parallel_dist.py (collective choices)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protdp.parallel.ring import (TAG_SPACE, all_gather_schedule, reduce_scatter_schedule,
                                  step_tag)


def test_two_ranks_exact():
    assert reduce_scatter_schedule(0, 2) == [(1, 0)]  # send the peer's half, add into mine
    assert reduce_scatter_schedule(1, 2) == [(0, 1)]
    assert all_gather_schedule(0, 2) == [(0, 1)]  # send mine, receive the peer's
    assert all_gather_schedule(1, 2) == [(1, 0)]
    assert reduce_scatter_schedule(0, 1) == [] and all_gather_schedule(0, 1) == []


def _simulate_reduce_scatter(world: int) -> list[list[frozenset]]:
    """Each rank's chunks as the set of ranks whose contribution they hold."""
    held = [[frozenset({r}) for _ in range(world)] for r in range(world)]
    for step in range(world - 1):
        sent = {}
        for r in range(world):
            send_i, _ = reduce_scatter_schedule(r, world)[step]
            sent[(r + 1) % world] = (send_i, held[r][send_i])
        for r in range(world):
            _, recv_i = reduce_scatter_schedule(r, world)[step]
            chunk, value = sent[r]
            assert chunk == recv_i  # the sender sends exactly the chunk the receiver adds into
            assert not (held[r][recv_i] & value)  # nothing is ever added twice
            held[r][recv_i] = held[r][recv_i] | value
    return held


@given(st.integers(min_value=1, max_value=12))
def test_reduce_scatter_leaves_each_rank_its_full_chunk(world):
    held = _simulate_reduce_scatter(world)
    for r in range(world):
        assert held[r][r] == frozenset(range(world))


@given(st.integers(min_value=1, max_value=12))
def test_all_gather_delivers_every_chunk(world):
    have = [{r} for r in range(world)]
    for step in range(world - 1):
        sent = {}
        for r in range(world):
            send_i, _ = all_gather_schedule(r, world)[step]
            assert send_i in have[r]  # only chunks already received are forwarded
            sent[(r + 1) % world] = send_i
        for r in range(world):
            _, recv_i = all_gather_schedule(r, world)[step]
            assert sent[r] == recv_i
            have[r].add(recv_i)
    assert all(h == set(range(world)) for h in have)


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=0, max_value=10**9))
def test_tags_unique_within_a_window_of_collectives(world, sequence):
    window = 8  # tags of neighbouring collectives never collide
    steps = 2 * (world - 1)  # a ring all-reduce: reduce-scatter steps, then all-gather steps
    tags = [step_tag(sequence + j, s, world) for j in range(window) for s in range(steps)]
    assert len(set(tags)) == len(tags)
    assert all(0 <= t < TAG_SPACE for t in tags)
