"""Launch pretraining the ways cluster users do: torchrun (elastic, restarts) or OpenMPI mpirun.

Builds the command lines for the training worker `python -m protdp.train` (what
`pipelines/pretrain.py` runs too); tests, `benchmarks/scaling.py` and the demo use them so
everyone runs the same entry point the README documents.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import protdp

TRAIN_MODULE = "protdp.train"
# the folder this protdp is imported from: launched workers import the same code
PACKAGE_PARENT = Path(protdp.__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(script: Path | None) -> list[str]:
    return [str(script)] if script is not None else ["-m", TRAIN_MODULE]


def torchrun_cmd(argv: list[str], nproc: int = 2, max_restarts: int = 0,
                 script: Path | None = None) -> list[str]:
    """`torchrun --standalone --nproc_per_node N [--max-restarts R] -m protdp.train ARGV`
    (or `script` instead of the module)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", *_entry(script), *argv]


def mpirun_cmd(argv: list[str], np: int = 2, script: Path | None = None) -> list[str]:
    """`mpirun -np N python -m protdp.train ARGV` (root-safe flags, rendezvous via env)."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np),
            "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", "-x", "OMP_NUM_THREADS",
            "-x", "PYTHONPATH", sys.executable, *_entry(script), *argv]


def worker_env(threads: int = 1) -> dict:
    """Environment for launched workers: one intra-op thread each, this protdp importable."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    env.setdefault("WANDB_SILENT", "true")
    return env
