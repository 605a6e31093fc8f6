"""An ordered, prefetching pool of worker processes (the DataLoader pattern with persistent
workers, made exact for resumable training).

Tasks are submitted in order and numbered; any free worker takes the oldest waiting task; the
results come back in submission order whatever the number of workers or their timing, so a
batch is a pure function of its task. Workers are started with `forkserver` (or `spawn`):
never `fork` a process that already runs torch's thread pools. A task that raises re-raises
its exception (the same class and message) when its result is asked for. Results travel
through torch's multiprocessing queues: tensors in them are moved to shared memory and only
their handles are pickled, so an 88 MB batch is not copied through a pipe. A worker that dies
or makes no progress for `timeout` seconds is a `WorkerError` naming the task (the
families), never a silent hang of the training job.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Callable

START_METHODS = ("forkserver", "spawn")
POLL_S = 0.2


class WorkerError(RuntimeError):
    """A data worker died or hung."""


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


def worker_tasks(tasks):
    """The (key, payload) items a worker process takes from `tasks` until the None sentinel,
    each run on one thread (the workers are the parallelism); shared by this pool and
    `deadline_pool`."""
    import os
    import sys

    os.environ["OMP_NUM_THREADS"] = "1"
    while True:
        item = tasks.get()
        if item is None:
            return
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
        yield item


def _worker_loop(worker: int, fn: Callable, tasks, results) -> None:
    """Worker process: take (index, payload), answer ("start"|"done"|"error", index, ...)."""
    for index, payload in worker_tasks(tasks):
        results.put(("start", index, worker))
        try:
            out = fn(payload)
        except BaseException as exc:  # noqa: BLE001 - shipped to the consumer, raised there
            results.put(("error", index, _portable(exc)))
        else:
            results.put(("done", index, out))


class OrderedPool:
    """`workers` processes running `fn(payload)` (a module-level function); `submit` returns a
    task number, `get` the next result in submission order. `describe(payload)` names a task
    in errors."""

    def __init__(self, fn: Callable[[Any], Any], workers: int, *, timeout: float = 300.0,
                 describe: Callable[[Any], str] = repr, start_method: str = "forkserver"):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}")
        import torch.multiprocessing as tmp   # its queues pass tensors through shared memory

        ctx = tmp.get_context(start_method)
        self.timeout, self.describe = timeout, describe
        self._tasks, self._results = ctx.Queue(), ctx.Queue()
        self._procs = [ctx.Process(target=_worker_loop, args=(w, fn, self._tasks, self._results),
                                   daemon=True, name=f"protdp-data-{w}") for w in range(workers)]
        for p in self._procs:
            p.start()
        self._payloads: dict[int, Any] = {}      # submitted, not yet returned by get()
        self._ready: dict[int, tuple] = {}       # finished, waiting for their turn
        self._running: dict[int, int] = {}       # worker -> task it started last
        self._next_submit = self._next_get = 0
        self._closed = False
        self._error: WorkerError | None = None   # what closed the pool, raised again by submit
        # a receiver thread reads (and unpickles) results as they arrive, so a prefetched
        # batch is already in this process when the training thread asks for it
        self._cond = threading.Condition()
        self._last_progress = time.monotonic()
        self._receiver = threading.Thread(target=self._receive, daemon=True, name="protdp-data-rx")
        self._receiver.start()

    def _receive(self) -> None:
        while not self._closed:
            try:
                kind, i, value = self._results.get(timeout=POLL_S)
            except queue.Empty:
                continue
            except (EOFError, OSError, ValueError):    # queue closed under us
                return
            with self._cond:
                self._last_progress = time.monotonic()
                if kind == "start":
                    self._running[value] = i
                else:
                    self._ready[i] = (kind, value)
                self._cond.notify_all()

    @property
    def outstanding(self) -> int:
        return self._next_submit - self._next_get

    def submit(self, payload: Any) -> int:
        if self._closed:    # after a dead or hung worker: its error, not "queue is closed"
            raise self._error or WorkerError("the data worker pool was closed")
        index = self._next_submit
        self._payloads[index] = payload
        self._tasks.put((index, payload))
        self._next_submit += 1
        return index

    def _dead_worker(self) -> WorkerError | None:
        for w, p in enumerate(self._procs):
            if not p.is_alive():
                index = self._running.get(w)
                what = ("between tasks" if index is None or index not in self._payloads
                        else f"while building {self.describe(self._payloads[index])}")
                return WorkerError(f"data worker {w} (pid {p.pid}) died with exit code "
                                   f"{p.exitcode} {what}")
        return None

    def get(self) -> Any:
        """The result of the oldest task not yet returned (blocks; raises its error)."""
        if self._next_get >= self._next_submit:
            raise RuntimeError("OrderedPool.get() with no task submitted")
        index = self._next_get
        started = time.monotonic()
        error = None
        with self._cond:
            while index not in self._ready and error is None:
                self._cond.wait(timeout=POLL_S)
                if index in self._ready:
                    break
                if self._closed:      # closed from another thread (the feed's shutdown)
                    raise WorkerError("the data worker pool was closed")
                error = self._dead_worker()
                if error is None and time.monotonic() - max(started, self._last_progress) > self.timeout:
                    owner = [w for w, t in self._running.items() if t == index]
                    who = f"data worker {owner[0]}" if owner else "no data worker (all busy)"
                    error = WorkerError(f"{who} made no progress for {self.timeout:g} s while "
                                        f"building {self.describe(self._payloads[index])} "
                                        "(--data-timeout)")
            if error is None:
                kind, value = self._ready.pop(index)
        if error is not None:
            self._error = error
            self.close()
            raise error
        self._payloads.pop(index)
        self._next_get += 1
        if kind == "error":
            raise value
        return value

    def close(self) -> None:
        """Stop the workers (idempotent): a polite stop, then terminate what is left."""
        if self._closed:
            return
        self._closed = True
        if self._receiver is not threading.current_thread():
            self._receiver.join(timeout=2 * POLL_S + 1.0)
        for _ in self._procs:
            try:
                self._tasks.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
        for q in (self._tasks, self._results):
            q.cancel_join_thread()
            q.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
