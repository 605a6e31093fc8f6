"""Test helper: a small HDF5 store of a few real families of ../shared/data/PAIRS.tsv."""

from __future__ import annotations

import csv
from pathlib import Path


def build_pairs_store(data_dir: Path, pair_ids, out_dir: Path, skip_msas=()) -> Path:
    """Write `out_dir/pairs.tsv` (absolute paths) for `pair_ids`, minus MSA files in `skip_msas`
    (paths relative to the data dir), build `out_dir/data.h5` from it and return its path."""
    from protdp.data.store import build_store

    with open(data_dir / "PAIRS.tsv") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t")
                if r["pair_id"] in set(pair_ids) and r["msa_file"] not in set(skip_msas)]
    lines = ["pair_id\tmsa_file\tstructure_file\tchain"] + [
        f"{r['pair_id']}\t{data_dir / r['msa_file']}\t{data_dir / r['structure_file']}\t"
        f"{r['chain']}" for r in rows]
    pairs = Path(out_dir) / "pairs.tsv"
    pairs.write_text("\n".join(lines) + "\n")
    build_store(Path(out_dir) / "data.h5", pairs=pairs, progress=False)
    return Path(out_dir) / "data.h5"
