"""Fault injection for the tests and benchmarks of the tolerant feed (issue 44): nothing else.

Honoured only when the environment variable `PROTDP_DATA_FAULTS` names a JSON file; without it
`inject` returns at once and nothing here runs. The file maps family ids to what featurizing
them does in a data worker, before the real work:

    {"1abc_A": {"sleep": 30.0},          # a straggler: 30 s longer than it should be
     "2xyz_B": {"kill": true},           # the worker dies (SIGKILL to itself, as the OOM killer)
     "3def_C": {"raise": "bad family"},  # featurization raises (a family training cannot use)
     "5jkl_E": {"times_slower": 100},    # featurizing takes 100x its own time (sleeps 99x after)
     "4ghi_D": {"sleep": 30.0, "times": 1}}   # only the first attempt in the run

`times`: the fault fires on the first N attempts only, counted with marker files in
`state_dir` (a key of the file; default: the file's folder), so the count survives worker
restarts and a resumed run. Applied in the data workers only (`protdp.train.feed`: the
per-family and the per-micro-batch task functions), with the path the training process read.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

ENV = "PROTDP_DATA_FAULTS"
_CACHE: dict = {}


def configured() -> str | None:
    """The fault file named by PROTDP_DATA_FAULTS in this process (None: no faults). The feed
    reads it in the training process and ships it in the task payloads: a forkserver's workers
    do not see environment changes made after the server started."""
    return os.environ.get(ENV) or None


def _spec(path: str | None) -> dict:
    if not path:
        return {}
    if path not in _CACHE:
        spec = json.loads(Path(path).read_text())
        spec.setdefault("state_dir", str(Path(path).parent))
        _CACHE[path] = spec
    return _CACHE[path]


def _fires(family: str, fault: dict, state_dir: str) -> bool:
    times = fault.get("times")
    if times is None:
        return True
    for k in range(int(times)):          # claim the first free marker (atomic O_EXCL create)
        try:
            fd = os.open(Path(state_dir) / f"fault-{family}-{k}", os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            continue
        os.close(fd)
        return True
    return False


def inject(family: str, path: str | None) -> float:
    """Apply the fault of `family` in fault file `path` (`configured()`; None: a no-op) and
    return its slowdown factor (1.0: none; the caller sleeps (factor - 1) x its featurize time)."""
    spec = _spec(path)
    fault = spec.get(family) if spec else None
    if not isinstance(fault, dict) or not _fires(family, fault, spec["state_dir"]):
        return 1.0
    if fault.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if "sleep" in fault:
        time.sleep(float(fault["sleep"]))
    if "raise" in fault:
        raise RuntimeError(f"injected fault: {fault['raise']}")
    return float(fault.get("times_slower", 1.0))


def slow_down(factor: float, seconds: float) -> None:
    """The rest of a `times_slower` fault: sleep (factor - 1) x the real featurize seconds."""
    if factor > 1.0:
        time.sleep((factor - 1.0) * seconds)
