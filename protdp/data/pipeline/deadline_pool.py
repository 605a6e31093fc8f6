"""A keyed pool of worker processes with a per-task deadline (issue 44): no straggler holds the
results behind it, and no dead worker ends the run.

Unlike `pool.OrderedPool` (results in submission order), every task has a key and its own
outcome, available as soon as it ends: `done` (the value), `error` (the task raised),
`deadline` (it ran longer than `policy.deadline(running median)`: its worker is killed) or
`worker_died` (its worker died under it: the kernel's OOM killer, a segfault in a C
extension, `os._exit`). A killed or dead worker is replaced by a fresh process and the pool goes
on. The deadline clock of a task starts when a worker reports it started it (a restarting
worker's import time never counts), and the running median is of the tasks that finished.

Each worker has its own task and result pipes (a worker killed mid-write corrupts only its own,
which are discarded with it; the parent keeps no copy of a worker's write end, so a death reads
as EOF, never a hang). A monitor thread waits on every result pipe and every process sentinel
at once (`multiprocessing.connection.wait`), hands the oldest waiting task (urgent ones first)
to each idle worker, and enforces the deadlines. Results travel with torch's reductions
(tensors in shared memory, only their handles pickled).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable, Hashable

from protdp.data.pipeline.pool import START_METHODS, WorkerError, _portable, worker_tasks
from protdp.data.pipeline.quarantine import DeadlinePolicy, RunningMedian

POLL_S = 0.05
MAX_IDLE_DEATHS = 5       # fresh workers dying before any task: the pool gives up
OUTCOMES = ("done", "error", "deadline", "worker_died")


@dataclass
class Outcome:
    kind: str                 # one of OUTCOMES
    value: Any = None         # the result (done) or the exception (error)
    seconds: float = 0.0      # run time on the worker (deadline / died: until it was stopped)
    detail: str = ""          # what happened, one line


def _worker_loop(fn: Callable, tasks, results) -> None:
    """Worker process: (key, payload) -> ("start", key, None), then ("done", key, (value, s))
    or ("error", key, (exception, s)); one thread each (`pool.worker_tasks`)."""
    results.put(("ready", None, None))
    for key, payload in worker_tasks(tasks):
        results.put(("start", key, None))
        t0 = time.perf_counter()
        try:
            out = fn(payload)
        except BaseException as exc:  # noqa: BLE001 - shipped to the consumer as an outcome
            results.put(("error", key, (_portable(exc), time.perf_counter() - t0)))
        else:
            results.put(("done", key, (out, time.perf_counter() - t0)))
            del out


class _Worker:
    def __init__(self, ctx, fn: Callable, slot: int):
        self.tasks, self.results = ctx.SimpleQueue(), ctx.SimpleQueue()
        self.proc = ctx.Process(target=_worker_loop, args=(fn, self.tasks, self.results),
                                daemon=True, name=f"protdp-data-{slot}")
        self.proc.start()
        self.results._writer.close()      # only the worker writes results: its death is EOF
        self.tasks._reader.close()
        self.ready = False                # started up: tasks go only to ready workers
        self.key: Hashable | None = None  # the task it holds
        self.started: float | None = None # when it reported starting it

    def stop(self, kill: bool = False) -> None:
        if kill and self.proc.is_alive():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
        self.proc.join(timeout=5.0)
        for end in (self.results._reader, self.tasks._writer):
            try:
                end.close()
            except OSError:
                pass


class DeadlinePool:
    """`workers` processes running `fn(payload)` (a module-level function) for keyed tasks.
    `submit(key, payload)`; `wait(key)` -> `Outcome`. `timeout`: a task that no worker has
    finished for this long while nothing else progressed is a `WorkerError` (a pool that cannot
    start workers at all); `describe(payload)` names a task in errors; `preload`: modules the
    forkserver imports once (when this pool starts it), so a replacement worker starts in
    milliseconds instead of importing torch again."""

    def __init__(self, fn: Callable[[Any], Any], workers: int, *, policy: DeadlinePolicy,
                 timeout: float = 300.0, describe: Callable[[Any], str] = repr,
                 start_method: str = "forkserver", preload: tuple[str, ...] = ()):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}")
        import torch.multiprocessing as tmp   # registers the shared-memory tensor reductions

        self._ctx, self._fn = tmp.get_context(start_method), fn
        if start_method == "forkserver":    # a restarted worker forks with these imported
            self._ctx.set_forkserver_preload(list(preload))
        self.policy, self.timeout, self.describe = policy, timeout, describe
        self.median = RunningMedian()
        self.restarts = 0
        self._idle_deaths = 0                    # workers that died holding no task, in a row
        self._fatal: WorkerError | None = None
        self._workers = [_Worker(self._ctx, fn, w) for w in range(workers)]
        self._queued: deque = deque()            # (key, payload), oldest first
        self._urgent: deque = deque()
        self._payloads: dict[Hashable, Any] = {}
        self._outcomes: dict[Hashable, Outcome] = {}
        self._discarded: set = set()
        self._cond = threading.Condition()
        self._closed = False
        self._last_progress = time.monotonic()
        self._monitor = threading.Thread(target=self._run, daemon=True, name="protdp-data-deadline")
        self._monitor.start()

    # ---------------------------------------------------------------- consumer side
    def submit(self, key: Hashable, payload: Any, *, urgent: bool = False) -> None:
        """Queue a task (`urgent`: before every queued one, e.g. a replacement a step waits for)."""
        with self._cond:
            if key in self._payloads or key in self._outcomes:
                raise ValueError(f"task {key!r} was already submitted")
            self._payloads[key] = payload
            (self._urgent if urgent else self._queued).append((key, payload))
            self._cond.notify_all()

    def deadline_s(self) -> float:
        return self.policy.deadline(self.median.median())

    def wait(self, key: Hashable) -> Outcome:
        """The outcome of task `key` (blocks until it has one)."""
        with self._cond:
            if key not in self._payloads and key not in self._outcomes:
                raise KeyError(f"task {key!r} was never submitted")
            while key not in self._outcomes:
                if self._fatal is not None:
                    raise self._fatal
                if self._closed:
                    raise WorkerError("the data worker pool was closed")
                if time.monotonic() - self._last_progress > self.timeout:
                    raise WorkerError(f"no data worker made progress for {self.timeout:g} s while "
                                      f"{self.describe(self._payloads[key])} waited "
                                      "(--data-timeout)")
                self._cond.wait(timeout=POLL_S * 4)
            self._payloads.pop(key, None)
            return self._outcomes.pop(key)

    def discard(self, key: Hashable) -> None:
        """Task `key`'s result is not wanted: drop it if still queued, else when it arrives."""
        with self._cond:
            for q in (self._queued, self._urgent):
                for item in list(q):
                    if item[0] == key:
                        q.remove(item)
                        self._payloads.pop(key, None)
                        return
            if self._outcomes.pop(key, None) is None and key in self._payloads:
                self._discarded.add(key)
            self._payloads.pop(key, None)

    # ---------------------------------------------------------------- monitor thread
    def _finish(self, key: Hashable, outcome: Outcome) -> None:
        """Record `outcome` (with the lock held)."""
        self._last_progress = time.monotonic()
        if key in self._discarded:
            self._discarded.discard(key)
        else:
            self._outcomes[key] = outcome
        self._cond.notify_all()

    def _read(self, w: _Worker) -> None:
        try:
            kind, key, value = w.results.get()
        except (EOFError, OSError):
            return                                       # dead: handled by its sentinel
        except Exception as exc:  # noqa: BLE001 - a result whose shared memory vanished
            kind, key, value = "error", w.key, (RuntimeError(f"result lost: {exc}"), 0.0)
        with self._cond:
            if kind == "ready":
                w.ready = True
                return
            if kind == "start":
                w.started = time.monotonic()
                return
            if key != w.key:
                return
            value, seconds = value
            if kind == "done":
                self.median.add(seconds)
            self._finish(key, Outcome(kind, value, seconds,
                                      "" if kind == "done" else f"{type(value).__name__}: {value}"))
            w.key, w.started = None, None

    def _replace(self, i: int, outcome: Outcome | None, kill: bool) -> None:
        """Stop worker i (killing it when `kill`), record `outcome` for its task, start a fresh one."""
        w = self._workers[i]
        w.stop(kill=kill)
        with self._cond:
            if w.key is not None and outcome is not None:
                self._finish(w.key, outcome)
            self._idle_deaths = 0 if w.key is not None else self._idle_deaths + 1
            if self._idle_deaths > MAX_IDLE_DEATHS:     # workers cannot even start
                self._fatal = WorkerError(f"data workers keep dying before taking a task "
                                          f"({self._idle_deaths} in a row; last: {outcome.detail})")
                self._cond.notify_all()
                return
            if self._closed:
                return
        self.restarts += 1
        self._workers[i] = _Worker(self._ctx, self._fn, i)

    def _check(self) -> None:
        """Deadlines and deaths."""
        now = time.monotonic()
        for i, w in enumerate(self._workers):
            if not w.proc.is_alive():
                code = w.proc.exitcode
                sig = f" (signal {signal.Signals(-code).name})" if code is not None and code < 0 \
                    and -code in signal.Signals._value2member_map_ else ""
                ran = now - w.started if w.started is not None else 0.0
                self._replace(i, Outcome("worker_died", None, ran,
                                         f"data worker died with exit code {code}{sig}"), kill=False)
            elif w.key is not None and w.started is not None:
                limit = self.deadline_s()
                if now - w.started > limit:
                    self._replace(i, Outcome("deadline", None, now - w.started,
                                             f"over the {limit:.3g} s deadline"), kill=True)

    def _dispatch(self) -> None:
        with self._cond:
            for w in self._workers:
                if w.key is not None or not w.ready or not w.proc.is_alive():
                    continue
                if not (self._urgent or self._queued):
                    return
                key, payload = (self._urgent or self._queued).popleft()
                w.key, w.started = key, None
                try:
                    w.tasks.put((key, payload))
                except (OSError, ValueError):      # died meanwhile: the sentinel reports it
                    pass

    def _run(self) -> None:
        while not self._closed:
            self._dispatch()
            readers = {w.results._reader: w for w in self._workers}
            sentinels = [w.proc.sentinel for w in self._workers]
            try:
                ready = wait_any(list(readers) + sentinels, timeout=POLL_S)
            except (OSError, ValueError):
                ready = []
            for r in ready:
                if r in readers and not self._closed:
                    self._read(readers[r])
            if not self._closed:
                self._check()

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop the monitor and every worker (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._monitor is not threading.current_thread():
            self._monitor.join(timeout=5.0)
        for w in self._workers:
            try:
                if w.key is None:
                    w.tasks.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for w in self._workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            w.stop(kill=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
