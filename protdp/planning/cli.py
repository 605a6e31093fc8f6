"""Entry point of `protdp plan` (the planner's logic is in protdp.planning.plan)."""

from __future__ import annotations

import argparse
import json

from protdp.config import load_config
from protdp.errors import ConfigError
from protdp.model.config import ModelConfig
from protdp.planning import comm as plan_comm
from protdp.planning import plan as plan_mod
from protdp.planning.comm import parse_bandwidth, parse_bytes
from protdp.planning.plan import plan, render
from protdp.resources import resolve_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="protdp plan", description=plan_mod.__doc__.split("\n")[0])
    ap.add_argument("--model-config", required=True, help="configs/model/*.yaml")
    ap.add_argument("--crop-size", "--crop", dest="crop", type=int, required=True,
                    help="training crop size (residues; the flag's name in train/preflight)")
    ap.add_argument("--gpu-mem", required=True, help="memory per GPU, e.g. 80GiB, 40GB")
    ap.add_argument("--dp", type=int, required=True, help="data-parallel size")
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 params, fp32 main grads + master; trunk activations under bf16 autocast")
    ap.add_argument("--recompute", action="store_true", help="activation recompute already on")
    ap.add_argument("--max-msa-rows", "--msa-rows", dest="msa_rows", type=int, default=128,
                    help="MSA cluster rows (AF2 training: 128; as in train/preflight)")
    ap.add_argument("--extra-msa-rows", type=int, default=1024,
                    help="extra-MSA rows if the config has the extra stack (AF2: 1024)")
    ap.add_argument("--reserve", type=float, default=0.1, help="fraction of GPU memory held back")
    ap.add_argument("--bandwidth", default=None, help="per-rank link bandwidth, e.g. 100Gbit, 25GB/s")
    ap.add_argument("--network", default=None, metavar="PREFLIGHT_JSON",
                    help="use the bandwidth, latency and compute measured by `protdp preflight "
                         "--out` instead of --bandwidth (and predict scaling over dp)")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs available; with --global-batch-size, GPUs beyond global/micro "
                         "data-parallel ranks are proposed as DAP ranks (--dap-size)")
    ap.add_argument("--global-batch-size", type=int, default=None, help="global batch (AF2: 128)")
    ap.add_argument("--micro-batch-size", type=int, default=1, help="samples per rank per pass")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    for name in ("crop", "dp", "msa_rows"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.extra_msa_rows < 0:
        raise ConfigError("--extra-msa-rows must be >= 0")
    if args.network and args.bandwidth:
        raise ConfigError("--network and --bandwidth both give the bandwidth: use one")
    network = plan_comm.read_preflight(args.network) if args.network else None
    cfg = load_config(ModelConfig, resolve_config(args.model_config, "model"))
    result = plan(cfg, crop=args.crop, gpu_mem=parse_bytes(args.gpu_mem, "--gpu-mem"), dp=args.dp,
                  bf16=args.bf16, recompute=args.recompute, msa_rows=args.msa_rows,
                  extra_msa_rows=args.extra_msa_rows, reserve=args.reserve,
                  bandwidth=parse_bandwidth(args.bandwidth, "--bandwidth") if args.bandwidth else None,
                  network=network, gpus=args.gpus, global_batch=args.global_batch_size,
                  micro_batch=args.micro_batch_size)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
