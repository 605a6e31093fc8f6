"""Loader throughput: featurized samples/s and residues/s reading the HDF5 store with one
worker vs N DataLoader workers (same sampler, same seeds), plus the raw HDF5 read rate as the
peer baseline. Absolute numbers on a shared 2-core machine are noise; compare the ratios.

    python benchmarks/loader.py [--data out/data.h5] [--workers 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from protdp.data.features import collate
from protdp.data.sampler import FamilyDataset, FamilySampler
from protdp.data.store import FamilyStore, build_store
from protdp.paths import REPO_ROOT, data_root


def run_loader(store: FamilyStore, workers: int, epochs: int, crop: int, rows: int,
               mbs: int) -> dict:
    ds = FamilyDataset(store, crop_size=crop, max_msa_rows=rows, seed=0)
    sampler = FamilySampler(store, 1, 0, mbs, seed=0, crop_size=crop, yield_seeds=True)
    # persistent workers: the sampler runs in the main process, workers only featurize
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate,
                                         num_workers=workers, persistent_workers=workers > 0)
    sampler.set_epoch(10_000)
    for _ in loader:                          # warm-up epoch (worker start, file opens)
        pass
    samples = residues = 0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            samples += len(batch["family_id"])
            residues += int(batch["num_residues"].sum())
    dt = time.perf_counter() - t0
    return {"workers": workers, "samples": samples, "residues": residues, "seconds": dt,
            "samples_per_s": samples / dt, "residues_per_s": residues / dt}


def run_raw(store: FamilyStore, epochs: int) -> dict:
    t0 = time.perf_counter()
    n = 0
    for _ in range(epochs):
        for fid in store.family_ids:
            store.read(fid)
            n += 1
    dt = time.perf_counter() - t0
    return {"reads": n, "seconds": dt, "reads_per_s": n / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=None, help="store (built from PAIRS.tsv if missing)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--crop-size", type=int, default=256)
    ap.add_argument("--max-msa-rows", type=int, default=128)
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/loader.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    data = Path(args.data or REPO_ROOT / "out/bench_data.h5")
    if not data.exists():
        report = build_store(data, pairs=data_root() / "PAIRS.tsv", workers=args.workers,
                             progress=False)
        print(report.summary())
    store = FamilyStore(data)
    raw = run_raw(store, args.epochs)
    one = run_loader(store, 0, args.epochs, args.crop_size, args.max_msa_rows,
                     args.micro_batch_size)
    many = run_loader(store, args.workers, args.epochs, args.crop_size, args.max_msa_rows,
                      args.micro_batch_size)
    result = {
        "benchmark": "loader",
        "store": {"families": len(store), "total_residues": int(store.lengths.sum()),
                  "total_msa_rows": int(store.num_seqs.sum())},
        "settings": {"crop_size": args.crop_size, "max_msa_rows": args.max_msa_rows,
                     "micro_batch_size": args.micro_batch_size, "epochs": args.epochs},
        "raw_hdf5_read": raw,
        "one_worker": one,
        "n_workers": many,
        "speedup_n_vs_one": many["samples_per_s"] / one["samples_per_s"],
        "featurize_vs_raw_read": one["samples_per_s"] / raw["reads_per_s"],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "load_avg_1m": os.getloadavg()[0]},
        "note": "shared 2-core machine: absolute rates are noise, compare ratios",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"raw read {raw['reads_per_s']:.1f} fam/s | 1 worker {one['samples_per_s']:.1f} "
          f"samples/s {one['residues_per_s']:.0f} res/s | {args.workers} workers "
          f"{many['samples_per_s']:.1f} samples/s {many['residues_per_s']:.0f} res/s | "
          f"speed-up {result['speedup_n_vs_one']:.2f}x -> {args.out}")


if __name__ == "__main__":
    main()
