"""One thread in the training process between the worker pool and the training thread (the
role of torch DataLoader's pin-memory thread): it takes the pool's results in order, prepares
each one ahead of the step that uses it and releases the batches the training thread is done
with, so none of that runs on the critical path.

What it moves off the training thread, per micro-batch: the first touch of a CPU batch's
shared-memory pages (page faults the forward pass would otherwise take) and the release of a
finished batch (the munmap of its shared memory when the last reference goes); on a GPU,
`prepare` pins the compact arrays (page-locked host copies for the `non_blocking` copy).
Measured in benchmarks/results/loader_cpu_feed.json.

Order and content are the pool's: `expect()` is called once per submitted task, `get()`
returns the results in the same order. An exception of the pool (a task's own error, a dead or
hung worker) is re-raised by `get()` as it is, with its one-line message.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import numpy as np
import torch

POLL_S = 0.2
PAGE_BYTES = 4096


def touch_pages(batch: Any) -> Any:
    """Read one byte of every page of every CPU tensor in `batch` (a dict or list of them):
    the page faults of a shared-memory batch happen here instead of in the forward pass."""
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, list) else ()
    for v in values:
        if isinstance(v, (dict, list)):
            touch_pages(v)
        elif (isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.numel()
              and v.is_contiguous() and not v.requires_grad):
            # numpy, not a torch op: no intra-op thread pool is used from this thread
            v.view(-1).view(torch.uint8).numpy()[::PAGE_BYTES].sum()
        elif isinstance(v, np.ndarray) and v.size and v.flags.c_contiguous:
            v.reshape(-1).view(np.uint8)[::PAGE_BYTES].sum()
    return batch


def pin_arrays(batch: Any) -> Any:
    """Page-locked copies of the CPU tensors in `batch` (dicts / lists nested), for
    `non_blocking` host-to-GPU copies (`expand.to_device` keeps pinned tensors as they are)."""
    if isinstance(batch, dict):
        return {k: pin_arrays(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [pin_arrays(v) for v in batch]
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch if batch.flags.c_contiguous else batch.copy())
    if isinstance(batch, torch.Tensor) and batch.device.type == "cpu":
        return batch.pin_memory()
    return batch


class ReadyThread:
    """Results of `pool` (an `OrderedPool`), each passed through `prepare`, `depth` ahead.
    `device`: a CUDA device is made current in the thread (pinned memory belongs to it)."""

    def __init__(self, pool, prepare: Callable[[Any], Any], *, depth: int = 1,
                 device: torch.device | None = None):
        self.pool, self.prepare, self.device = pool, prepare, device
        self._todo: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._release: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="protdp-data-ready")
        self._thread.start()

    def expect(self) -> None:
        """One more task was submitted to the pool."""
        self._todo.put(True)

    def release(self, obj: Any) -> None:
        """Drop `obj` (a batch the training thread no longer uses) in this thread."""
        self._release.put(obj)

    def _drain_release(self) -> None:
        while True:
            try:
                self._release.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while not self._stop.is_set():
            self._drain_release()
            try:
                item = self._todo.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is None:
                break
            try:
                out = ("ok", self.prepare(self.pool.get()))
            except BaseException as exc:  # noqa: BLE001 - raised on the training thread
                out = ("error", exc)
            while not self._stop.is_set():
                try:
                    self._done.put(out, timeout=POLL_S)
                    break
                except queue.Full:
                    self._drain_release()
            del out
            self._drain_release()
        self._drain_release()

    def get(self) -> Any:
        """The next prepared result (blocks; raises the task's or the pool's error)."""
        while True:
            try:
                kind, value = self._done.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the data ready thread stopped") from None
        if kind == "error":
            raise value
        return value

    def stop(self) -> None:
        """Ask the thread to stop (it does once the pool's `get` returns or the pool is closed)."""
        if not self._stop.is_set():
            self._stop.set()
            self._todo.put(None)

    def close(self) -> None:
        """Stop the thread and wait for it (idempotent): `stop()`, close the pool, `close()`."""
        self.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        while True:
            try:
                self._done.get_nowait()
            except queue.Empty:
                break
        self._drain_release()
