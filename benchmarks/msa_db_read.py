"""Sequence-database read speed: protdp's checked reader (`protdp.msa.sanitize`) vs pyhmmer's
own Easel reader (`SequenceFile`), side by side on the same synthetic FASTA file.

The database is UniRef-like: `>UniRef90_...` headers with a description, amino-acid sequences of
log-normal length (median ~300) wrapped at 60 columns, ~50 MB (seeded, written to a temporary
folder; clean, so that Easel reads it too). Timed, best of --repeats, interleaved:
  protdp_reader     `protein_records` over the file (what `protdp msa search` reads with)
  reference_reader  the line-by-line reader it replaced (tests/msa_reference_reader.py)
  pyhmmer_text      `SequenceFile(path, format="fasta").read_block()` (text sequences)
  protdp_blocks     `SequenceDatabase.blocks()`: reader + digitizing into DigitalSequenceBlocks
  pyhmmer_digital   `SequenceFile(path, digital=True).read_block()`
Both readers must yield the same records (checked). Results: benchmarks/results/msa_db_read.json.

    .venv/bin/python benchmarks/msa_db_read.py [--megabytes 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from msa_reference_reader import reference_records  # noqa: E402
from protdp.fileio import atomic_write_json  # noqa: E402
from protdp.msa.database import SequenceDatabase  # noqa: E402
from protdp.msa.sanitize import DatabaseScan, protein_records  # noqa: E402

AMINO = b"ACDEFGHIKLMNPQRSTVWY"
WRAP = 60                      # UniProt's FASTA line width


def write_database(path: Path, megabytes: float, seed: int = 0) -> int:
    """A clean UniRef-like FASTA of about `megabytes` MB; returns the record count."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(AMINO, dtype=np.uint8)
    target, written, count = int(megabytes * 1e6), 0, 0
    with open(path, "wb") as fh:
        while written < target:
            lengths = np.clip(rng.lognormal(np.log(300), 0.6, 1000).astype(int), 10, 30_000)
            residues = alphabet[rng.integers(0, len(alphabet), int(lengths.sum()))].tobytes()
            parts, at = [], 0
            for n in lengths:
                seq = residues[at:at + n]
                at += n
                count += 1
                parts.append(f">UniRef90_A{count:09d} Uncharacterized protein n=1 "
                             f"Tax=Homo sapiens TaxID=9606 RepID=A{count:09d}_HUMAN\n".encode())
                parts.extend(seq[i:i + WRAP] + b"\n" for i in range(0, n, WRAP))
            block = b"".join(parts)
            fh.write(block)
            written += len(block)
    return count


def _read(reader, path: Path) -> tuple[int, int]:
    scan = DatabaseScan()
    with io.BufferedReader(io.FileIO(str(path)), 1 << 20) as stream:
        n = sum(len(seq) for _, seq in reader(stream, scan, path))
    return scan.sequences, n


def _pyhmmer_text(path: Path) -> tuple[int, int]:
    from pyhmmer.easel import SequenceFile
    with SequenceFile(str(path), format="fasta") as fh:
        block = fh.read_block()
    return len(block), sum(len(s) for s in block)


def _pyhmmer_digital(path: Path) -> tuple[int, int]:
    from pyhmmer.easel import Alphabet, SequenceFile
    with SequenceFile(str(path), format="fasta", digital=True, alphabet=Alphabet.amino()) as fh:
        block = fh.read_block()
    return len(block), sum(len(s) for s in block)


def _protdp_blocks(path: Path) -> tuple[int, int]:
    blocks = list(SequenceDatabase.open(path).blocks())
    return sum(len(b) for b in blocks), sum(len(s) for b in blocks for s in b)


def _timed(fn, path: Path, times: list[float]):
    start = time.perf_counter()
    out = fn(path)
    times.append(time.perf_counter() - start)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megabytes", type=float, default=50.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "msa_db_read.json"))
    args = ap.parse_args(argv)
    import pyhmmer

    engines = {"protdp_reader": lambda p: _read(protein_records, p),
               "reference_reader": lambda p: _read(reference_records, p),
               "pyhmmer_text": _pyhmmer_text,
               "protdp_blocks": _protdp_blocks,
               "pyhmmer_digital": _pyhmmer_digital}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic_uniref.fasta"
        records = write_database(path, args.megabytes)
        size = path.stat().st_size
        with open(path, "rb") as fh:           # same records in the same order, same names
            ours = list(protein_records(fh, DatabaseScan(), path))
        with open(path, "rb") as fh:
            assert ours == list(reference_records(fh, DatabaseScan(), path))
        del ours
        times: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.repeats):          # interleaved: the machine's load hits all alike
            for name, fn in engines.items():
                counted = _timed(fn, path, times[name])
                assert counted[0] == records, (name, counted)
    best = {name: min(t) for name, t in times.items()}
    result = {
        "database": {"bytes": size, "records": records, "line_width": WRAP,
                     "kind": "synthetic UniRef-like FASTA, log-normal lengths (median 300)"},
        "seconds_best": best,
        "seconds_all": times,
        "megabytes_per_s": {name: size / 1e6 / s for name, s in best.items()},
        "ratios": {
            "protdp_reader_over_pyhmmer_text": best["protdp_reader"] / best["pyhmmer_text"],
            "reference_reader_over_pyhmmer_text": (best["reference_reader"]
                                                   / best["pyhmmer_text"]),
            "speedup_over_reference_reader": best["reference_reader"] / best["protdp_reader"],
            "protdp_blocks_over_pyhmmer_digital": (best["protdp_blocks"]
                                                   / best["pyhmmer_digital"]),
        },
        "versions": {"pyhmmer": pyhmmer.__version__, "numpy": np.__version__},
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "note": "2 cores shared with other jobs; best of the interleaved repeats"},
    }
    atomic_write_json(args.out, result, allow_nan=True)
    print(json.dumps({"seconds_best": best, "ratios": result["ratios"]}, indent=1))
    return result


if __name__ == "__main__":
    main()
