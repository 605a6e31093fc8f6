"""The trainer's release checks: `protdp release CHECKPOINT` in the background, one at a time.

Rank 0 hands every saved checkpoint to `ReleaseChecks.submit`. A check runs as its own process
(its own session, so it never stalls training and outlives a crashed trainer) and writes
CHECKPOINT/release.json and release.log. At most one runs at a time: a release check predicts
every held-out family and runs the red-team suite, which can take longer than a save interval,
and checks piling up would steal the CPU the training ranks need. A checkpoint saved while one
runs waits; a newer save replaces the waiting one (the log says which was skipped), so the
newest checkpoint is always the next one checked. `finish` at the end of training waits for the
running check and then checks the final checkpoint, whose verdict the trainer reports.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from protdp.train.launch import worker_env

RELEASE_LOG = "release.log"


def release_command(checkpoint: Path) -> list[str]:
    return [sys.executable, "-m", "protdp.cli", "release", str(checkpoint)]


@dataclass
class ReleaseJob:
    path: Path                   # the checkpoint folder under evaluation
    log: Path
    proc: subprocess.Popen


def launch_release_check(checkpoint: Path,
                         command: Callable[[Path], list[str]] = release_command) -> ReleaseJob:
    """Start the release check of `checkpoint` as a background process; its output goes to
    CHECKPOINT/release.log."""
    log = Path(checkpoint) / RELEASE_LOG
    with open(log, "wb") as fh:
        proc = subprocess.Popen(command(Path(checkpoint)), stdout=fh, stderr=subprocess.STDOUT,
                                env=worker_env(), start_new_session=True)
    return ReleaseJob(Path(checkpoint), log, proc)


class ReleaseChecks:
    """One running release check and at most one waiting checkpoint (the newest)."""

    def __init__(self, log: Callable[[str], None] = print,
                 command: Callable[[Path], list[str]] = release_command):
        self.log = log
        self.command = command
        self.running: ReleaseJob | None = None
        self.waiting: Path | None = None
        self.launched: list[Path] = []      # every checkpoint whose check was started
        self.skipped: list[Path] = []       # superseded before their turn came

    def _start(self, checkpoint: Path) -> None:
        self.running = launch_release_check(checkpoint, self.command)
        self.launched.append(Path(checkpoint))

    def in_use(self) -> set[Path]:
        """The checkpoint folder a running check reads (keep-last pruning spares it)."""
        running = self.running is not None and self.running.proc.poll() is None
        return {self.running.path} if running else set()

    def poll(self) -> None:
        """Start the waiting checkpoint's check once the running one has ended."""
        if self.running is not None and self.running.proc.poll() is None:
            return
        self.running = None
        if self.waiting is not None:
            checkpoint, self.waiting = self.waiting, None
            self._start(checkpoint)

    def submit(self, checkpoint: Path) -> None:
        """Check `checkpoint` now, or next if a check is running (replacing a waiting one)."""
        self.poll()
        if self.running is None:
            self._start(checkpoint)
            return
        if self.waiting is not None:
            self.skipped.append(self.waiting)
            self.log(f"release check of {self.waiting} skipped: {checkpoint} is newer and waits "
                     f"for the running check of {self.running.path}")
        self.waiting = Path(checkpoint)

    def finish(self) -> ReleaseJob | None:
        """Wait until every started or waiting check has ended; the last job (None if none)."""
        last = self.running
        while self.running is not None or self.waiting is not None:
            if self.running is not None:
                self.running.proc.wait()
                last = self.running
            self.poll()
            last = self.running or last
        return last
