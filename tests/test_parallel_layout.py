"""Pure layout math of protdp.parallel.buffer (no process group), with exact numbers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protdp.parallel.buffer import build_layout, layout_hash

PARAMS = [("a", (3,), "float32"), ("b", (2, 2), "float32"), ("c", (5,), "float32")]


def test_exact_layout_small():
    (lay,) = build_layout(PARAMS, num_shards=2, bucket_size=6, param_align=2)
    # reverse registration order: c first; c [0,5), b aligned to 6 -> [6,10) closes bucket 0
    assert [(s.name, s.start, s.end, s.bucket) for s in lay.params.values()] == [
        ("c", 0, 5, 0), ("b", 6, 10, 0), ("a", 12, 15, 1)]
    assert [(b.start, b.end, b.params) for b in lay.buckets] == [
        (0, 12, ("c", "b")), (12, 16, ("a",))]
    assert lay.numel == 16
    b0, b1 = lay.buckets
    assert [(s.start, s.end) for s in b0.shards] == [(0, 6), (6, 12)]
    assert [(o.name, o.param_start, o.param_end, o.shard_start, o.shard_end)
            for o in b0.shards[0].owned] == [("c", 0, 5, 0, 5)]
    assert [(o.name, o.param_start, o.param_end, o.buffer_start) for o in b0.shards[1].owned] == [
        ("b", 0, 4, 6)]
    # `a` is split between the two ranks: elements [0,2) on rank 0, [2,3) on rank 1
    assert [(o.param_start, o.param_end, o.buffer_start, o.buffer_end) for s in b1.shards
            for o in s.owned] == [(0, 2, 12, 14), (2, 3, 14, 15)]


def test_dtype_groups_and_single_bucket():
    lays = build_layout([("w", (4,), "float32"), ("h", (3,), "bfloat16"), ("v", (2,), "float32")],
                        num_shards=3, bucket_size=10**9, param_align=1)
    assert [lay.dtype for lay in lays] == ["float32", "bfloat16"]
    f32, bf16 = lays
    assert [(s.name, s.start, s.end) for s in f32.params.values()] == [("v", 0, 2), ("w", 2, 6)]
    assert (f32.buckets[0].start, f32.buckets[0].end) == (0, 6)  # padded to a multiple of 3
    assert (bf16.buckets[0].start, bf16.buckets[0].end) == (0, 3)


def test_big_param_gets_its_own_bucket():
    (lay,) = build_layout([("small", (2,), "float32"), ("big", (100,), "float32")],
                          num_shards=4, bucket_size=10, param_align=8)
    assert [b.params for b in lay.buckets] == [("big",), ("small",)]
    assert [(b.start, b.end) for b in lay.buckets] == [(0, 128), (128, 160)]


def test_hash_changes_with_layout():
    h = layout_hash(build_layout(PARAMS, 2, 6, 2))
    assert h == layout_hash(build_layout(PARAMS, 2, 6, 2))
    assert h == layout_hash(build_layout(PARAMS, 2, 7, 2))  # same buckets, same hash
    assert h != layout_hash(build_layout(PARAMS, 2, 11, 2))
    assert h != layout_hash(build_layout(PARAMS, 3, 6, 2))
    assert h != layout_hash(build_layout(PARAMS[:2] + [("c", (6,), "float32")], 2, 6, 2))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8), shards=st.integers(1, 5),
       bucket=st.integers(1, 120), align=st.sampled_from([1, 2, 4, 16]))
def test_layout_invariants(sizes, shards, bucket, align):
    params = [(f"p{i}", (n,), "float32") for i, n in enumerate(sizes)]
    (lay,) = build_layout(params, shards, bucket, align)
    covered = {name: [0] * n for name, (n,), _ in params}
    prev_end = 0
    for b in lay.buckets:
        assert b.start == prev_end and b.numel % (shards * align) == 0
        prev_end = b.end
        assert len(b.shards) == shards
        assert {s.end - s.start for s in b.shards} == {b.numel // shards}
        for s in b.shards:
            for o in s.owned:
                assert o.buffer_end - o.buffer_start == o.param_end - o.param_start
                assert o.shard_start == o.buffer_start - s.start
                for k in range(o.param_start, o.param_end):
                    covered[o.name][k] += 1
    assert prev_end == lay.numel
    assert all(c == 1 for cs in covered.values() for c in cs)  # every element owned exactly once
    assert all(s.start % align == 0 for s in lay.params.values())
    # buckets are filled in reverse registration order
    order = [n for b in lay.buckets for n in b.params]
    assert order == [n for n, _, _ in reversed(params)]
