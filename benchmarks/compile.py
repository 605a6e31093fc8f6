"""`torch.compile` (inductor) of the Evoformer blocks against eager on CPU (issue 29 D4):
numerics (max |diff| of outputs and input gradients) and forward+backward time, eager and
compiled alternated in the same process, after the compile (its wall time is reported apart).

    PYTHONPATH=. python3 benchmarks/compile.py [--out benchmarks/results/compile.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from protdp.fileio import atomic_write_json  # noqa: E402
from protdp.config import read_yaml  # noqa: E402
from protdp.model.compile import compile_evoformer_blocks  # noqa: E402
from protdp.model.config import ModelConfig  # noqa: E402
from protdp.model.evoformer import EvoformerStack  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compile.json"))
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--N", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = ModelConfig(**{**read_yaml(ROOT / "configs" / "model" / "small.yaml"),
                         "msa_dropout": 0.0, "pair_dropout": 0.0, "n_blocks": 1})
    torch.manual_seed(0)
    eager = EvoformerStack(cfg)
    for p in eager.parameters():
        torch.nn.init.normal_(p, std=0.05)
    compiled = EvoformerStack(cfg)
    compiled.load_state_dict(eager.state_dict())
    compile_evoformer_blocks(compiled)
    g = torch.Generator().manual_seed(1)
    m = torch.randn(1, args.N, args.L, cfg.c_m, generator=g)
    z = torch.randn(1, args.L, args.L, cfg.c_z, generator=g)
    masks = torch.ones(1, args.N, args.L), torch.ones(1, args.L, args.L)

    def step(stack):
        mi, zi = m.clone().requires_grad_(), z.clone().requires_grad_()
        mo, zo, s = stack(mi, zi, *masks)
        (mo.square().mean() + zo.square().mean() + s.square().mean()).backward()
        return [mo.detach(), zo.detach(), mi.grad, zi.grad]

    t = time.perf_counter()
    got = step(compiled)
    compile_s = time.perf_counter() - t
    ref = step(eager)
    times = {"eager": [], "compiled": []}
    for _ in range(args.repeats):
        for name, stack in (("eager", eager), ("compiled", compiled)):
            t = time.perf_counter()
            step(stack)
            times[name].append(time.perf_counter() - t)
    best = {k: min(v) for k, v in times.items()}
    result = {"config": "small, 1 block", "L": args.L, "N": args.N, "threads": 1,
              "torch": torch.__version__, "backend": "inductor",
              "first_call_with_compile_s": round(compile_s, 1),
              "eager_fwd_bwd_s": round(best["eager"], 4), "compiled_fwd_bwd_s": round(best["compiled"], 4),
              "compiled_over_eager_time": round(best["compiled"] / best["eager"], 3),
              "max_abs_diff": {n: float(f"{(a - b).abs().max().item():.3g}")
                               for n, a, b in zip(("msa", "pair", "d_msa", "d_pair"), got, ref)}}
    atomic_write_json(args.out, result, allow_nan=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
