"""`protdp train` (the same Megatron-style flags as `pipelines/pretrain.py`) and `protdp report`.

Inside a launcher (torchrun, mpirun, srun) it runs this process's rank. Without one it runs a
world of 1 in-process, or, when `--data-parallel-size N` > 1 asks for more ranks, re-launches
itself as `torchrun --standalone --nproc_per_node N pipelines/pretrain.py <same flags>`.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
from pathlib import Path

from protdp.train.args import parse_args
from protdp.train.data_report import quarantine_table
from protdp.train.report import render


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from protdp.parallel.env import detect_launch_env

    launch = detect_launch_env()
    if launch.launcher == "none" and (args.data_parallel_size or 1) > 1:
        from protdp.train.launch import torchrun_cmd, worker_env

        cmd = torchrun_cmd(argv, nproc=args.data_parallel_size)
        print("+ " + " ".join(cmd), flush=True)
        return subprocess.run(cmd, env=worker_env()).returncode

    import torch.distributed as dist

    from protdp.train.run import pretrain

    try:
        pretrain(args)
    finally:
        # free the engine's tensors and work handles held in reference cycles now, while the
        # interpreter and the process group are alive: a gloo worker thread releasing them
        # during interpreter shutdown aborts the rank (seen once: "terminate called without
        # an active exception" after a finished 2-rank run; pytorch/pytorch#179291)
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def report(argv: list[str]) -> int:
    """`protdp report RUN_DIR`: loss / lDDT curves, the step-time breakdown and the data wait
    as PNGs; the quarantined families as a table."""
    p = argparse.ArgumentParser(prog="protdp report", description="render loss / lDDT curves and the step-time breakdown of a run")
    p.add_argument("run_dir", type=Path, help="run directory holding metrics.jsonl (--save or --log-dir)")
    p.add_argument("--out", type=Path, default=None, help="where to write the PNGs (default RUN_DIR)")
    a = p.parse_args(argv)
    for path in render(a.run_dir, a.out):
        print(path)
    table = quarantine_table(a.run_dir)       # the families training set aside (issue 44)
    print(table or "no family was quarantined")
    return 0
