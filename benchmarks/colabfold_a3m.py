"""Reading ColabFold's complex a3m (`protdp.complex.colabfold_a3m.read_complex_a3m`) vs
reading the same rows from our per-chain layout (`protdp.data.parse.parse_msa` of each chain's
a3m, the peer: what `protdp complex features` reads from `protdp msa search` folders), side by
side on one synthetic heterodimer (seeded): two chains of --length residues, --paired paired
rows and --unpaired unpaired rows per chain (point mutations of the query, a few insertions).
Both give the same unpaired rows (checked). Timed, best of --repeats, interleaved.
Results: benchmarks/results/colabfold_a3m.json.

    .venv/bin/python benchmarks/colabfold_a3m.py [--length 300] [--paired 2000] [--unpaired 8000]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.data.parse import Msa, parse_msa  # noqa: E402
from protdp.fileio import atomic_write_json  # noqa: E402
from protdp.complex.colabfold_a3m import (ComplexA3m, a3m_row, read_complex_a3m,  # noqa: E402
                                           write_complex_a3m)

AMINO = np.frombuffer(b"ACDEFGHIKLMNPQRSTVWY", np.uint8)


def _rows(rng, query: np.ndarray, n: int) -> Msa:
    """Query + n rows: 30% substitutions, 10% gaps, an insertion of 1-3 residues in 2% of
    columns."""
    rows = np.repeat(query[None], n, axis=0)
    sub = rng.random(rows.shape) < 0.3
    rows[sub] = rng.choice(AMINO, sub.sum())
    rows[rng.random(rows.shape) < 0.1] = ord("-")
    dels = np.where(rng.random(rows.shape) < 0.02, rng.integers(1, 4, rows.shape), 0)
    dels[0] = 0
    rows[0], dels = query, dels.astype(np.uint8)
    return Msa([r.tobytes().decode() for r in rows], dels, ["101"] + [f"hit{i}" for i in range(1, n)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=300)
    ap.add_argument("--paired", type=int, default=2000)
    ap.add_argument("--unpaired", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(46)
    queries = [rng.choice(AMINO, args.length) for _ in range(2)]
    paired = [_rows(rng, q, args.paired) for q in queries]
    unpaired = [_rows(rng, q, args.unpaired) for q in queries]
    with tempfile.TemporaryDirectory() as tmp:
        cf = write_complex_a3m(Path(tmp) / "c.a3m", ComplexA3m(
            [q.tobytes().decode() for q in queries], [1, 1], paired, unpaired))
        chains = []
        for k, m in enumerate(unpaired):
            p = Path(tmp) / f"chain{k}.a3m"
            p.write_text("".join(f">{n}\n{a3m_row(s, d)}\n"
                                 for n, s, d in zip(m.names, m.sequences, m.deletion_matrix)))
            chains.append(p)
        times = {"colabfold_file": [], "per_chain_a3m": []}
        for _ in range(args.repeats):
            t = time.perf_counter()
            got = read_complex_a3m(cf)
            times["colabfold_file"].append(time.perf_counter() - t)
            t = time.perf_counter()
            peer = [parse_msa(p) for p in chains]
            times["per_chain_a3m"].append(time.perf_counter() - t)
        for a, b in zip(got.unpaired, peer):
            assert a.sequences == b.sequences and np.array_equal(a.deletion_matrix,
                                                                 b.deletion_matrix)
        size = cf.stat().st_size
        peer_size = sum(p.stat().st_size for p in chains)
    best = {k: min(v) for k, v in times.items()}
    result = {"benchmark": "colabfold_a3m", "args": vars(args), "file_bytes": size,
              "per_chain_files_bytes": peer_size,
              "seconds_best": best,
              "ratio_colabfold_over_per_chain": best["colabfold_file"] / best["per_chain_a3m"],
              "note": "the ColabFold file also holds the paired block and pads every "
                      "unpaired row with the other chain's gaps (not in the peer's files)",
              "machine": {"python": platform.python_version(), "cpu": platform.processor()}}
    out = ROOT / "benchmarks" / "results" / "colabfold_a3m.json"
    atomic_write_json(out, result)
    print(result)


if __name__ == "__main__":
    main()
