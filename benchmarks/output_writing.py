"""Writing one prediction's files: the PAE converted once (`protdp.inference.json_text`) vs the
old path that rounded, listed and JSON-encoded it again for every file (the peer,
tests/output_reference.py), side by side on the same synthetic ensemble.

Timed per length L, best of --repeats, the two interleaved, each into a fresh folder:
  after   `af_outputs.write_af_files` + `scores_json.prediction_scores` + scores.json
  before  the old write_af_files + the same prediction_scores (it converts the top model's
          PAE once more, as it did) + scores.json through the old encoder
At --memory-lengths, one more run of each under tracemalloc gives the peak of what Python
and numpy allocated while writing (the ensemble's own arrays not counted). Both write every
file of `write_af_files` (result npz, confidence, pae_<m>, ColabFold scores, the v1 and AFDB
PAE files, ranking_debug, timings, log) and scores.json; the JSON files' digests must agree
(tests/test_json_text.py checks the bytes). Results: benchmarks/results/output_writing.json.

    .venv/bin/python benchmarks/output_writing.py [--lengths 500 1000 2000] [--models 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import output_reference as before  # noqa: E402
from output_reference import synthetic_scores  # noqa: E402
from protdp.fileio import atomic_write_json, sha256_file  # noqa: E402
from protdp.inference.af_outputs import TOP_PAE_JSON, write_af_files  # noqa: E402
from protdp.inference.writers import write_json  # noqa: E402

MAX_PAE = 31.75


def write_after(folder: Path, preds: dict, order: list[str], debug: dict, seq: str) -> None:
    write_af_files(folder, "t1", preds, order, debug, {"features": 1.0}, MAX_PAE,
                   save_distogram=False, distogram_edges=None)
    write_json(folder / "scores.json", synthetic_scores(preds, order, seq))


def write_before(folder: Path, preds: dict, order: list[str], debug: dict, seq: str) -> None:
    before.write_af_files(folder, "t1", preds, order, debug, {"features": 1.0}, MAX_PAE)
    # prediction_scores converts the top model's PAE (here for the first time, as the old
    # one did); the old encoder writes it (its plain walk copies the list, as it did)
    before.write_json(folder / "scores.json", synthetic_scores(preds, order, seq))


def _timed(fn, preds, order, debug, seq, traced: bool = False) -> tuple[float, dict]:
    """(seconds, {file: digest (JSON) or size}) of one method writing into a fresh folder;
    `traced`: (peak MiB of Python / numpy allocations while it wrote (tracemalloc), {})."""
    for p in preds.values():
        p.pop(TOP_PAE_JSON, None)           # no conversion left over from the other method
    folder = Path(tempfile.mkdtemp(prefix="protdp-output-bench-"))
    try:
        if traced:
            tracemalloc.start()
            fn(folder, preds, order, debug, seq)
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            return peak, {}
        t0 = time.perf_counter()
        fn(folder, preds, order, debug, seq)
        seconds = time.perf_counter() - t0
        sizes = {p.name: (p.stat().st_size, sha256_file(p) if p.suffix == ".json" else "")
                 for p in folder.iterdir()}
    finally:
        shutil.rmtree(folder)
    return seconds, sizes


def measure(length: int, models: int, repeats: int, memory: bool) -> dict:
    preds, order, debug = before.synthetic_preds(length, models=models, seed=length)
    seq = "G" * length
    times = {"before": [], "after": []}
    sizes = {}
    for _ in range(repeats):
        for name, fn in (("before", write_before), ("after", write_after)):
            seconds, sizes[name] = _timed(fn, preds, order, debug, seq)
            times[name].append(seconds)
    assert sizes["before"] == sizes["after"], "the two methods wrote different files"
    best = {k: min(v) for k, v in times.items()}
    peaks = {name: _timed(fn, preds, order, debug, seq, traced=True)[0]
             for name, fn in (("before", write_before), ("after", write_after))} \
        if memory else None
    return {"length": length, "models": models, "seconds_best": best, "seconds_all": times,
            "traced_peak_mib": peaks,
            "before_over_after": best["before"] / best["after"],
            "bytes_written": sum(size for size, _ in sizes["after"].values()),
            "files": len(sizes["after"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[500, 1000, 2000])
    ap.add_argument("--models", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--memory-lengths", type=int, nargs="*", default=[1000, 2000],
                    help="lengths whose peak traced memory is measured too (a separate run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "output_writing.json"))
    args = ap.parse_args()
    rows = []
    for length in args.lengths:
        rows.append(measure(length, args.models, args.repeats, length in args.memory_lengths))
        r = rows[-1]
        peaks = r["traced_peak_mib"]
        print(f"L={length}: before {r['seconds_best']['before']:.2f} s, after "
              f"{r['seconds_best']['after']:.2f} s ({r['before_over_after']:.1f}x), "
              f"{r['bytes_written'] / 1e6:.0f} MB in {r['files']} files" + (
                  "" if peaks is None else f", peak {peaks['before']:.0f} -> "
                  f"{peaks['after']:.0f} MiB"), flush=True)
    atomic_write_json(args.out, {
        "what": "one prediction's files (write_af_files + scores.json), PAE converted once "
                "(after) vs once per file (before, tests/output_reference.py)",
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "note": "shared 2-core machine: compare the ratio, not the seconds"},
        "repeats": args.repeats, "results": rows})


if __name__ == "__main__":
    main()
