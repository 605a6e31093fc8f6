"""protdp's Evoformer side by side with OpenFold's on CPU, same weights (issue 29 D5).

OpenFold comes from a fetched snapshot (github:aqlaboratory/openfold; `--openfold DIR` is the
folder holding its `openfold/` package); its CUDA-only extension `attn_core_inplace_cuda` is
replaced by a stub module that raises if called (it never is on CPU). The protdp model's
weights are exported with `protdp.weights.convert.export_openfold` and loaded into OpenFold's
EvoformerStack with strict=True, and both stacks are first checked to give the same outputs.

Cases, each in its own subprocess (peak RSS belongs to that case alone; memory = peak RSS minus
the RSS just before the measured call, model and inputs resident), one thread, peers
alternated in the same run:
- train: forward + backward of the stack (eval mode: no dropout) at L = 128 and 256 (protdp
  with its default attention and with the "recompute" attention backend), the
  "small" widths (configs/model/small.yaml) and AF2's full widths, N_seq 32, 1 block for full
  width, 2 for small;
- infer: inference forward with chunk size 4 (OpenFold: its chunk_size with inplace_safe; protdp:
  chunk_size plus its attention backend; its eval-mode no-grad block runs in place on its own
  copies of m and z, so the caller's inputs stay intact, which OpenFold's inplace_safe does not
  promise) at L = 512, 1024, 2048 (`--infer-L`), small widths, N_seq 32, 1 block; the
  "lowmem" attention backend at L = 512 only.

Each implementation runs `--rounds` times, peers alternated (A B A B: shared-CPU noise hits
all); the medians of time and peak are reported, with every run kept. Per training row, both
stacks then run alternated in one process (`--ab-rounds`, `in_process_ab_time`: the robust time
ratio on a shared machine, under glibc's default allocator settings, not the memory rows' fixed
mmap threshold), with `--profile` also self CPU seconds per op of each.

    PYTHONPATH=. python3 benchmarks/model_vs_openfold.py --openfold /tmp/of_snap \
        [--out benchmarks/results/model_vs_openfold.json] [--quick] [--only train|infer] \
        [--train-rows full:128 ...] [--ab-rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from protdp.fileio import atomic_write_json  # noqa: E402

STUB = '''"""Stub of OpenFold's CUDA-only softmax extension (never called on CPU)."""
def forward_(*args, **kwargs):
    raise RuntimeError("attn_core_inplace_cuda is CUDA-only (stubbed for the CPU benchmark)")
backward_ = forward_
'''


# (row name, protdp attention backend): OpenFold; protdp's default ("auto": on CPU "recompute"
# for attention with a bias that needs a gradient); the materialising "explicit" backend
TRAIN_IMPLS = (("openfold", "auto"), ("protdp", "auto"), ("protdp_explicit", "explicit"))


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _config(width: str, n_blocks: int, **overrides):
    from protdp.config import load_config, read_yaml
    from protdp.model.config import ModelConfig
    cfg = read_yaml(ROOT / "configs" / "model" / ("small.yaml" if width == "small" else "af2.yaml"))
    cfg.update(n_blocks=n_blocks, extra_msa=False, n_extra_blocks=0, recompute=False,
               msa_dropout=0.0, pair_dropout=0.0, **overrides)
    return load_config(ModelConfig, cfg)


def build_pair(cfg):
    """(protdp EvoformerStack, OpenFold EvoformerStack) with the same weights."""
    import torch
    from openfold.model.evoformer import EvoformerStack as OFStack

    from protdp.model.model import AlphaFoldModel
    from protdp.weights.convert import export_openfold
    torch.manual_seed(0)
    model = AlphaFoldModel(cfg)
    for name, p in model.named_parameters():   # non-zero "final" layers: every branch matters
        if p.abs().sum() == 0:
            torch.nn.init.normal_(p, std=0.02)
    state = {k.removeprefix("evoformer."): v for k, v in export_openfold(model).items()
             if k.startswith("evoformer.")}
    of = OFStack(c_m=cfg.c_m, c_z=cfg.c_z, c_hidden_msa_att=cfg.c_hidden_msa_att,
                 c_hidden_opm=cfg.c_hidden_opm, c_hidden_mul=cfg.c_hidden_tri_mul,
                 c_hidden_pair_att=cfg.c_hidden_tri_att, c_s=cfg.c_s, no_heads_msa=cfg.msa_heads,
                 no_heads_pair=cfg.pair_heads, no_blocks=cfg.n_blocks, transition_n=cfg.transition_n,
                 msa_dropout=0.0, pair_dropout=0.0, no_column_attention=False, opm_first=False,
                 fuse_projection_weights=False, blocks_per_ckpt=None, inf=1e9, eps=1e-10)
    of.load_state_dict(state, strict=True)
    return model.evoformer.eval(), of.eval()


def _inputs(cfg, L: int, N: int, grad: bool):
    import torch
    g = torch.Generator().manual_seed(1)
    m = torch.randn(1, N, L, cfg.c_m, generator=g).requires_grad_(grad)
    z = torch.randn(1, L, L, cfg.c_z, generator=g).requires_grad_(grad)
    msa_mask = torch.ones(1, N, L)
    msa_mask[:, N - 2:, L // 2:] = 0          # some padding so masks are exercised
    pair_mask = torch.ones(1, L, L)
    return m, z, msa_mask, pair_mask


def _run(impl, stack, m, z, msa_mask, pair_mask, chunk):
    if impl == "protdp":
        return stack(m, z, msa_mask, pair_mask)
    return stack(m, z, msa_mask, pair_mask, chunk_size=chunk, inplace_safe=not m.requires_grad,
                 _mask_trans=True)


def _train_step(impl, stack, m, z, msa_mask, pair_mask) -> float:
    t = time.perf_counter()
    mo, zo, s = _run(impl, stack, m, z, msa_mask, pair_mask, None)
    (mo.square().mean() + zo.square().mean() + s.square().mean()).backward()
    return time.perf_counter() - t


def run_ab(case: dict, ours, theirs, m, z, msa_mask, pair_mask) -> dict:
    """Both stacks in this one process, fwd+bwd alternated (A B A B, after one warm-up step
    each): shared-CPU load hits both alike, so the per-round ratio is the robust time figure.
    With `profile`, one more step each under torch.profiler: self CPU seconds per op."""
    stacks = {"openfold": theirs, "protdp": ours}
    for impl, stack in stacks.items():
        _train_step(impl, stack, m, z, msa_mask, pair_mask)
    times = {impl: [] for impl in stacks}
    for _ in range(case["rounds"]):
        for impl, stack in stacks.items():
            times[impl].append(round(_train_step(impl, stack, m, z, msa_mask, pair_mask), 3))
    ratios = [a / b for a, b in zip(times["protdp"], times["openfold"])]
    out = {"times_s": times, "median_time_ratio": round(statistics.median(ratios), 3),
           "ratio_of_medians": round(statistics.median(times["protdp"])
                                     / statistics.median(times["openfold"]), 3)}
    if case.get("profile"):
        out["op_profile"] = _op_profile(stacks, m, z, msa_mask, pair_mask)
    return out


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _op_profile(stacks: dict, m, z, msa_mask, pair_mask, top: int = 12) -> dict:
    """Self CPU seconds per aten op of one fwd+bwd of each stack (the union of each one's `top`
    ops), the GEMM share, and the total."""
    from torch.profiler import profile
    per = {}
    for impl, stack in stacks.items():
        with profile() as prof:
            _train_step(impl, stack, m, z, msa_mask, pair_mask)
        per[impl] = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    keys = set()
    for ops in per.values():
        keys.update(sorted(ops, key=ops.get, reverse=True)[:top])
    return {"total_s": {i: round(sum(o.values()), 3) for i, o in per.items()},
            "gemm_s": {i: round(sum(o.get(k, 0.0) for k in GEMM_OPS), 3) for i, o in per.items()},
            "ops_s": {k: {i: round(o.get(k, 0.0), 3) for i, o in per.items()}
                      for k in sorted(keys, key=lambda k: -per["protdp"].get(k, 0.0))}}


def run_case(case: dict) -> dict:
    """In a subprocess: one implementation, one measurement (or both, alternated: mode "ab")."""
    import torch
    torch.set_num_threads(1)
    cfg = _config(case["width"], case["blocks"], chunk_size=case.get("chunk"),
                  attention_backend=case.get("backend", "auto"))
    ours, theirs = build_pair(cfg)
    if case["mode"] == "ab":
        return run_ab(case, ours, theirs, *_inputs(cfg, case["L"], case["N"], True))
    stack = ours if case["impl"] == "protdp" else theirs
    m, z, msa_mask, pair_mask = _inputs(cfg, case["L"], case["N"], case["mode"] == "train")
    times = []
    for rep in range(case["repeats"]):
        before = _rss_mib()
        t = time.perf_counter()
        if case["mode"] == "train":
            mo, zo, s = _run(case["impl"], stack, m, z, msa_mask, pair_mask, None)
            (mo.square().mean() + zo.square().mean() + s.square().mean()).backward()
            del mo, zo, s
        else:
            with torch.no_grad():
                _run(case["impl"], stack, m, z, msa_mask, pair_mask, case["chunk"])
        times.append(time.perf_counter() - t)
        if rep == 0:
            peak = _peak_mib() - before
    return {"time_s": round(min(times), 3), "peak_mib": round(peak, 1)}


def check_same_outputs(width: str = "small", L: int = 40, N: int = 8) -> dict:
    """Both stacks on the same inputs: max |diff| of m, z, s (fp32 and fp64)."""
    import torch
    res = {}
    for dtype in (torch.float32, torch.float64):
        cfg = _config(width, 2)
        ours, theirs = build_pair(cfg)
        ours, theirs = ours.to(dtype), theirs.to(dtype)
        args = [t.to(dtype) for t in _inputs(cfg, L, N, False)]
        with torch.no_grad():
            a = ours(*args)
            b = theirs(*args, chunk_size=None)
        # MSA compared where msa_mask = 1: OpenFold masks its MSA transition, AF2 (and protdp)
        # do not, so padded MSA positions differ by design
        real = args[2][..., None].bool()
        pairs = zip(("msa", "pair", "single"), (a[0] * real, a[1], a[2]), (b[0] * real, b[1], b[2]))
        res[str(dtype).replace("torch.", "")] = {
            name: float(f"{((x - y).abs().max() / y.abs().max()).item():.3g}") for name, x, y in pairs}
    return res


# glibc's malloc raises its mmap threshold as large blocks are freed (up to 32 MiB) and then
# keeps freed blocks in its heap, so peak RSS also measures what the allocator retains; a fixed
# threshold makes peak RSS follow the live tensors (both peers run under the same setting)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
# ... but that setting is for measuring memory: every block above 64 KiB is then mmapped and
# page-faulted in again on each allocation, which costs both stacks time in proportion to the
# bytes they allocate. Time (in_process_ab_time) is measured as users run: glibc's defaults.
AB_ALLOCATOR_ENV: dict = {}


def _subprocess(case: dict, openfold: str, allocator_env: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), openfold, case["stub_dir"]]),
               **allocator_env)
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], env=env,
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--openfold", help="folder holding the fetched openfold/ package")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "model_vs_openfold.json"))
    ap.add_argument("--quick", action="store_true", help="L = 64 / 128 only, 1 repeat")
    ap.add_argument("--infer-L", type=int, nargs="*", default=[512, 1024, 2048],
                    help="inference lengths (default 512 1024 2048)")
    ap.add_argument("--infer-rounds", type=int, default=None,
                    help="rounds of inference rows at L > 1024 (default: --rounds)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds per case (medians)")
    ap.add_argument("--train-rows", nargs="*", default=None,
                    help="training rows WIDTH:L to run (default: all four)")
    ap.add_argument("--no-explicit", action="store_true",
                    help="training rows without the protdp 'explicit' backend peer")
    ap.add_argument("--infer-impls", nargs="*", default=None,
                    help="inference peers to run (default: openfold protdp [protdp_lowmem])")
    ap.add_argument("--only", choices=("train", "infer"), help="run one part only")
    ap.add_argument("--ab-rounds", type=int, default=3,
                    help="per training row: both stacks alternated in one process, this many "
                         "rounds (in_process_ab_time; 0: skip)")
    ap.add_argument("--profile", action="store_true",
                    help="with --ab-rounds: self CPU seconds per op of one step of each stack")
    ap.add_argument("--default-malloc", action="store_true",
                    help="glibc's default (dynamic) mmap threshold instead of MALLOC_ENV")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    return ap


def _train_rows(args, result: dict, stub_dir: str, allocator_env: dict) -> None:
    """Training fwd+bwd rows, peers alternated per round, then the in-process A/B."""
    repeats = 1 if args.quick else 2
    train_L = (64, 128) if args.quick else (128, 256)
    for width, blocks in (("small", 2), ("full", 1)) if args.only != "infer" else ():
        for L in train_L:
            if args.train_rows is not None and f"{width}:{L}" not in args.train_rows:
                continue
            row = {"width": width, "blocks": blocks, "L": L}
            big = (width, L) == ("full", 256)
            for _ in range(1 if big else args.rounds):  # peers alternated: shared-CPU noise hits all
                for impl, backend in TRAIN_IMPLS[:2] if args.no_explicit else TRAIN_IMPLS:
                    _keep_best(row, impl, _subprocess(
                        {"impl": impl.split("_")[0], "mode": "train", "width": width,
                         "blocks": blocks, "L": L, "N": 32, "repeats": 1 if big else repeats,
                         "backend": backend, "stub_dir": stub_dir}, args.openfold, allocator_env))
            _ratios(row)
            result["train"].append(row)
            print(json.dumps(row), flush=True)
            _write(args.out, result)
            if args.ab_rounds:
                ab = _subprocess({"impl": "both", "mode": "ab", "width": width, "blocks": blocks,
                                  "L": L, "N": 32, "rounds": args.ab_rounds,
                                  "profile": args.profile, "stub_dir": stub_dir},
                                 args.openfold, AB_ALLOCATOR_ENV)
                result.setdefault("in_process_ab_time", []).append(
                    {"width": width, "blocks": blocks, "L": L, **ab})
                print(json.dumps(result["in_process_ab_time"][-1]), flush=True)
                _write(args.out, result)


def _infer_rows(args, result: dict, stub_dir: str, allocator_env: dict) -> None:
    """Inference rows (one block, chunk 4), peers alternated per round."""
    infer_L = (256,) if args.quick else tuple(args.infer_L)
    infer_L = () if args.only == "train" else infer_L
    for L in infer_L:
        row = {"width": "small", "blocks": 1, "L": L, "chunk": 4}
        impls = (("openfold", "auto"), ("protdp", "auto"))
        impls += (("protdp_lowmem", "lowmem"),) if L <= 512 else ()
        if args.infer_impls is not None:
            impls = tuple(i for i in impls if i[0] in args.infer_impls)
        rounds = args.rounds if L <= 1024 or args.infer_rounds is None else args.infer_rounds
        for _ in range(rounds):
            for impl, backend in impls:
                _keep_best(row, impl, _subprocess(
                    {"impl": impl.split("_")[0], "mode": "infer", "width": "small", "blocks": 1,
                     "L": L, "N": 32, "repeats": 1, "chunk": 4, "backend": backend,
                     "stub_dir": stub_dir}, args.openfold, allocator_env))
        _ratios(row)
        result["infer"].append(row)
        print(json.dumps(row), flush=True)
        _write(args.out, result)


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return 0
    if not args.openfold or not (Path(args.openfold) / "openfold" / "model" / "evoformer.py").is_file():
        ap.error("--openfold must be a folder holding OpenFold's openfold/ package "
                 "(git archive of github:aqlaboratory/openfold)")
    with tempfile.TemporaryDirectory() as stub_dir:
        Path(stub_dir, "attn_core_inplace_cuda.py").write_text(STUB)
        sys.path[:0] = [args.openfold, stub_dir]
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip()
        allocator_env = {} if args.default_malloc else MALLOC_ENV
        result = {"openfold": args.openfold, "protdp_commit": commit, "threads": 1, "n_seq": 32,
                  "allocator_env": allocator_env, "ab_allocator_env": AB_ALLOCATOR_ENV,
                  "same_outputs_max_rel": check_same_outputs(), "train": [], "infer": []}
        _train_rows(args, result, stub_dir, allocator_env)
        _infer_rows(args, result, stub_dir, allocator_env)
    _write(args.out, result)
    return 0


def _write(path: str, result: dict) -> None:
    """Results so far (after every row: a long run that is cut short keeps its rows)."""
    atomic_write_json(path, result, allow_nan=True)


def _keep_best(row: dict, impl: str, got: dict) -> None:
    """Across rounds: every run kept, the medians of time and peak reported."""
    runs = row.setdefault("runs", {}).setdefault(impl, [])
    runs.append(got)
    ok = [r for r in runs if "error" not in r]
    if not ok:
        row[impl] = got
        return
    row[impl] = {"time_s": round(statistics.median(r["time_s"] for r in ok), 3),
                 "peak_mib": round(statistics.median(r["peak_mib"] for r in ok), 1), "n": len(ok)}


def _ratios(row: dict) -> None:
    ref = row.get("openfold", {"error": "not run"})
    for impl in [k for k in row if k.startswith("protdp") and "_over_" not in k]:
        got = row[impl]
        if "error" in got or "error" in ref:
            continue
        row[f"{impl}_over_openfold_time"] = round(got["time_s"] / ref["time_s"], 3)
        row[f"{impl}_over_openfold_memory"] = round(got["peak_mib"] / max(ref["peak_mib"], 1e-9), 3)


if __name__ == "__main__":
    sys.exit(main())
