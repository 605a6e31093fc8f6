"""Micro-batches from per-family tasks, with deadlines and deterministic replacements (issue 44).

The tolerant feed submits one `DeadlinePool` task per family of every planned micro-batch (the
sampler's families, the trainer's per-example seeds) and the ready thread asks this assembler
for the micro-batches in order (`get`, the same call `ReadyThread` makes on a pool). For each
slot of a micro-batch, in slot order:

- a family quarantined `max_strikes` times before this micro-batch is not tried: its task is
  discarded and the slot goes to its replacement;
- otherwise the slot waits for the family's outcome. `done`: the example. `deadline`,
  `worker_died` or `error`: a quarantine record (family, rank, step, micro, slot, reason,
  seconds) and the slot goes to the replacement, the next usable family in the rank's shard
  order (`quarantine.replacement`), featurized with the slot's own seed as an urgent task,
  under the same rules.

Every decision depends on the timing of this family only and on the records of earlier
micro-batches (resolved earlier by this same thread), so the record list alone replays them: a
resumed run loads the records of the checkpoint and decides exactly as the uninterrupted run
did. The micro-batch keeps its size and the step its collectives whatever was set aside.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from protdp.data.pipeline.deadline_pool import DeadlinePool
from protdp.data.pipeline.quarantine import (MAX_CONSECUTIVE_FAILURES, Quarantine, make_record,
                                             record_quarantine, replacement)
from protdp.errors import ProtdpError

REASON_OF = {"deadline": "deadline", "worker_died": "worker_died", "error": "error"}


class NoUsableFamily(ProtdpError):
    """Every family of a rank's shard is quarantined (or many in a row failed): a broken corpus
    or featurizer, not a straggler."""


@dataclass
class SlotPlan:
    """One planned micro-batch: its families, per-slot seeds and the rank's shard order."""

    iteration: int
    micro: int
    corpus: str
    fids: list[str]
    seeds: list[int]
    order: list[str] = field(repr=False)
    payload: Callable[[str, int], dict] = field(repr=False)    # (family, seed) -> task payload

    @property
    def at(self) -> tuple[int, int]:
        return (self.iteration, self.micro)

    def key(self, slot: int, family: str) -> tuple:
        return (self.iteration, self.micro, slot, family)


class Assembler:
    """Resolves planned micro-batches in order against a `DeadlinePool` (see the module doc).
    `finish(examples)` builds the micro-batch result (collate, or the compact list);
    `run_dir`: where rank's records are appended as they are decided (None: kept in memory)."""

    def __init__(self, pool: DeadlinePool, quarantine: Quarantine, *, rank: int,
                 finish: Callable[[list], dict], run_dir=None):
        self.pool, self.quarantine, self.rank = pool, quarantine, rank
        self.finish, self.run_dir = finish, run_dir
        self._plans: deque[SlotPlan] = deque()
        self._lock = threading.Lock()
        self._failures_in_a_row = 0

    def expect(self, plan: SlotPlan) -> None:
        """Submit the plan's family tasks; `get` resolves plans in the order they came."""
        for slot, (fid, seed) in enumerate(zip(plan.fids, plan.seeds)):
            self.pool.submit(plan.key(slot, fid), plan.payload(fid, seed))
        with self._lock:
            self._plans.append(plan)

    def get(self) -> dict:
        """The next micro-batch: `finish(examples)` plus "fids" (the families used)."""
        with self._lock:
            plan = self._plans.popleft()
        examples, used = [], []
        for slot, fid in enumerate(plan.fids):
            example, family = self._resolve(plan, slot, fid)
            examples.append(example)
            used.append(family)
        out = self.finish(examples)
        return {"batch": out, "fids": used}

    def _resolve(self, plan: SlotPlan, slot: int, fid: str):
        at, tried = plan.at, set()
        family, key = fid, plan.key(slot, fid)
        while True:
            record = None
            if self.quarantine.banned(family, at):
                if key is not None:
                    self.pool.discard(key)
            else:
                if key is None:
                    key = plan.key(slot, family)
                    self.pool.submit(key, plan.payload(family, plan.seeds[slot]), urgent=True)
                outcome = self.pool.wait(key)
                if outcome.kind == "done":
                    self._failures_in_a_row = 0
                    return outcome.value, family
                record = make_record(family=family, rank=self.rank, step=plan.iteration,
                                     micro=plan.micro, slot=slot, reason=REASON_OF[outcome.kind],
                                     seconds=outcome.seconds, detail=outcome.detail,
                                     corpus=plan.corpus)
                self._failures_in_a_row += 1
            tried.add(family)
            nxt = replacement(family, plan.order,
                              lambda f: f not in tried and not self.quarantine.banned(f, at))
            if record is not None:
                record["replacement"] = nxt
                self.quarantine.add(record)
                record_quarantine(self.run_dir, record)
            if nxt is None or self._failures_in_a_row > MAX_CONSECUTIVE_FAILURES:
                why = (f"no usable family left in the shard of rank {self.rank}" if nxt is None
                       else f"{self._failures_in_a_row} families in a row could not be used")
                last = f" (last: {record['family']}: {record['reason']} {record['detail']})" \
                    if record else ""
                raise NoUsableFamily(f"{why} at step {plan.iteration}{last}; see quarantine.jsonl")
            family, key = nxt, None
