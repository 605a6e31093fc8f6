"""Ring schedules of protdp.parallel.ring as pure functions (no process group), simulated
chunk by chunk; the multi-process runs are in test_parallel_dist.py (collective choices)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protdp.errors import ConfigError
from protdp.parallel.ring import (DEFAULT_WINDOW, TAG_SPACE, CommWorker, all_gather_schedule,
                                  reduce_scatter_schedule, step_tag, window_from_env)


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
    window = 8  # more collectives than CommWorker keeps in flight: tags never collide
    steps = 2 * (world - 1)  # a ring all-reduce: reduce-scatter steps, then all-gather steps
    tags = [step_tag(sequence + j, s, world) for j in range(window) for s in range(steps)]
    assert len(set(tags)) == len(tags)
    assert all(0 <= t < TAG_SPACE for t in tags)


# ---------------------------------------------------------------------------- CommWorker window
class _Gate:
    """A stand-in for a torch Work whose wait() blocks until the test opens it; records waits."""

    def __init__(self, name: str, log: list):
        self.name, self.log, self.event = name, log, threading.Event()

    def wait(self):
        self.log.append(("wait", self.name))
        assert self.event.wait(10), f"{self.name} never opened"


def _fake_op(op: int, steps: int, gates: dict, log: list, fail_at: int | None = None):
    """make_op for CommWorker: `steps` posted steps, each one gate; returns (op, sequence)."""
    def make(sequence):
        for s in range(steps):
            if s == fail_at:
                raise RuntimeError(f"op {op} failed at step {s}")
            gate = gates[(op, s)] = _Gate(f"{op}.{s}", log)
            log.append(("post", f"{op}.{s}"))
            yield [gate]
        return (op, sequence)
    return make


def _wait_posted(gates: dict, key, timeout: float = 10.0):
    for _ in range(int(timeout / 0.005)):
        if key in gates:
            return gates[key]
        threading.Event().wait(0.005)
    raise AssertionError(f"step {key} was never posted")


def _open_when_posted(gates: dict, key, timeout: float = 10.0):
    _wait_posted(gates, key, timeout).event.set()


@pytest.mark.parametrize("window", [1, 3])
def test_comm_worker_posts_up_to_window_ops_ahead_in_order(window):
    log, gates = [], {}
    worker = CommWorker(name="test-comm", window=window)
    try:
        futures = [worker.submit(_fake_op(i, 2, gates, log), group="g") for i in range(5)]
        _open_when_posted(gates, (0, 0))
        _wait_posted(gates, (0, 1))  # the worker now blocks on op 0's second step
        threading.Event().wait(0.1)  # (it could only post more here if it did not block)
        first_posts = [name for kind, name in log if kind == "post"]
        # op 0 step 0 done, its step 1 posted; ops 1..window-1 posted ahead, no more
        assert first_posts == ["0.0"] + [f"{i}.0" for i in range(1, window)] + ["0.1"]
        for op in range(5):
            for step in range(2):
                _open_when_posted(gates, (op, step))
        assert [f.result(timeout=10) for f in futures] == [(i, i) for i in range(5)]
        waits = [name for kind, name in log if kind == "wait"]
        # every step waited for once, oldest op first (waiting on a newer op's step first can
        # deadlock 3+ ranks: see CommWorker)
        assert waits == [f"{i}.{s}" for i in range(5) for s in range(2)]
        # a step is only waited for after it was posted
        for name in waits:
            assert log.index(("post", name)) < log.index(("wait", name))
    finally:
        for gate in gates.values():
            gate.event.set()
        worker.close(join_s=5)


def test_comm_worker_failure_fails_in_flight_and_later_ops():
    log, gates = [], {}
    worker = CommWorker(name="test-comm", window=3)
    try:
        ok = worker.submit(_fake_op(0, 1, gates, log), group="g")
        bad = worker.submit(_fake_op(1, 2, gates, log, fail_at=1), group="g")
        inflight = worker.submit(_fake_op(2, 2, gates, log), group="g")
        for key in [(0, 0), (1, 0), (2, 0)]:
            _open_when_posted(gates, key)
        assert ok.result(timeout=10) == (0, 0)
        with pytest.raises(RuntimeError, match="op 1 failed at step 1"):
            bad.result(timeout=10)
        with pytest.raises(RuntimeError, match="op 1 failed"):
            inflight.result(timeout=10)  # posted alongside the failed one: its ring is broken
        later = worker.submit(_fake_op(3, 1, gates, log), group="g")
        with pytest.raises(RuntimeError, match="an earlier collective on this rank failed"):
            later.result(timeout=10)
        assert (3, 0) not in gates  # refused without posting anything
    finally:
        for gate in gates.values():
            gate.event.set()
        worker.close(join_s=5)


def test_window_from_environment_and_bad_values_name_the_variable():
    assert window_from_env({}) == DEFAULT_WINDOW
    assert window_from_env({"PROTDP_COMM_WINDOW": " 2 "}) == 2
    for bad in ("0", "-1", "four", "1.5"):
        with pytest.raises(ConfigError, match="PROTDP_COMM_WINDOW"):
            window_from_env({"PROTDP_COMM_WINDOW": bad})
    with pytest.raises(ConfigError, match="window=0"):
        CommWorker(name="test-comm", window=0)
