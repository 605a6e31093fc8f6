"""Launch pretraining the ways cluster users do: torchrun (elastic, restarts) or OpenMPI mpirun.

Builds the command lines for `pipelines/pretrain.py`; tests, `benchmarks/scaling.py` and the
demo use them so everyone runs the same entry point the README documents.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from protdp.paths import REPO_ROOT

PRETRAIN = REPO_ROOT / "pipelines" / "pretrain.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(argv: list[str], nproc: int = 2, max_restarts: int = 0,
                 script: Path = PRETRAIN) -> list[str]:
    """`torchrun --standalone --nproc_per_node N [--max-restarts R] pipelines/pretrain.py ARGV`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", str(script), *argv]


def mpirun_cmd(argv: list[str], np: int = 2, script: Path = PRETRAIN) -> list[str]:
    """`mpirun -np N python pipelines/pretrain.py ARGV` (root-safe flags, rendezvous via env)."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np),
            "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", "-x", "OMP_NUM_THREADS",
            "-x", "PYTHONPATH", sys.executable, str(script), *argv]


def worker_env(threads: int = 1) -> dict:
    """Environment for launched workers: one intra-op thread each, repo importable."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("WANDB_SILENT", "true")
    return env


def demo_train_argv(store: str | Path, out_dir: str | Path, train_iters: int | None = None
                    ) -> list[str]:
    """The demo's flags: small model, 2 CPU ranks, overlap + distributed optimizer
    (iterations from configs/train/demo.yaml unless `train_iters` is given)."""
    argv = ["--config", str(REPO_ROOT / "configs" / "train" / "demo.yaml"), "--data", str(store),
            "--save", str(out_dir), "--load", str(out_dir)]
    return argv + (["--train-iters", str(train_iters)] if train_iters else [])


def run_demo_training(store: str | Path, out_dir: str | Path, train_iters: int | None = None,
                      nproc: int = 2) -> int:
    """What `make demo` runs after building the store: torchrun on pipelines/pretrain.py."""
    cmd = torchrun_cmd(demo_train_argv(store, out_dir, train_iters), nproc=nproc, max_restarts=2)
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=worker_env(), cwd=REPO_ROOT).returncode
