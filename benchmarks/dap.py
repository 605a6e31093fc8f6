"""Dynamic axial parallelism: activation memory per rank and bytes per collective (issue 33, 4).

One Evoformer block at AF2 widths (configs/model/af2.yaml: c_m 256, c_z 128, 8/4 heads) on a
crop of L residues and S MSA rows (default 256 x 128), forward in training mode, on K = 1, 2, 4
gloo ranks (one process each). Measured per rank:

- activation bytes: every tensor autograd saves for backward (unique storages, parameters
  excluded; `torch.autograd.graph.saved_tensors_hooks`), the memory a block holds until its
  backward without recompute; the goal is ~1/K of one process;
- the bytes each DAP collective moves (`AxialComm.count_bytes`) against
  `protdp.parallel.dap_layout.block_comm_bytes` (the formula in its docstring);
- forward wall time (2 shared cores: indicative only).

    PYTHONPATH=. python3 benchmarks/dap.py --out benchmarks/results/dap.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import multiprocessing as mp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protdp.fileio import atomic_write_json  # noqa: E402
from protdp.config import load_config, read_yaml  # noqa: E402
from protdp.model.config import ModelConfig  # noqa: E402
from protdp.paths import REPO_ROOT  # noqa: E402


def _block_config() -> ModelConfig:
    data = read_yaml(REPO_ROOT / "configs" / "model" / "af2.yaml")
    data.update(n_blocks=1, extra_msa=False, chunk_size=None, recompute=False)
    return load_config(ModelConfig, data)


def _measure(rank: int, world: int, port: int, L: int, S: int, out: str):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from protdp.model.evoformer import EvoformerBlock, run_blocks
    from protdp.parallel import init_distributed
    from protdp.parallel.groups import build_groups

    init_distributed(timeout=600)
    cfg = _block_config()
    torch.manual_seed(0)
    block = EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att).train()
    params = {p.data_ptr() for p in block.parameters()}
    g = torch.Generator().manual_seed(1)
    m = torch.randn(S, L, cfg.c_m, generator=g, requires_grad=True)
    z = torch.randn(L, L, cfg.c_z, generator=g, requires_grad=True)
    msa_mask, pair_mask = torch.ones(S, L), torch.ones(L, L)
    comm = build_groups(world).axial_comm()
    if comm is not None:
        comm.count_bytes = True
    saved: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run_blocks(torch.nn.ModuleList([block]), m, z, msa_mask, pair_mask, False, comm)
    forward_s = time.perf_counter() - t0
    res = {"activation_bytes": sum(saved.values()), "forward_s": forward_s,
           "comm_bytes": dict(comm.bytes_moved) if comm else {}}
    torch.save(res, Path(out) / f"rank{rank}.pt")
    os._exit(0)


def run(world: int, L: int, S: int, tmp: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_measure, args=(r, world, port, L, S, str(tmp)))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crop", type=int, default=256)
    ap.add_argument("--msa-rows", type=int, default=128)
    ap.add_argument("--sizes", default="1,2,4")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "dap.json")
    args = ap.parse_args()
    import tempfile

    from protdp.parallel.dap_layout import block_comm_bytes

    cfg = _block_config()
    rows = []
    base = None
    for k in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            per_rank = run(k, args.crop, args.msa_rows, Path(tmp))
        act = max(r["activation_bytes"] for r in per_rank)
        base = base if base is not None else act
        measured = {}
        for r in per_rank[:1]:
            measured = {name: v for name, v in r["comm_bytes"].items()}
        formula = block_comm_bytes(n_seq=args.msa_rows, n_res=args.crop, k=k, c_m=cfg.c_m,
                                   c_z=cfg.c_z, msa_heads=cfg.msa_heads, pair_heads=cfg.pair_heads,
                                   c_hidden_tri_mul=cfg.c_hidden_tri_mul,
                                   c_hidden_opm=cfg.c_hidden_opm)
        measured["total"] = sum(measured.values())
        row = {"dap_size": k, "activation_mib_per_rank": round(act / 2**20, 1),
               "activation_ratio_vs_dap1": round(act / base, 4), "ideal_ratio": round(1 / k, 4),
               "forward_s_max_rank": round(max(r["forward_s"] for r in per_rank), 2),
               "comm_bytes_measured_rank0": measured, "comm_bytes_formula": formula,
               "comm_matches_formula": all(measured.get(n) == v for n, v in formula.items())}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"benchmark": "dap", "crop": args.crop, "msa_rows": args.msa_rows,
              "model": "af2 widths, one Evoformer block, fp32, training mode, no recompute",
              "device": "CPU, gloo, 1 thread per rank (2 shared cores)", "rows": rows}
    atomic_write_json(args.out, result, allow_nan=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
