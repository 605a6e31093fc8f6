"""One progress bar for a whole run (every rank's finished items, not this rank's), shown by
one process (rank 0): a thread reads the queue's counts and moves a tqdm bar, whose rate and
ETA are then those of the run."""

from __future__ import annotations

import threading

from tqdm import tqdm

from protdp.workqueue.engine import WorkQueueError
from protdp.workqueue.queue import WorkQueue

POLL_S = 1.0


class RunProgress:
    """`with RunProgress(queue, "predict"):` shows done+failed of total across the run."""

    def __init__(self, queue: WorkQueue, desc: str, unit: str = "target", *,
                 enabled: bool = True, poll_s: float = POLL_S):
        self.queue, self.desc, self.unit = queue, desc, unit
        self.enabled, self.poll_s = enabled, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-progress", daemon=True)
        self._bar = None

    def _update(self) -> None:
        try:
            c = self.queue.counts()
        except WorkQueueError:
            return
        finished = c["done"] + c["failed"]
        if self._bar is None:
            self._bar = tqdm(total=c["total"], initial=finished, desc=self.desc, unit=self.unit)
        elif finished > self._bar.n:
            self._bar.update(finished - self._bar.n)
        self._bar.set_postfix(running=c["running"], failed=c["failed"], refresh=True)

    def _run(self) -> None:
        self._update()
        while not self._stop.wait(self.poll_s):
            self._update()

    def __enter__(self) -> "RunProgress":
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        self._stop.set()
        self._thread.join()
        self._update()
        if self._bar is not None:
            self._bar.close()
