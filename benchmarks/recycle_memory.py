"""Peak memory of one prediction against the number of recycles (issue 47, "memory per recycle
is bounded"): the MSA samples built up front, one per pass (`features.featurize_query`, what
the predictor did), against built when the pass starts (`msa_passes.query_features`, what it
does now), in the same run on the same synthetic deep MSA.

Each case runs in a fresh process on the CPU: the peak is the resident high-water mark
(`VmHWM`, reset through /proc/self/clear_refs, glibc serving tensors with mmap;
`benchmarks/plan_measure.py`) above the resident size before the features are built, over
featurizing, collating (`ensemble.model_batch`) and the model's 1 + num_recycles passes (the
small config with the extra-MSA stack). Also reported: the bytes of the features (tensors and
the lazy source's arrays) handed to the model, and the seconds.

    python benchmarks/recycle_memory.py [--recycles 1,20,100] [--length 128] [--rows 3000]
writes benchmarks/results/recycle_memory.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from protdp.config import load_config  # noqa: E402
from protdp.data.features import PASSES_KEY  # noqa: E402
from protdp.model.config import ModelConfig  # noqa: E402
from protdp.paths import REPO_ROOT  # noqa: E402

MIB = 1024 ** 2
RESULTS = REPO_ROOT / "benchmarks" / "results" / "recycle_memory.json"
AA = "ACDEFGHIKLMNPQRSTVWY"
MODES = ("up_front", "per_pass")


def deep_msa(L: int, rows: int, seed: int = 0):
    """A synthetic MSA of `rows` rows (60 % identity to the query, 20 % deletions)."""
    from protdp.data.parse import Msa
    rng = np.random.default_rng(seed)
    aa = np.array(list(AA + "-"))
    query = rng.integers(0, 20, L)
    keep = rng.random((rows, L)) < 0.6
    tokens = np.where(keep, query[None, :], rng.integers(0, 21, (rows, L)))
    tokens[0] = query
    seqs = ["".join(aa[r]) for r in tokens]
    dels = (rng.integers(1, 6, (rows, L)) * (rng.random((rows, L)) < 0.2)).astype(np.uint8)
    dels[0] = 0
    return seqs[0], Msa(seqs, dels, [f"r{i}" for i in range(rows)])


def model_config(path: str) -> ModelConfig:
    from protdp.config import read_yaml
    data = read_yaml(path)
    data.update(extra_msa=True, n_extra_blocks=1, c_e=8, c_hidden_extra_att=4)
    return load_config(ModelConfig, data)


def held_bytes(batch: dict) -> int:
    """Bytes of the batch's tensors plus its lazy source's arrays."""
    total = sum(v.numel() * v.element_size() for v in batch.values() if torch.is_tensor(v))
    source = batch.get(PASSES_KEY)
    for s in ([] if source is None else source.sources):
        total += sum(a.nbytes for a in (s.msa, s.deletions, s.profile) if a is not None)
    return total


def _measure(mode: str, recycles: int, args) -> dict:
    from plan_measure import _reset_peak_rss, _status_bytes, _use_mmap_for_tensors

    from protdp.data.features import featurize_query
    from protdp.data.msa_passes import query_features
    from protdp.inference.ensemble import model_batch
    from protdp.model import build_model
    torch.set_num_threads(1)
    _use_mmap_for_tensors()
    torch.manual_seed(0)
    model = build_model(model_config(args.config), verbose=False).eval()
    with torch.no_grad():       # untrained heads give a constant pLDDT: perturb the weights
        for param in model.parameters():
            param.add_(torch.randn(param.shape) * 0.05)
    seq, msa = deep_msa(args.length, args.rows)
    build = featurize_query if mode == "up_front" else query_features
    kw = dict(max_msa_rows=args.max_msa_rows, max_extra_msa_rows=args.max_extra_rows, seed=0,
              masked_msa_fraction=0.15)
    with torch.no_grad():      # warm-up: allocator, kernels
        model(model_batch([build(seq, msa, msa_samples=2, **kw)], torch.device("cpu")),
              num_recycles=1)
    _reset_peak_rss()
    base = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    batch = model_batch([build(seq, msa, msa_samples=recycles + 1, **kw)], torch.device("cpu"))
    held = held_bytes(batch)
    with torch.no_grad():
        out = model(batch, num_recycles=recycles)
    return {"mode": mode, "num_recycles": recycles, "peak_mib": round((_status_bytes("VmHWM")
            - base) / MIB, 1), "features_mib": round(held / MIB, 2),
            "seconds": round(time.perf_counter() - t0, 2),
            "positions_checksum": float(out["final_atom_positions"].double().sum())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=str(ROOT / "configs" / "model" / "small.yaml"))
    p.add_argument("--recycles", default="1,20,100")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--rows", type=int, default=3000, help="MSA depth")
    p.add_argument("--max-msa-rows", type=int, default=256)
    p.add_argument("--max-extra-rows", type=int, default=2048)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # mode,recycles: child
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.one:
        mode, n = args.one.split(",")
        print(json.dumps(_measure(mode, int(n), args)))
        return 0
    rows = []
    for n in (int(x) for x in args.recycles.split(",")):
        for mode in MODES:
            cmd = [sys.executable, __file__, "--one", f"{mode},{n}", "--config", args.config,
                   "--length", str(args.length), "--rows", str(args.rows),
                   "--max-msa-rows", str(args.max_msa_rows),
                   "--max-extra-rows", str(args.max_extra_rows)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    by = {(r["mode"], r["num_recycles"]): r for r in rows}
    for r in rows:   # same predictions both ways (the same MSA samples per pass)
        r["same_output_as_up_front"] = (r["positions_checksum"]
                                        == by[("up_front", r["num_recycles"])]["positions_checksum"])
    result = {"benchmark": "recycle_memory", "device": "cpu", "threads": 1,
              "config": Path(args.config).name + " + extra-MSA stack (1 block, c_e 8)",
              "length": args.length, "msa_rows": args.rows, "max_msa_rows": args.max_msa_rows,
              "max_extra_msa_rows": args.max_extra_rows, "masked_msa_fraction": 0.15,
              "measure": "VmHWM above VmRSS before featurizing, fresh process per case",
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
