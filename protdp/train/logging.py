"""Per-step metrics: step-time breakdown, throughput, memory -> metrics.jsonl, wandb, console.

The breakdown answers "is compute waiting for communication?": every iteration is split into
data wait (reading + featurizing), forward, backward (which, with --overlap-grad-reduce,
already contains the launched bucket reductions), exposed communication (time blocked in
`finish_grad_sync`, i.e. reduction not hidden behind backward) and optimizer (step + param
all-gather). Phase times are means over ranks (they add up to the rank-mean step time);
`time/step` is the slowest rank's, which sets throughput. Only rank 0 writes; records are flushed line by line so a killed run keeps
everything up to its last step.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import sys
import time
from pathlib import Path

import torch

PHASES = ("data_wait", "forward", "backward", "exposed_comm", "optimizer")


class StepTimer:
    """Accumulates wall time per phase within one iteration (CUDA-synchronised when used)."""

    def __init__(self, device: torch.device | None = None):
        self.cuda = device is not None and device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.times = {p: 0.0 for p in PHASES}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.times[name] += time.perf_counter() - t0

    def total(self) -> float:
        return time.perf_counter() - self.start


def max_memory_mb(device: torch.device | None = None) -> float:
    """Peak device memory (CUDA) or peak resident set size of this process (CPU), MiB."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def format_breakdown(rec: dict) -> str:
    """One console line: iteration, loss, lr and where the step time went."""
    step = rec.get("time/step_mean", rec.get("time/step", 0.0)) or 1e-12
    parts = [f"iter {rec['iteration']:>6}", f"loss {rec['loss']:.4f}", f"lr {rec['lr']:.2e}"]
    if "train_lddt_ca" in rec:
        parts.append(f"lDDT {rec['train_lddt_ca']:.3f}")
    parts.append(f"step {1000 * rec.get('time/step', step):.0f} ms (rank mean {1000 * step:.0f} =")
    parts.append(" ".join(f"{p} {1000 * rec.get('time/' + p, 0.0):.0f}"
                          f"({100 * rec.get('time/' + p, 0.0) / step:.0f}%)" for p in PHASES) + ")")
    parts.append(f"| {rec.get('samples_per_s', 0):.2f} samples/s {rec.get('residues_per_s', 0):.0f} res/s"
                 f" | max mem {rec.get('max_memory_mb', 0):.0f} MiB")
    return "  ".join(parts)


def _jsonable(v):
    if isinstance(v, torch.Tensor):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunLogger:
    """Rank-0 sink for step and eval records: metrics.jsonl + wandb + tqdm + console lines."""

    def __init__(self, run_dir: Path, *, rank: int, config: dict, start_iter: int, train_iters: int,
                 log_interval: int, wandb_mode: str = "offline", wandb_project: str = "protdp",
                 wandb_name: str | None = None, progress_bar: bool = True):
        self.rank = rank
        self.log_interval = log_interval
        self.active = rank == 0
        self.wandb = None
        self.bar = None
        if not self.active:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.fh = open(self.path, "a", buffering=1)
        if wandb_mode != "disabled":
            import wandb  # imported lazily: slow, and not needed when disabled

            self.wandb = wandb.init(mode=wandb_mode, project=wandb_project, name=wandb_name,
                                    dir=str(run_dir), config=config, resume="allow")
        if progress_bar and sys.stderr.isatty():  # piped output gets the breakdown lines only
            from tqdm import tqdm

            self.bar = tqdm(total=train_iters, initial=start_iter, desc="train", dynamic_ncols=True,
                            file=sys.stderr, mininterval=1.0)

    def write(self, rec: dict) -> None:
        if not self.active:
            return
        rec = {k: _jsonable(v) for k, v in rec.items()}
        self.fh.write(json.dumps(rec) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in rec.items() if isinstance(v, (int, float))},
                           step=rec["iteration"])

    def step(self, rec: dict) -> None:
        """A training-step record (every iteration)."""
        if not self.active:
            return
        self.write({"type": "train", **rec})
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{rec['loss']:.3f}",
                                 comm=f"{1000 * rec.get('time/exposed_comm', 0):.0f}ms", refresh=False)
        if rec["iteration"] % self.log_interval == 0:
            self.print(format_breakdown(rec))

    def eval(self, rec: dict) -> None:
        if not self.active:
            return
        self.write({"type": "eval", **rec})
        self.print(f"eval @ iter {rec['iteration']}: " + "  ".join(
            f"{k} {v:.4f}" for k, v in rec.items() if k != "iteration" and isinstance(v, float)))

    def print(self, line: str) -> None:
        if not self.active:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if not self.active:
            return
        if self.bar is not None:
            self.bar.close()
        self.fh.close()
        if self.wandb is not None:
            self.wandb.finish()
