"""Per-family deadlines and the quarantine of families training cannot use (issue 44).

At scale a step waits for its slowest sample: one family whose featurization takes 100x the
median (a 30,000-row MSA, a huge template hit list, a pathological structure) or kills its
worker would stall every rank. The feed (`protdp.train.feed`, tolerant mode) therefore gives
every family a deadline; a family that misses it, kills its worker or raises is *set aside for
that step* and its slot is filled by a deterministic replacement, and a quarantine record is
written. This module holds the rules, as pure functions and small state:

- the deadline: `DeadlinePolicy.deadline(median)` = max(floor, multiple x running median of the
  per-family featurization seconds of the last `MEDIAN_WINDOW` families), capped by
  --data-timeout; defaults `DEADLINE_MULTIPLE` (10) and `DEADLINE_FLOOR_S` (30 s), the one
  definition of both numbers (flags --data-deadline-multiple, --data-deadline-floor). Until
  `MEDIAN_MIN_SAMPLES` families have finished (cold workers: imports, first file opens) it
  is `DEADLINE_WARMUP_FACTOR` x the floor;
- the replacement: `replacement(family, order, usable)`, the next usable family after it in the
  rank's shard order (cyclic), so the micro-batch keeps its size and every rank its collective
  schedule;
- the strikes: a family quarantined `max_strikes` times (`MAX_STRIKES`, --quarantine-strikes)
  on a rank is never tried again in the run (`Quarantine.banned`). Decisions are counted per
  rank, from the rank's own records of *earlier* micro-batches, so they are a pure function of
  the record list: a resumed run loads the records from the checkpoint and replays them
  instead of re-timing anything;
- the records: one JSON line per set-aside family in the run folder's `quarantine.jsonl`
  (`record_quarantine`, also the entry point for other code that cannot use a family: training
  never silently drops one).
"""

from __future__ import annotations

import json
import os
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

DEADLINE_MULTIPLE = 10.0     # x the running median featurization time of one family
DEADLINE_FLOOR_S = 30.0      # never less than this (a cold cache, a busy node)
DEADLINE_WARMUP_FACTOR = 3.0   # x the floor until the median is known (cold workers, first files)
MAX_STRIKES = 3              # quarantined this many times on a rank: never tried again
MAX_CONSECUTIVE_FAILURES = 16   # families in a row that fail: a broken corpus, not a straggler
MEDIAN_WINDOW = 256          # families in the running median
MEDIAN_MIN_SAMPLES = 8       # below this many timed families the deadline is the floor
QUARANTINE_FILE = "quarantine.jsonl"
REASONS = ("deadline", "worker_died", "error")


@dataclass(frozen=True)
class DeadlinePolicy:
    """How long one family may take: max(floor_s, multiple x median), at most cap_s."""

    multiple: float = DEADLINE_MULTIPLE
    floor_s: float = DEADLINE_FLOOR_S
    cap_s: float = float("inf")
    max_strikes: int = MAX_STRIKES

    def __post_init__(self):
        if self.multiple <= 0 or self.floor_s <= 0 or self.cap_s <= 0:
            raise ValueError(f"deadline multiple, floor and cap must be > 0, got {self}")
        if self.max_strikes < 1:
            raise ValueError(f"max_strikes must be >= 1, got {self.max_strikes}")

    def deadline(self, median: float | None) -> float:
        """Seconds for the next family given the running median (None: not enough samples
        yet, the run's first families on cold workers: DEADLINE_WARMUP_FACTOR x the floor)."""
        base = (DEADLINE_WARMUP_FACTOR * self.floor_s if median is None
                else max(self.floor_s, self.multiple * median))
        return min(base, self.cap_s)


class RunningMedian:
    """Median of the last `window` values (None until `min_samples` were added)."""

    def __init__(self, window: int = MEDIAN_WINDOW, min_samples: int = MEDIAN_MIN_SAMPLES):
        self.values: deque[float] = deque(maxlen=window)
        self.min_samples = min_samples

    def add(self, seconds: float) -> None:
        self.values.append(float(seconds))

    def median(self) -> float | None:
        if len(self.values) < self.min_samples:
            return None
        return statistics.median(self.values)


def replacement(family: str, order: list[str], usable: Callable[[str], bool]) -> str | None:
    """The next family after `family` in the rank's shard `order` (cyclic) that is `usable`;
    None when no other family is. A family missing from `order` starts at its beginning."""
    if not order:
        return None
    start = order.index(family) + 1 if family in order else 0
    for k in range(len(order)):
        cand = order[(start + k) % len(order)]
        if cand != family and usable(cand):
            return cand
    return None


def shard_order(batches: Iterable[Iterable[str]]) -> list[str]:
    """The rank's families in the order its micro-batches serve them (first sighting)."""
    return list(dict.fromkeys(f for b in batches for f in b))


def make_record(*, family: str, rank: int, step: int, reason: str, seconds: float,
                micro: int = 0, slot: int = 0, replacement: str | None = None,
                detail: str = "", corpus: str = "") -> dict:
    """One quarantine record (a `quarantine.jsonl` line). step = the iteration it was set
    aside in; (step, micro, slot) orders the records of a rank."""
    if reason not in REASONS:
        raise ValueError(f"quarantine reason must be one of {REASONS}, got {reason!r}")
    return {"family": family, "rank": int(rank), "step": int(step), "micro": int(micro),
            "slot": int(slot), "reason": reason, "seconds": round(float(seconds), 3),
            "replacement": replacement, "detail": detail[:300], "corpus": corpus}


class Quarantine:
    """A rank's quarantine records (as decided, in (step, micro, slot) order) and the rules
    derived from them."""

    def __init__(self, max_strikes: int = MAX_STRIKES, records: Iterable[dict] = ()):
        self.max_strikes = max_strikes
        self.records: list[dict] = [dict(r) for r in records]

    def add(self, record: dict) -> None:
        self.records.append(record)

    def strikes(self, family: str, before: tuple[int, int]) -> int:
        """Records of `family` from micro-batches before (step, micro) `before`."""
        return sum(1 for r in self.records
                   if r["family"] == family and (r["step"], r["micro"]) < tuple(before))

    def banned(self, family: str, at: tuple[int, int]) -> bool:
        """Never tried again at (step, micro) `at`: quarantined max_strikes times before it."""
        return self.strikes(family, at) >= self.max_strikes

    def upto(self, at: tuple[int, int]) -> list[dict]:
        """Records of micro-batches up to and including (step, micro) `at` (for checkpoints:
        the records as consumed, not as prefetched)."""
        return [r for r in self.records if (r["step"], r["micro"]) <= tuple(at)]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r["family"]] = out.get(r["family"], 0) + 1
        return out


def record_quarantine(run_dir: str | Path | None, record: dict | None = None, **fields) -> dict:
    """Append one record to RUN_DIR/quarantine.jsonl (one line, flushed and fsynced: a killed run
    keeps every line it wrote) and return it. Pass a `make_record` dict, or its fields:
    `record_quarantine(run, family="1abc_A", rank=0, step=12, reason="error", seconds=0.0,
    detail="no residues")`. `run_dir` None: nothing is written (the record is returned)."""
    rec = record if record is not None else make_record(**fields)
    if run_dir is not None:
        path = Path(run_dir) / QUARANTINE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    return rec


def read_quarantine(path: str | Path) -> list[dict]:
    """The records of a quarantine.jsonl ([] when there is none; a torn last line is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):
                continue
            from protdp.errors import InputError

            raise InputError("not a quarantine record", path=path, line=lineno) from None
        if isinstance(rec, dict) and "family" in rec:
            out.append(rec)
    return out
