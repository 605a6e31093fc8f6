"""`protdp preflight`: measure the network and the model before a run, predict the step.

Launched like training (torchrun / mpirun / srun: one process per rank, the ranks and network
the run will use). Without a launcher, `--dp N` > 1 re-launches itself as
`torchrun --standalone --nproc_per_node N -m protdp.cli preflight <same flags>` on this host.
Rank 0 prints the table (or `--json`) and writes the report to `--out` (temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from protdp.errors import ConfigError
from protdp.fileio import atomic_write_json


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="protdp preflight",
        description="Measure collectives (all_reduce / reduce_scatter / all_gather at the engine's "
                    "bucket sizes, nccl-tests algbw/busbw), every rank pair's link and the model's "
                    "forward+backward, then predict exposed communication and scaling efficiency "
                    "per engine configuration and give a verdict. Launch it like training.")
    ap.add_argument("--model-config", required=True, help="model YAML (configs/model/*.yaml)")
    ap.add_argument("--dp", type=int, required=True, help="data-parallel size (= ranks launched)")
    ap.add_argument("--micro-batch-size", type=int, default=1, help="examples per micro-batch")
    ap.add_argument("--global-batch-size", type=int, default=None,
                    help="examples per step = micro x dp x accumulation (default micro x dp)")
    ap.add_argument("--bucket-size", type=int, default=None,
                    help="elements per gradient bucket (default Megatron's max(40M, 1M x dp))")
    ap.add_argument("--crop-size", type=int, default=256, help="residues per example")
    ap.add_argument("--max-msa-rows", type=int, default=128, help="MSA rows per example")
    ap.add_argument("--num-recycles", type=int, default=None,
                    help="recycles per forward (default the training mean, max_recycles / 2)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each measurement")
    ap.add_argument("--link-mb", type=float, default=16.0,
                    help="MiB of the per-link bandwidth message (default 16)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds before a collective fails")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return ap


# upper bounds of the measured workload: beyond them a typo would run for hours or exhaust memory
LIMITS = {"micro_batch_size": 4096, "crop_size": 4096, "max_msa_rows": 16384, "reps": 100}


def _check(args) -> None:
    for name in ("dp", "micro_batch_size", "crop_size", "max_msa_rows", "reps"):
        value, top = getattr(args, name), LIMITS.get(name)
        if value < 1 or (top is not None and value > top):
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1"
                              + (f" and <= {top}" if top else "") + f", got {value}")
    if args.num_recycles is not None and args.num_recycles < 0:
        raise ConfigError(f"--num-recycles must be >= 0, got {args.num_recycles}")
    if not 0 < args.link_mb <= 1024:
        raise ConfigError(f"--link-mb must be in (0, 1024], got {args.link_mb}")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0, got {args.timeout}")
    if args.out is not None and not args.out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: directory {args.out.parent} does not exist")


def _relaunch(argv: list[str], nproc: int) -> int:
    """This host's ranks under torchrun (one per GPU, else one per core at most)."""
    import torch

    from protdp.train.launch import worker_env

    slots = torch.cuda.device_count() or len(os.sched_getaffinity(0))
    if nproc > slots:
        raise ConfigError(f"--dp {nproc} without a launcher starts {nproc} ranks on this host, "
                          f"which has {slots} {'GPUs' if torch.cuda.device_count() else 'cores'}"
                          "; launch it across nodes like training (torchrun --nnodes, srun)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "protdp.cli", "preflight", *argv]
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=worker_env()).returncode


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    _check(args)
    from protdp.parallel.config import ParallelConfig
    from protdp.parallel.env import detect_launch_env
    from protdp.resources import resolve_config

    model_config = resolve_config(args.model_config, "model")   # fails before any launch
    cfg = ParallelConfig(data_parallel_size=args.dp, micro_batch_size=args.micro_batch_size,
                         global_batch_size=args.global_batch_size, bucket_size=args.bucket_size)
    if detect_launch_env().launcher == "none" and args.dp > 1:
        return _relaunch(argv, args.dp)

    import torch
    import torch.distributed as dist

    from protdp.parallel.env import init_distributed
    from protdp.parallel.preflight import render, run_preflight
    from protdp.parallel.workload import af2_workload

    launch = init_distributed(timeout=args.timeout)
    device = (torch.device("cuda", launch.local_rank) if torch.cuda.is_available()
              else torch.device("cpu"))
    try:
        workload = af2_workload(model_config, micro_batch_size=args.micro_batch_size,
                                crop_size=args.crop_size, msa_rows=args.max_msa_rows,
                                num_recycles=args.num_recycles, device=device)
        workload.description["model_config"] = str(args.model_config)
        report = run_preflight(workload, cfg, reps=args.reps,
                               link_bytes=int(args.link_mb * 2**20), device=device)
        if report is not None:
            if args.out is not None:
                atomic_write_json(args.out, report)
            print(json.dumps(report, indent=1) if args.json else render(report), flush=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
