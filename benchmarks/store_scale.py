"""Family store at corpus scale (issue 17 deliverable 7): a synthetic store of 100,000
families with realistic length and depth distributions, measured side by side with a peer
(one compressed .npz per family, the usual ad-hoc layout) on a 10,000-family subset.

Measured: build throughput of the real pipeline (`build_store`, raw a3m + PDB files parsed,
--workers 2 vs 1) on `--raw-families` families, the store writer and verifier throughput at
full scale, store open time (target < 1 s), random family read latency p50/p99, sampler
memory and planning time per rank at dp=1024, and the size overhead vs the raw arrays.

    python benchmarks/store_scale.py [--families 100000] [--raw-families 1000] [--workers 2]

Synthetic families: length lognormal (median 200, sigma 0.55, 20..1500; PDB chains), MSA depth
lognormal (median 24, sigma 1.2, 1..256: shallower than real MSAs to keep the file small),
residues at UniProt frequencies, heavy atoms of each residue type (6 % of residues and 3 % of
side-chain atoms unobserved), coordinates on a 3.8 Å CA walk rounded to 0.001 Å like a PDB file.
Absolute numbers on a shared 2-core machine are noisy; the ratios and the scale matter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np

from protdp.data.build import build_store
from protdp.data.residue_constants import RESTYPE_3, RESTYPE_ATOM14_NAMES, RESTYPE_ATOM37_MASK
from protdp.data.residues import RESTYPES
from protdp.data.sampler import FamilySampler
from protdp.data.store import (FAMILY_ARRAYS, FamilyStore, new_store_file, verify_store,
                               write_family, write_index)
from protdp.paths import REPO_ROOT

# UniProtKB/Swiss-Prot amino-acid composition (release 2024_01 statistics), RESTYPES order
AA_FREQ = np.array([8.25, 5.53, 4.06, 5.45, 1.37, 3.93, 6.75, 7.07, 2.27, 5.96, 9.66, 5.84,
                    2.42, 3.86, 4.70, 6.56, 5.34, 1.08, 2.92, 6.87])
AA_FREQ = AA_FREQ / AA_FREQ.sum()
EST_KB_PER_FAMILY = 45           # for the disk check (measured ~35 KB with these settings)


# ------------------------------------------------------------------ synthetic families

def synthetic_family(i: int, seed: int = 0) -> dict:
    """One family dict as `build_store` writes it (deterministic in (seed, i))."""
    rng = np.random.default_rng([seed, i])
    L = int(np.clip(rng.lognormal(np.log(200), 0.55), 20, 1500))
    N = int(np.clip(rng.lognormal(np.log(24), 1.2), 1, 256))
    aa = rng.choice(20, L, p=AA_FREQ)
    mask = RESTYPE_ATOM37_MASK[aa].copy()                                 # [L, 37]
    mask[:, 5:] &= (rng.random((L, 32)) > 0.03)                           # side-chain atoms
    mask[rng.random(L) < 0.06] = 0                                        # whole residues
    step = rng.normal(size=(L, 3))
    ca = np.cumsum(3.8 * step / np.linalg.norm(step, axis=1, keepdims=True), 0)
    pos = ca[:, None, :] + rng.normal(0.0, 1.6, (L, 37, 3))
    pos = np.round(np.where(mask[..., None] > 0, pos, 0.0), 3).astype(np.float32)
    msa = np.where(rng.random((N, L)) < 0.35, rng.integers(0, 22, (N, L)), aa[None]).astype(
        np.uint8)
    msa[0] = aa
    dels = np.where(rng.random((N, L)) < 0.03, rng.integers(1, 20, (N, L)), 0).astype(np.uint8)
    dels[0] = 0
    return {"family_id": f"syn{i:06d}", "msa": msa, "deletion_matrix": dels,
            "residue_index": np.arange(L, dtype=np.int32), "all_atom_positions": pos,
            "all_atom_mask": mask.astype(np.uint8),
            "between_segment_residues": np.zeros(L, np.uint8),
            "sequence": "".join(RESTYPES[a] for a in aa), "resolution": 2.0, "chain": "A",
            "placement": "numbering", "warnings": [], "pairing": {}}


def raw_bytes(fam: dict) -> int:
    return sum(np.asarray(fam[k]).nbytes for k in FAMILY_ARRAYS)


# ------------------------------------------------------------------------ raw input files

def _pdb_text(fam: dict) -> str:
    seq, mask, pos = fam["sequence"], fam["all_atom_mask"], fam["all_atom_positions"]
    names3 = [RESTYPE_3[RESTYPES.index(a)] for a in seq]
    lines = [f"SEQRES {k // 13 + 1:3d} A {len(seq):4d}  " + " ".join(names3[k:k + 13])
             for k in range(0, len(seq), 13)]
    from protdp.data.residue_constants import ATOM_ORDER
    serial = 1
    for i, name3 in enumerate(names3):
        for atom in RESTYPE_ATOM14_NAMES[name3]:
            k = ATOM_ORDER[atom]
            if not mask[i, k]:
                continue
            x, y, z = pos[i, k]
            label = f" {atom:<3}" if len(atom) < 4 else atom
            lines.append(f"ATOM  {serial:5d} {label} {name3} A{i + 1:4d}    {x:8.3f}{y:8.3f}"
                         f"{z:8.3f}  1.00 20.00           {atom[0]}")
            serial += 1
    return "\n".join(lines + ["END"]) + "\n"


def _a3m_text(fam: dict) -> str:
    table = RESTYPES + "X-"
    rows = [">query\n" + fam["sequence"]]
    for n, (row, d) in enumerate(zip(fam["msa"][1:], fam["deletion_matrix"][1:]), 1):
        text = "".join(("a" * int(k) if k else "") + table[t] for t, k in zip(row, d))
        rows.append(f">hit{n}\n{text}")
    return "\n".join(rows) + "\n"


def write_raw_inputs(folder: Path, n: int, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["pair_id\tmsa_file\tstructure_file\tchain"]
    for i in range(n):
        fam = synthetic_family(i, seed + 1)
        (folder / f"raw{i:05d}.a3m").write_text(_a3m_text(fam))
        (folder / f"raw{i:05d}.pdb").write_text(_pdb_text(fam))
        lines.append(f"raw{i:05d}\traw{i:05d}.a3m\traw{i:05d}.pdb\tA")
    (folder / "pairs.tsv").write_text("\n".join(lines) + "\n")
    return folder / "pairs.tsv"


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the build runs in children)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bench_build(folder: Path, n: int, workers: int, seed: int) -> dict:
    """The real pipeline on raw files: parse + pair + filter + write + verify + rename. CPU
    seconds per family are measured too: on a shared machine the wall-clock speed-up of more
    workers depends on who else runs, the CPU cost does not."""
    pairs = write_raw_inputs(folder / "raw", n, seed)
    out = {}
    for w in sorted({1, workers}):
        store = folder / f"raw_w{w}.h5"
        load0, c0 = os.getloadavg()[0], cpu_seconds()
        report = build_store(store, pairs=pairs, workers=w, progress=False)
        cpu = cpu_seconds() - c0
        assert report.balanced and report.accepted_families == n, report.summary()
        out[f"workers_{w}"] = {"families": n, "seconds": report.seconds,
                               "verify_seconds": report.verify_seconds,
                               "families_per_s": n / report.seconds,
                               "cpu_seconds_per_family": cpu / n,
                               "cpu_utilisation": cpu / report.seconds,
                               "load_avg_1m_before": load0}
    t0 = time.perf_counter()
    report = build_store(folder / f"raw_w{workers}.h5", pairs=pairs, workers=workers,
                         progress=False)
    assert report.unchanged == n
    out["incremental_no_change"] = {"seconds": time.perf_counter() - t0,
                                    "families_per_s": n / (time.perf_counter() - t0)}
    out["speedup_workers"] = (out[f"workers_{workers}"]["families_per_s"] /
                              out["workers_1"]["families_per_s"])
    out["cpu_cost_ratio_workers"] = (out[f"workers_{workers}"]["cpu_seconds_per_family"] /
                                     out["workers_1"]["cpu_seconds_per_family"])
    return out


# ------------------------------------------------------------------------ the big store

def write_scale_store(path: Path, n: int, seed: int) -> dict:
    """The build's writer path (write_family + write_index + verify_store) at full scale."""
    raw = 0
    t_gen = t_write = cpu_write = 0.0
    with new_store_file(path, "{}", "synthetic") as h5:
        for i in range(n):
            t0 = time.perf_counter()
            fam = synthetic_family(i, seed)
            t1, c1 = time.perf_counter(), time.process_time()
            write_family(h5, fam, [f"syn{i}.a3m", f"syn{i}.pdb"], ["0" * 64] * 2, [])
            t_write += time.perf_counter() - t1
            cpu_write += time.process_time() - c1
            t_gen += t1 - t0
            raw += raw_bytes(fam)
            if (i + 1) % 10000 == 0:
                print(f"  wrote {i + 1} families ({t_write:.0f} s writing)", flush=True)
        t0 = time.perf_counter()
        write_index(h5)
        t_index = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), cpu_seconds()
    check = verify_store(path, workers=2)
    t_verify, cpu_verify = time.perf_counter() - t0, cpu_seconds() - c0
    assert check.ok, check.summary()
    size = path.stat().st_size
    return {"families": n, "write_seconds": t_write, "write_families_per_s": n / t_write,
            "write_cpu_ms_per_family": 1e3 * cpu_write / n,
            "verify_cpu_ms_per_family": 1e3 * cpu_verify / n,
            "index_seconds": t_index, "verify_seconds": t_verify,
            "verify_families_per_s": n / t_verify, "generate_seconds": t_gen,
            "file_bytes": size, "raw_array_bytes": raw, "size_vs_raw": size / raw,
            "bytes_per_family": size / n}


def _percentiles(times: list[float]) -> dict:
    ms = np.array(times) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "reads": len(ms)}


def bench_open_and_read(path: Path, reads: int, seed: int) -> dict:
    opens = []
    for _ in range(5):
        t0 = time.perf_counter()
        store = FamilyStore(path)
        opens.append(time.perf_counter() - t0)
    rng = np.random.default_rng(seed)
    ids = [store.family_ids[k] for k in rng.integers(0, len(store), reads)]
    times = []
    for fid in ids:
        t0 = time.perf_counter()
        fam = store.read(fid)
        times.append(time.perf_counter() - t0)
        assert fam["all_atom_positions"].shape[0] == fam["msa"].shape[1]
    return {"open_seconds_median": float(np.median(opens)), "open_seconds_max": max(opens),
            "read": _percentiles(times)}


def bench_sampler(path: Path, world_size: int) -> dict:
    """Per rank: the store index and one epoch's plan (memory under tracemalloc, time not)."""
    t0 = time.perf_counter()
    store = FamilyStore(path)
    sampler = FamilySampler(store, world_size, 0, 1, seed=0, crop_size=256)
    batches = sum(1 for _ in sampler)
    t_plan = time.perf_counter() - t0
    tracemalloc.start()
    store = FamilyStore(path)
    _, peak_store = tracemalloc.get_traced_memory()
    sampler = FamilySampler(store, world_size, 0, 1, seed=0, crop_size=256)
    assert sum(1 for _ in sampler) == batches
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    st = sampler.stats()
    return {"world_size": world_size, "families": len(store), "micro_batches_rank0": batches,
            "store_index_peak_bytes": peak_store, "rank_peak_bytes": peak,
            "plan_and_iterate_seconds": t_plan, "imbalance": st["imbalance"],
            "state_dict_bytes": len(json.dumps(sampler.state_dict()))}


# --------------------------------------------------------------------------------- peer

def bench_peer(folder: Path, n: int, reads: int, seed: int) -> dict:
    """One np.savez_compressed file per family: size, 'open' (listing + lengths), reads."""
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    raw = 0
    for i in range(n):
        fam = synthetic_family(i, seed)
        np.savez_compressed(folder / f"{fam['family_id']}.npz",
                            **{k: fam[k] for k in FAMILY_ARRAYS})
        raw += raw_bytes(fam)
    t_write = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in folder.iterdir())
    t0 = time.perf_counter()
    files = sorted(folder.iterdir())
    lengths = [np.load(f, mmap_mode=None)["residue_index"].shape[0] for f in files]
    t_open = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    times = []
    for k in rng.integers(0, len(files), reads):
        t0 = time.perf_counter()
        with np.load(files[k]) as z:
            _ = {name: z[name] for name in FAMILY_ARRAYS}
        times.append(time.perf_counter() - t0)
    assert len(lengths) == n
    return {"families": n, "write_families_per_s": n / t_write, "file_bytes": size,
            "size_vs_raw": size / raw, "open_seconds": t_open, "read": _percentiles(times)}


def bench_subset_store(folder: Path, n: int, reads: int, seed: int) -> dict:
    """Our store on the peer's exact families (same n), for like-for-like ratios."""
    path = folder / "subset.h5"
    stats = write_scale_store(path, n, seed)
    stats.update(bench_open_and_read(path, reads, seed))
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", type=int, default=100_000)
    ap.add_argument("--peer-families", type=int, default=10_000)
    ap.add_argument("--raw-families", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--world-size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=str(REPO_ROOT / "out/store_scale"))
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/store_scale.json"))
    args = ap.parse_args()
    folder = Path(args.dir)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    need = (args.families + 2 * args.peer_families) * EST_KB_PER_FAMILY * 1024 + \
        args.raw_families * 400 * 1024
    free = shutil.disk_usage(folder).free
    if need > 0.5 * free:
        raise SystemExit(f"needs ~{need / 2**30:.1f} GiB, only {free / 2**30:.1f} GiB free")

    t_all = time.perf_counter()
    print(f"1/5 real build from {args.raw_families} raw a3m + PDB families ...", flush=True)
    build = bench_build(folder, args.raw_families, args.workers, args.seed)
    print(f"2/5 peer (.npz per family) and our store on {args.peer_families} families ...",
          flush=True)
    peer = bench_peer(folder / "peer", args.peer_families, args.reads, args.seed)
    subset = bench_subset_store(folder, args.peer_families, args.reads, args.seed)
    print(f"3/5 writing {args.families} families ...", flush=True)
    big = folder / "store.h5"
    scale = write_scale_store(big, args.families, args.seed)
    print("4/5 open time and random reads ...", flush=True)
    scale.update(bench_open_and_read(big, args.reads, args.seed))
    print(f"5/5 sampler at dp={args.world_size} ...", flush=True)
    sampler = bench_sampler(big, args.world_size)
    result = {
        "benchmark": "store_scale",
        "settings": {k: getattr(args, k) for k in ("families", "peer_families",
                                                   "raw_families", "workers", "reads",
                                                   "world_size", "seed")},
        "build_from_raw_files": build,
        "store_100k": scale,
        "sampler_per_rank": sampler,
        "peer_npz_per_family": peer,
        "ours_on_peer_families": subset,
        "ratios": {
            "open_seconds_vs_target_1s": scale["open_seconds_median"] / 1.0,
            "read_p50_ours_vs_peer": subset["read"]["p50_ms"] / peer["read"]["p50_ms"],
            "read_p99_ours_vs_peer": subset["read"]["p99_ms"] / peer["read"]["p99_ms"],
            "size_ours_vs_peer": subset["file_bytes"] / peer["file_bytes"],
            "open_ours_vs_peer_listing": subset["open_seconds_median"] / peer["open_seconds"],
            "write_ours_vs_peer": subset["write_families_per_s"] /
            peer["write_families_per_s"],
            "build_speedup_workers": build["speedup_workers"],
            "writer_families_per_s_vs_build_families_per_s":
                scale["write_families_per_s"] /
                build[f"workers_{args.workers}"]["families_per_s"],
        },
        "total_seconds": time.perf_counter() - t_all,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version,
                    "load_avg_1m": os.getloadavg()[0]},
        "note": "shared 2-core machine, warm page cache (no cache drop on a shared host)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios"], indent=2))
    print(f"store {scale['families']} families: {scale['file_bytes'] / 2**30:.2f} GiB "
          f"({scale['size_vs_raw']:.2f} of raw), open {scale['open_seconds_median']:.3f} s, "
          f"read p50 {scale['read']['p50_ms']:.2f} ms p99 {scale['read']['p99_ms']:.2f} ms, "
          f"sampler rank peak {sampler['rank_peak_bytes'] / 2**20:.1f} MiB -> {args.out}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
