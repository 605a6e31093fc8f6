"""Input-pipeline benchmark (issue 27), results in benchmarks/results/loader.json.

(a) CPU seconds per example (one core, `time.process_time`) at AlphaFold's training sizes
    (crop 256, 512 clusters, 1,024 extra rows, 4 MSA samples) for 5,000 x 384 and
    10,000 x 384 families: main's featurizer (the file at --baseline-rev, loaded from git) vs
    this tree's `featurize` and the compact host example of the GPU path
    (`pipeline.compact`), with bytes per example; outputs are checked equal first.
(b) data_wait / step of `protdp.train.feed.BatchFeed` with a stand-in model whose step is a
    fixed sleep (an accelerator: no host CPU), for 1 and 2 workers, and with one family that
    takes ~10x longer to featurize than the others (does it raise the step time?).

    python benchmarks/loader.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from protdp.data.pipeline.compact import compact_example, nbytes
from protdp.data.residues import GAP_ID
from protdp.paths import REPO_ROOT

AF2 = dict(crop_size=256, max_msa_rows=512, max_extra_msa_rows=1024, msa_samples=4)
LETTERS = "ARNDCQEGHILKMFPSTWYV"


def synthetic_family(rows: int, length: int, seed: int, family_id: str | None = None) -> dict:
    """A store-layout family: query-derived rows (20-90 % identity), 15 % gaps, deletions."""
    rng = np.random.default_rng(seed)
    query = rng.integers(0, 20, length)
    same = rng.random((rows, length)) < rng.uniform(0.2, 0.9, (rows, 1))
    msa = np.where(same, query[None], rng.integers(0, 21, (rows, length)))
    msa[1:][rng.random((rows - 1, length)) < 0.15] = GAP_ID
    msa[0] = query
    dels = (rng.random((rows, length)) < 0.03) * rng.integers(1, 30, (rows, length))
    ca = np.cumsum(rng.normal(size=(length, 3)), axis=0) * 2.2
    pos = np.repeat(ca[:, None], 37, axis=1).astype(np.float32)
    return {"msa": msa.astype(np.uint8), "deletion_matrix": dels.astype(np.uint8),
            "residue_index": np.arange(length, dtype=np.int32), "all_atom_positions": pos,
            "all_atom_mask": np.ones((length, 37), np.uint8),
            "between_segment_residues": np.zeros(length, np.uint8), "resolution": 2.0,
            "sequence": "".join(LETTERS[i] for i in query), "chain": "A",
            "family_id": family_id or f"syn_{rows}x{length}_{seed}"}


def main_featurize(rev: str):
    """main's `featurize` (protdp/data/features.py at `rev`) as a module function."""
    src = subprocess.run(["git", "show", f"{rev}:protdp/data/features.py"], cwd=REPO_ROOT,
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "features_main.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("features_main", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.featurize


def load_openfold(src: str):
    """OpenFold's data modules from an extracted snapshot (`src`/openfold/...), without running
    its package __init__ (which imports the model and its kernels). Needs ml-collections,
    dm-tree, pandas, modelcif (pip)."""
    import types

    pkg = types.ModuleType("openfold")
    pkg.__path__ = [str(Path(src) / "openfold")]
    sys.modules["openfold"] = pkg
    from openfold import config
    from openfold.data import data_pipeline, feature_pipeline, parsers
    return config, data_pipeline, feature_pipeline, parsers


def openfold_example(fam: dict, openfold, seed: int) -> tuple[dict, float]:
    """OpenFold's own pipeline on the same MSA: `data_pipeline`'s sequence and MSA features,
    then `FeaturePipeline.process_features(..., "train")` at the same sizes (templates off,
    max_recycling_iters = samples - 1). -> (features, CPU seconds of both)."""
    config, dp, fp, parsers = openfold
    alphabet = LETTERS + "X-"
    t = time.process_time()
    seqs = ["".join(alphabet[i] for i in row) for row in fam["msa"]]
    L = fam["msa"].shape[1]
    raw = {**dp.make_sequence_features(seqs[0], "x", L),
           **dp.make_msa_features([parsers.Msa(seqs, fam["deletion_matrix"].astype(int).tolist(),
                                               [""] * len(seqs))]),
           "all_atom_positions": fam["all_atom_positions"],
           "all_atom_mask": fam["all_atom_mask"].astype(np.float32),
           "resolution": np.array([2.0], np.float32), "is_distillation": np.array(0.0, np.float32)}
    cfg = config.model_config("initial_training", train=True).data
    cfg.common.use_templates = False
    cfg.common.max_recycling_iters = AF2["msa_samples"] - 1
    cfg.train.max_msa_clusters, cfg.train.max_extra_msa = AF2["max_msa_rows"], AF2["max_extra_msa_rows"]
    cfg.train.crop_size = AF2["crop_size"]
    torch.manual_seed(seed)
    out = fp.FeaturePipeline(cfg).process_features(raw, "train")
    return out, time.process_time() - t


def cpu_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def featurizer_section(rev: str, sizes: list[int], repeats: int, openfold_src: str | None
                       ) -> list[dict]:
    from protdp.data.features import featurize

    old = main_featurize(rev)
    openfold = load_openfold(openfold_src) if openfold_src else None
    out = []
    for rows in sizes:
        fam = synthetic_family(rows, 384, 0)
        a, b = old(fam, seed=1, **AF2), featurize(fam, seed=1, **AF2)
        equal = all(torch.equal(a[k].nan_to_num(), b[k].nan_to_num()) for k in a
                    if isinstance(a[k], torch.Tensor))
        t_old = cpu_seconds(lambda: old(fam, seed=1, **AF2), repeats)
        t_new = cpu_seconds(lambda: featurize(fam, seed=1, **AF2), repeats)
        t_compact = cpu_seconds(lambda: compact_example(fam, seed=1, **AF2), repeats)
        row = {"msa_rows": rows, "length": 384, **AF2, "outputs_equal": bool(equal),
               "main_cpu_s": t_old, "new_featurize_cpu_s": t_new, "compact_host_cpu_s": t_compact,
               "speedup_featurize": t_old / t_new, "speedup_compact_host": t_old / t_compact,
               "bytes_featurized": nbytes(b), "bytes_compact": nbytes(compact_example(fam, seed=1, **AF2))}
        if openfold is not None:
            feats, row["openfold_cpu_s"] = openfold_example(fam, openfold, 1)
            row["openfold_bytes"] = sum(v.numel() * v.element_size() for v in feats.values()
                                        if isinstance(v, torch.Tensor))
            row["openfold_over_new_featurize"] = row["openfold_cpu_s"] / t_new
            row["openfold_over_compact_host"] = row["openfold_cpu_s"] / t_compact
        print(json.dumps(row))
        out.append(row)
    return out


PROFILED = ("msa_profile", "shared_one_hot", "bert_mask", "agreement_one_hot",
            "_agreement_counts", "nearest_centre", "summarize_clusters", "msa_sample",
            "residue_features")


def profile_section(sizes: list[int], repeats: int) -> list[dict]:
    """CPU seconds (one thread, `process_time`) of featurize's components at AF2 sizes: each
    function of `protdp.data.features` wrapped with a timer (inclusive times: nearest_centre
    contains _agreement_counts and the centres' agreement_one_hot, msa_sample contains
    summarize_clusters); the best of `repeats` runs."""
    import protdp.data.features as F

    acc: dict[str, float] = {}
    originals = {name: getattr(F, name) for name in PROFILED}

    def timed(name, fn):
        def run(*a, **k):
            t = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.process_time() - t
        return run

    out = []
    try:
        for name, fn in originals.items():
            setattr(F, name, timed(name, fn))
        for rows in sizes:
            fam = synthetic_family(rows, 384, 0)
            best: dict[str, float] = {}
            for _ in range(repeats):
                acc.clear()
                t = time.process_time()
                F.featurize(fam, seed=1, **AF2)
                acc["featurize (total)"] = time.process_time() - t
                if not best or acc["featurize (total)"] < best["featurize (total)"]:
                    best = dict(acc)
            product = best.get("_agreement_counts", 0.0)
            # extra rows x (L * 21) x centres, per MSA sample
            macs = AF2["msa_samples"] * (rows - AF2["max_msa_rows"]) * 384 * 21 * AF2["max_msa_rows"]
            best["rest (stack, conversions, draws)"] = best["featurize (total)"] - sum(
                best.get(k, 0.0) for k in ("msa_profile", "shared_one_hot", "bert_mask",
                                           "nearest_centre", "msa_sample", "residue_features"))
            row = {"msa_rows": rows, **AF2, "cpu_s": {k: round(v, 4) for k, v in best.items()},
                   "int8_product_share": round(product / best["featurize (total)"], 3),
                   "int8_macs": macs, "int8_gmac_per_s": round(macs / product / 1e9, 1)}
            print(json.dumps(row))
            out.append(row)
    finally:
        for name, fn in originals.items():
            setattr(F, name, fn)
    return out


def build_store(path: Path, families: list[dict]) -> None:
    from protdp.data.store import new_store_file, write_family, write_index

    with new_store_file(path, "synthetic", "benchmarks/loader.py") as h5:
        for fam in families:
            write_family(h5, fam, [], [], [])
        write_index(h5)


def read_pages(batch: dict) -> None:
    """One byte of every 4 KiB page of every tensor (what a forward pass's first read costs)."""
    for v in batch.values():
        if isinstance(v, torch.Tensor) and v.numel():
            v.reshape(-1).view(torch.uint8)[::4096].sum()


def feed_run(store_path: Path, *, workers: int, depth: int, step_s: float, steps: int,
             compact: bool = True) -> dict:
    """Steps of a stand-in accelerator (sleep `step_s`: no host CPU) fed by BatchFeed on the
    GPU path: the training thread waits for the workers' compact examples (data_wait); their
    expansion is device work, part of the accelerator's step (loader_gpu_check.py).
    `compact=False`: the CPU-device path (workers run featurize + collate, 88 MB batches, taken
    with `feed.next` as the trainer does; the step reads one byte per page of its batch, the
    first touch a forward pass would pay, reported as mean_first_touch_s)."""
    from protdp.data.sampler import FamilySampler
    from protdp.data.store import FamilyStore
    from protdp.train.feed import BatchFeed
    from protdp.train.sources import PDB, Source

    store = FamilyStore(store_path)
    sources = {PDB: Source(PDB, store, FamilySampler(store, 1, 0, 1, seed=0, crop_size=256))}
    feed = BatchFeed(sources=sources, seed_of=lambda it, m: it, source_of=lambda s: sources[PDB],
                     example_seed=lambda s, k: s + k, kwargs={**AF2, "training": True},
                     start_iteration=0, num_micro=1, device=torch.device("cpu"), workers=workers,
                     prefetch_depth=depth, timeout=600, compact=compact)
    waits, totals, fams, touches, thread_cpu = [], [], [], [], []
    take = feed.next_host if compact else feed.next   # the GPU path expands on the device
    batch = None
    try:
        take(0, 0)                                        # warm-up: worker start, first batch
        time.sleep(step_s)
        for it in range(1, steps + 1):
            t0, c0 = time.perf_counter(), time.thread_time()
            _, fids, batch = take(it, 0)                  # (drops the previous batch, as a trainer)
            t1 = time.perf_counter()
            thread_cpu.append(time.thread_time() - c0)
            if not compact:       # a CPU step reads its batch: the first touch is part of it
                read_pages(batch)
                touches.append(time.perf_counter() - t1)
            time.sleep(step_s)                            # the accelerator's step
            waits.append(t1 - t0)
            totals.append(time.perf_counter() - t0)
            fams.append(fids[0])
    finally:
        del batch
        feed.close()
    return {"path": "gpu (compact)" if compact else "cpu (featurize)", "workers": workers,
            "prefetch_depth": depth, "stand_in_step_s": step_s, "load_avg_1m": os.getloadavg()[0],
            "steps": steps, "data_wait_fraction": sum(waits) / sum(totals),
            "mean_data_wait_s": sum(waits) / len(waits),
            "mean_data_wait_thread_cpu_s": sum(thread_cpu) / len(thread_cpu),
            "mean_first_touch_s": sum(touches) / len(touches) if touches else None,
            "max_step_s": max(totals), "mean_step_s": sum(totals) / len(totals),
            "per_step_s": [round(t, 3) for t in totals], "families": fams}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline-rev", default="b5ac604", help="git revision of main's featurizer")
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps")
    ap.add_argument("--feed-rows", type=int, default=2000, help="MSA rows of the feed's families")
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/loader.json"))
    ap.add_argument("--openfold", default=None, metavar="SRC",
                    help="folder holding OpenFold's openfold/ package (from a fetched snapshot: "
                         "git archive HEAD openfold | tar -x -C SRC) to time it as the peer")
    ap.add_argument("--slow-factor", type=int, default=30,
                    help="the slow family has this many times --feed-rows MSA rows")
    ap.add_argument("--keep-feed", action="store_true",
                    help="reuse the feed section of the existing --out file")
    ap.add_argument("--profile-only", action="store_true",
                    help="only (re)measure the featurizer profile section of the --out file")
    ap.add_argument("--keep-featurizer", action="store_true",
                    help="reuse the featurizer section of the existing --out file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    repeats = 1 if args.quick else 2
    result = {"benchmark": "loader", "baseline_rev": args.baseline_rev}
    if args.profile_only:
        result = json.loads(Path(args.out).read_text())
        result["featurizer_profile"] = profile_section([5000, 10000], 3)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return
    if args.keep_featurizer and Path(args.out).exists():
        result["featurizer"] = json.loads(Path(args.out).read_text())["featurizer"]
    else:
        result["featurizer"] = featurizer_section(args.baseline_rev, [5000, 10000], repeats,
                                                  args.openfold)
    from protdp.data.features import featurize
    from protdp.data.pipeline.compact import compact_example as compact
    with tempfile.TemporaryDirectory() as tmp:
        fams = [synthetic_family(args.feed_rows, 384, s) for s in range(6)]
        one = cpu_seconds(lambda: compact(fams[0], seed=0, **AF2), 2)
        store = Path(tmp) / "feed.h5"
        build_store(store, fams)
        steps = 8 if args.quick else 12
        full = cpu_seconds(lambda: featurize(fams[0], seed=0, **AF2), 1)
        previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        result["feed"] = {"family": f"{args.feed_rows}x384", "compact_cpu_s": one,
                          "featurize_cpu_s": full, "runs": []}
        if args.keep_feed and "feed" in previous:
            result["feed"] = previous["feed"]
        for compact_path, step_s, workers in [(c, s, w) for c in (True, False) for s in (0.5, 1.0)
                                              for w in (1, 2) if not args.keep_feed]:
            r = feed_run(store, workers=workers, depth=2 * workers, step_s=step_s, steps=steps,
                         compact=compact_path)
            print(json.dumps({k: v for k, v in r.items() if k not in ("per_step_s", "families")}))
            result["feed"]["runs"].append(r)
        slow_rows = args.slow_factor * args.feed_rows     # chosen so its host time is ~10x
        slow = synthetic_family(slow_rows, 384, 99, family_id="zz_slow")
        slow_store = Path(tmp) / "slow.h5"
        build_store(slow_store, fams + [slow])
        slow_cpu = cpu_seconds(lambda: compact(slow, seed=0, **AF2), 2)
        # the GPU path: the workers' host part, ~10x longer for the slow family
        runs = [feed_run(slow_store, workers=2, depth=d, step_s=1.0, steps=steps) for d in (1, 6)]
        for r in runs:
            slow_steps = [t for t, f in zip(r["per_step_s"], r["families"]) if f == "zz_slow"]
            r["slow_family_step_s"] = slow_steps
            print(json.dumps({k: v for k, v in r.items() if k not in ("per_step_s", "families")}))
        result["slow_family"] = {"slow_compact_cpu_s": slow_cpu, "other_compact_cpu_s": one,
                                 "runs": runs}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "torch": torch.__version__, "numpy": np.__version__,
                         "load_avg_1m": os.getloadavg()[0],
                         "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}
    result["note"] = ("shared 2-core machine (other jobs running): compare ratios measured side "
                      "by side; CPU seconds are process_time of one thread")
    for key, value in previous.items():   # measured by hand (demo, resume): kept
        result.setdefault(key, value)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("->", args.out)


if __name__ == "__main__":
    sys.exit(main())
