"""Gradient/parameter buffer layout as a pure function (no process group, no tensors).

Megatron concept: `_ParamAndGradBuffer` — all params of one dtype live in one contiguous buffer
(and their fp32 grads in a matching grad buffer), packed in *reverse* registration order so that
the params whose grads are produced first by backward fill the first bucket. A bucket closes once
it holds >= `bucket_size` elements; its end is padded so it splits into `num_shards` equal
shards (one per data-parallel rank, for reduce-scatter / the distributed optimizer); every param
starts at a multiple of `param_align` elements.

`build_layout` returns plain frozen dataclasses: the index map (param -> buffer range), bucket
ranges, each rank's shard range per bucket and which param sub-ranges that shard owns.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class ParamSlot:
    """Where one parameter lives: buffer elements [start, end) inside bucket `bucket`."""

    name: str
    shape: tuple[int, ...]
    start: int
    end: int
    bucket: int


@dataclass(frozen=True)
class OwnedRange:
    """A piece of one param owned by a shard: param elements [param_start, param_end) (flattened)
    == buffer elements [buffer_start, buffer_end) == shard elements [shard_start, shard_end)."""

    name: str
    param_start: int
    param_end: int
    buffer_start: int
    buffer_end: int
    shard_start: int
    shard_end: int


@dataclass(frozen=True)
class ShardLayout:
    """Rank `rank`'s equal slice [start, end) of a bucket and the param pieces inside it."""

    rank: int
    start: int
    end: int
    owned: tuple[OwnedRange, ...]


@dataclass(frozen=True)
class BucketLayout:
    """Buffer elements [start, end) (padded), its params in buffer order, and its dp shards."""

    index: int
    start: int
    end: int
    params: tuple[str, ...]
    shards: tuple[ShardLayout, ...]

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class BufferLayout:
    """One contiguous buffer for all params of dtype `dtype`."""

    dtype: str
    numel: int
    params: dict[str, ParamSlot]
    buckets: tuple[BucketLayout, ...]


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _shards(bucket_start: int, bucket_end: int, slots: Sequence[ParamSlot],
            num_shards: int) -> tuple[ShardLayout, ...]:
    size = (bucket_end - bucket_start) // num_shards
    shards = []
    for r in range(num_shards):
        s0, s1 = bucket_start + r * size, bucket_start + (r + 1) * size
        owned = []
        for slot in slots:
            lo, hi = max(slot.start, s0), min(slot.end, s1)
            if lo < hi:
                owned.append(OwnedRange(slot.name, lo - slot.start, hi - slot.start, lo, hi,
                                        lo - s0, hi - s0))
        shards.append(ShardLayout(r, s0, s1, tuple(owned)))
    return tuple(shards)


def build_layout(params: Sequence[tuple[str, Sequence[int], str]], num_shards: int,
                 bucket_size: int, param_align: int = 1) -> list[BufferLayout]:
    """Lay out `params` = [(name, shape, dtype), ...] in registration order.

    Returns one `BufferLayout` per dtype (in order of first appearance). Within a buffer, params
    are packed in reverse registration order; a bucket is closed when it holds >= bucket_size
    elements (a param is never split across buckets) and padded to a multiple of
    num_shards × param_align so its shards are equal and aligned.
    """
    if num_shards < 1 or bucket_size < 1 or param_align < 1:
        raise ValueError("num_shards, bucket_size and param_align must be >= 1")
    names = [p[0] for p in params]
    if len(set(names)) != len(names):
        raise ValueError("parameter names must be unique")
    dtypes: list[str] = []
    for _, _, dt in params:
        if dt not in dtypes:
            dtypes.append(dt)
    bucket_multiple = num_shards * param_align
    layouts = []
    for dt in dtypes:
        group = [(n, tuple(int(s) for s in shape)) for n, shape, d in params if d == dt]
        slots: dict[str, ParamSlot] = {}
        buckets: list[BucketLayout] = []
        bucket_start, cursor, current = 0, 0, []

        def close(end_of_data: int):
            end = bucket_start + _align(end_of_data - bucket_start, bucket_multiple)
            idx = len(buckets)
            members = [ParamSlot(n, shp, s, e, idx) for n, shp, s, e in current]
            for m in members:
                slots[m.name] = m
            buckets.append(BucketLayout(idx, bucket_start, end, tuple(m.name for m in members),
                                        _shards(bucket_start, end, members, num_shards)))
            return end

        for name, shape in reversed(group):
            numel = math.prod(shape)
            start = _align(cursor, param_align)
            cursor = start + numel
            current.append((name, shape, start, cursor))
            if cursor - bucket_start >= bucket_size:
                bucket_start = cursor = close(cursor)
                current = []
        if current:
            cursor = close(cursor)
        layouts.append(BufferLayout(dt, cursor, slots, tuple(buckets)))
    return layouts


def layout_hash(layouts: Sequence[BufferLayout]) -> str:
    """Stable digest of a layout; equal on every rank iff the layouts are identical."""
    blob = json.dumps([asdict(lay) for lay in layouts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def layout_summary(layouts: Sequence[BufferLayout]) -> str:
    """One line a human can compare across ranks."""
    return "; ".join(f"{lay.dtype}: {len(lay.params)} params, {len(lay.buckets)} buckets, "
                     f"{lay.numel} elements" for lay in layouts)
