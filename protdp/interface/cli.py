"""`protdp interface PAE_FILE STRUCTURE`: ipSAE, ipTM_d0chn, pDockQ, pDockQ2 and LIS per chain
pair of a prediction from AlphaFold2 / ColabFold (scores JSON + PDB), AlphaFold 3
(`*_full_data_*.json` + mmCIF), Boltz (`pae_*.npz` + mmCIF/PDB) or protdp (scores.json + PDB);
prints ipsae.py's table and writes the rows as JSON with --json."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from protdp.errors import InputError
from protdp.fileio import atomic_write_json, check_output
from protdp.interface.readers import read_prediction
from protdp.interface.scores import DEFAULT_DIST_CUTOFF, DEFAULT_PAE_CUTOFF
from protdp.interface.table import format_table, prediction_rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp interface", description=__doc__)
    p.add_argument("pae_file", help="scores JSON (AF2/ColabFold/protdp), AF3 full_data JSON "
                                    "or Boltz pae_*.npz")
    p.add_argument("structure", help="the model's PDB or mmCIF")
    p.add_argument("--pae-cutoff", type=float, default=DEFAULT_PAE_CUTOFF,
                   help="Å; pairs with PAE below it count for ipSAE (default 10)")
    p.add_argument("--dist-cutoff", type=float, default=DEFAULT_DIST_CUTOFF,
                   help="Å; Cβ distance for the interface residue counts dist1/dist2 (default 10)")
    p.add_argument("--json", metavar="OUT", help="write the rows as JSON here")
    p.add_argument("--ipsae-py-order", action="store_true",
                   help="max rows as ipsae.py v4 computes them when a chain with a larger id "
                        "comes first in the file (it then misses the other direction)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    for name in ("pae_cutoff", "dist_cutoff"):
        v = getattr(args, name)
        if not math.isfinite(v) or v <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be a positive number, got {v}")
    if args.json:
        check_output(args.json, "json", "--json output", inputs=(args.pae_file, args.structure))
    pred = read_prediction(args.pae_file, args.structure)
    rows = prediction_rows(pred, args.pae_cutoff, args.dist_cutoff, args.ipsae_py_order)
    print(format_table(rows, Path(args.structure).stem), end="")
    if args.json:
        atomic_write_json(args.json, {"pae_file": str(args.pae_file),
                                      "structure": str(args.structure), "format": pred.format,
                                      "interface_scores": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
