"""The trainer's feeding side: micro-batches built off the training thread, in order.

For every (iteration, micro-batch) the trainer's main process decides, as before, the seed
(`derive_seed(seed, iteration, micro, rank)`), the corpus and the families (the rank's
sampler); only the featurization moves to `--data-workers` processes
(`protdp.data.pipeline.pool.OrderedPool`), `--prefetch-depth` micro-batches ahead. A batch is
a pure function of (families, per-example seeds, sizes), so it is the same with 0, 1 or N
workers and whatever their timing. Checkpoints store the samplers' state *as consumed* (the
snapshot taken when the micro-batch the step trained on was drawn), not the prefetched state,
so resume restarts at the exact position.

On a GPU the workers ship compact integer examples (`pipeline.compact`; a template model's
template features ride inside them) and the training thread expands them on the device
(`pipeline.expand`, pinned memory, non_blocking copies: device work, queued behind the step).
On a CPU device the workers run `featurize` + `collate` themselves, the batch allocated in
shared memory (`featurize` is faster than compact + expand on the CPU, and equal bit for bit).
Between the pool and the training thread a ready thread (`pipeline.ready`) takes each result
one micro-batch ahead, touches its shared-memory pages (CPU) or pins it (GPU), and releases
the batches the trainer is done with, so the training thread only picks up a finished batch.

Tolerant mode (`deadline` given, issue 44; the trainer's default with data workers): one task
per family in a `DeadlinePool` instead of one per micro-batch in an `OrderedPool`, and the
ready thread assembles the micro-batches (`pipeline.assemble`): a family over its deadline, one
that kills its worker or raises is set aside for that step, replaced by the next family of the
rank's shard order and recorded in RUN_DIR/quarantine.jsonl; the records as consumed are part
of the checkpoint (`quarantine_records()`), so a resumed run replays the decisions.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np
import torch

from protdp.data.features import collate, featurize
from protdp.data.pipeline.compact import compact_example
from protdp.data.pipeline import faults
from protdp.data.pipeline.expand import expand_batch, to_device
from protdp.data.pipeline.pool import OrderedPool
from protdp.data.pipeline.quarantine import DeadlinePolicy, Quarantine, shard_order
from protdp.data.pipeline.ready import ReadyThread, pin_arrays, touch_pages

RELEASE_AFTER = 2      # host results kept until this many newer ones were handed out
_STORES: dict = {}      # path -> FamilyStore, one open store per worker process


def default_workers() -> int:
    """Featurizing processes per rank: the cores this rank may use (the process's CPU set
    divided by LOCAL_WORLD_SIZE) less one for the training thread, 0..8 (0: a rank with one
    core featurizes in its training thread, as two processes on one core gain nothing)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    per_rank = cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(8, per_rank - 1))


def example_fn(base: Callable[..., dict], max_templates: int) -> Callable[..., dict]:
    """The worker's per-family function (`featurize` or `compact_example`), with the family's
    sampled template features added as they are for a template model (`with_templates`,
    issue 31: small [T, L, ...] arrays, shipped inside the example)."""
    if not max_templates:
        return base
    from protdp.templates.training import with_templates

    return with_templates(base, max_templates)


def collate_fn(max_templates: int, shared: bool = False) -> Callable[[list], dict]:
    """`collate` (template keys padded too for a template model); `shared`: the batch is
    allocated in shared memory (a worker's result crosses to the trainer without a copy)."""
    fn = partial(collate, shared=True) if shared else collate
    if max_templates:
        from protdp.templates.training import collate_templates

        fn = collate_templates(fn)
    return fn


def build_micro_batch(payload: dict, store=None) -> dict:
    """Worker side (module level: picklable by reference). payload: store path, family ids,
    per-example seeds, featurize keyword arguments, `compact`, `max_templates` ->
    {"compact": [compact examples]} (a GPU: expanded there), or (a CPU device) the collated
    `featurize` batch, allocated in shared memory in a worker; arrays as CPU tensors (shared
    memory in transit). `store`: the open store (in the training process), else one
    opened per worker process."""
    in_worker = store is None
    store = store if store is not None else _store(payload["store"])
    templates = payload.get("max_templates", 0)
    examples = [_example(store, f, s, payload) for f, s in zip(payload["fids"], payload["seeds"])]
    if payload["compact"]:
        return {"compact": examples}
    return collate_fn(templates, shared=in_worker)(examples)


def _store(path: str):
    from protdp.data.store import FamilyStore

    if path not in _STORES:
        _STORES[path] = FamilyStore(path)
    return _STORES[path]


def _example(store, fid: str, seed: int, payload: dict) -> dict:
    """One family's example (`faults.inject` first: a no-op unless a test or benchmark set
    PROTDP_DATA_FAULTS)."""
    slowdown = faults.inject(fid, payload.get("faults"))
    make = example_fn(compact_example if payload["compact"] else featurize,
                      payload.get("max_templates", 0))
    t0 = time.perf_counter()
    example = make(store.read(fid), seed=seed, **payload["kwargs"])
    faults.slow_down(slowdown, time.perf_counter() - t0)
    if payload["compact"]:
        return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                for k, v in example.items()}
    return example


def build_family(payload: dict) -> dict:
    """Worker side of the tolerant feed: one family's example (payload: store path, "fid",
    "seed", featurize keyword arguments, `compact`, `max_templates`)."""
    return _example(_store(payload["store"]), payload["fid"], payload["seed"], payload)


def describe(payload: dict) -> str:
    return f"families {', '.join(payload['fids'])} of {payload['store']}"


def describe_family(payload: dict) -> str:
    return f"family {payload['fid']} of {payload['store']}"


@dataclass
class _Planned:
    iteration: int
    micro: int
    source: object
    fids: list[str]
    payload: dict
    states: dict = field(repr=False)      # every source's sampler state after drawing this one


class BatchFeed:
    """Micro-batches in the trainer's order. `seed_of(iteration, micro)` -> the micro-batch
    seed; `source_of(seed)` -> the `Source`; `example_seed(seed, k)` -> example k's seed;
    `kwargs`: featurize's sizes. `workers` 0 featurizes in the calling thread. `deadline`
    (with workers): tolerant mode, per-family deadlines and quarantine (module doc); `rank`
    names this rank in the records, `quarantine_records` are a resumed run's (checkpoint),
    `run_dir` gets quarantine.jsonl."""

    def __init__(self, *, sources: dict, seed_of, source_of, example_seed, kwargs: dict,
                 start_iteration: int, num_micro: int, device: torch.device, workers: int,
                 prefetch_depth: int, timeout: float, compact: bool | None = None,
                 max_templates: int = 0, deadline: DeadlinePolicy | None = None, rank: int = 0,
                 quarantine_records: list[dict] = (), run_dir=None):
        self.sources, self.seed_of, self.source_of = sources, seed_of, source_of
        self.example_seed, self.kwargs, self.device = example_seed, kwargs, device
        self.num_micro = num_micro
        self.max_templates = max_templates
        self._collate = collate_fn(max_templates)
        self.compact = device.type == "cuda" if compact is None else compact
        self._cursor = (start_iteration, 0)
        self._planned: deque[_Planned] = deque()
        self._consumed = self._states()
        self.depth = max(1, prefetch_depth) if workers > 0 else 0
        self.workers, self.timeout = workers, timeout
        self.pool = None        # OrderedPool, or DeadlinePool (tolerant); started when first needed
        self.ready: ReadyThread | None = None
        self._handed: deque = deque()              # host results given out, released later
        self.deadline = deadline if workers > 0 else None
        self.rank, self.run_dir = rank, run_dir
        self.quarantine = Quarantine(deadline.max_strikes if deadline else 1, quarantine_records)
        self.assembler = None
        self._faults = faults.configured()         # tests and benchmarks only (faults.py)
        self._orders: dict = {}                    # corpus -> (epoch key, shard order)
        self._at = (start_iteration - 1, num_micro - 1)   # the last micro-batch handed out

    def _states(self) -> dict:
        return {name: s.sampler.state_dict() for name, s in self.sources.items()}

    def _plan(self) -> _Planned:
        it, micro = self._cursor
        seed = self.seed_of(it, micro)
        source = self.source_of(seed)
        fids = source.next_micro_batch()
        payload = {"store": str(source.store.path), "fids": list(fids),
                   "seeds": [self.example_seed(seed, k) for k in range(len(fids))],
                   "kwargs": self.kwargs, "compact": self.compact,
                   "max_templates": self.max_templates, "faults": self._faults}
        self._cursor = (it + 1, 0) if micro + 1 == self.num_micro else (it, micro + 1)
        planned = _Planned(it, micro, source, list(fids), payload, self._states())
        if self.deadline is not None:
            self._plan_tolerant(planned)
        elif self.workers > 0:
            if self.pool is None:
                self.pool = OrderedPool(build_micro_batch, self.workers, timeout=self.timeout,
                                        describe=describe)
                self.ready = ReadyThread(self.pool, self._prepare, device=self.device)
            self.pool.submit(payload)
            self.ready.expect()
        self._planned.append(planned)
        return planned

    def _plan_tolerant(self, planned: _Planned) -> None:
        """Per-family tasks of one micro-batch, resolved by the ready thread (`Assembler`)."""
        from protdp.data.pipeline.assemble import Assembler, SlotPlan
        from protdp.data.pipeline.deadline_pool import DeadlinePool

        if self.pool is None:
            self.pool = DeadlinePool(build_family, self.workers, policy=self.deadline,
                                     timeout=self.timeout, describe=describe_family,
                                     preload=("protdp.train.feed",))
            self.assembler = Assembler(self.pool, self.quarantine, rank=self.rank,
                                       finish=self._finish, run_dir=self.run_dir)
            self.ready = ReadyThread(self.assembler, self._prepare, device=self.device,
                                     depth=self.depth)
        base = {k: v for k, v in planned.payload.items() if k not in ("fids", "seeds")}
        self.assembler.expect(SlotPlan(
            planned.iteration, planned.micro, planned.source.name, planned.fids,
            planned.payload["seeds"], self._shard_order(planned.source),
            lambda fid, seed: {**base, "fid": fid, "seed": seed}))
        self.ready.expect()

    def _shard_order(self, source) -> list[str]:
        """The rank's families in its serving order this epoch (replacements follow it)."""
        sampler = source.sampler
        key = (sampler.epoch, len(sampler.segments))
        cached = self._orders.get(source.name)
        if cached is None or cached[0] != key:
            cached = self._orders[source.name] = (key, shard_order(sampler.rank_plan()))
        return cached[1]

    def _finish(self, examples: list[dict]) -> dict:
        """Ready thread: the micro-batch of the tolerant feed's examples."""
        return {"compact": examples} if self.compact else self._collate(examples)

    def next(self, iteration: int, micro: int):
        """(source, family ids, batch on the device) of micro-batch `micro` of `iteration`."""
        source, fids, out = self.next_host(iteration, micro)
        if "compact" in out:
            batch = expand_batch(out["compact"], self.device, collate_fn=self._collate)
        else:
            batch = to_device(out, self.device)
        return source, fids, batch

    def next_host(self, iteration: int, micro: int):
        """(source, family ids, what the worker returned: numpy arrays of the collated batch,
        or {"compact": [compact examples]})."""
        while len(self._planned) < self.depth + 1:
            self._plan()
        task = self._planned.popleft()
        if (task.iteration, task.micro) != (iteration, micro):
            raise RuntimeError(f"feed out of step: asked for ({iteration}, {micro}), next "
                               f"planned is ({task.iteration}, {task.micro})")
        fids = task.fids
        if self.ready is not None:
            out = self.ready.get()
            self._handed.append(out)
            if len(self._handed) > RELEASE_AFTER:   # the trainer has dropped it by now
                self.ready.release(self._handed.popleft())
            if self.assembler is not None:      # tolerant: the families actually used
                out, fids = out["batch"], out["fids"]
        else:
            out = build_micro_batch(task.payload, task.source.store)
        self._consumed = task.states
        self._at = (task.iteration, task.micro)
        return task.source, fids, out

    def quarantine_records(self) -> list[dict]:
        """This rank's quarantine records up to the last consumed micro-batch (checkpoints)."""
        return self.quarantine.upto(self._at)

    def quarantined_at(self, iteration: int) -> int:
        """Families set aside in the micro-batches of `iteration` handed out so far."""
        return sum(1 for r in self.quarantine.upto(self._at) if r["step"] == iteration)

    def _prepare(self, out: dict) -> dict:
        """Ready thread: pin a compact result bound for a GPU, page in a CPU batch (tolerant
        mode: the batch inside the assembler's {"batch", "fids"})."""
        if self.assembler is not None:
            return {"batch": self._prepare_batch(out["batch"]), "fids": out["fids"]}
        return self._prepare_batch(out)

    def _prepare_batch(self, out: dict) -> dict:
        if "compact" in out and self.device.type == "cuda":
            return pin_arrays(out)
        return touch_pages(out)

    def sampler_states(self) -> dict:
        """Each source's sampler state at the last consumed micro-batch (for checkpoints)."""
        return self._consumed

    def close(self) -> None:
        """Stop the workers; the feed cannot be used afterwards."""
        if self.ready is not None:
            self.ready.stop()
        if self.pool is not None:
            self.pool.close()        # a ready thread waiting on it raises and stops
        if self.ready is not None:
            self.ready.close()
        self._handed.clear()
        self.pool, self.ready, self.workers, self.depth = None, None, 0, 0
        self.assembler = None
        self._planned.clear()
