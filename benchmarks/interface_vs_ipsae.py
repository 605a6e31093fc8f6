"""protdp's interface scores side by side with DunbrackLab/IPSAE's ipsae.py (issue 43, item 6).

    python benchmarks/interface_vs_ipsae.py --ipsae /path/to/ipsae.py \
        [--fixture ../shared/af2_reference/multimer] [--data ../shared/data] \
        [--example-dir IPSAE/Example] [--out benchmarks/results/interface_vs_ipsae.json]

ipsae.py is a fetched copy (never vendored; it needs numpy only) run in a subprocess with
this interpreter on every case of `interface_cases.build_cases` (ColabFold layout of the
AlphaFold-Multimer fixture's predictions and of 4HHB; AlphaFold 3 layout with ligands, a
modified residue and DNA; Boltz layout) at several (pae_cutoff, dist_cutoff), plus IPSAE's own
AlphaFold 3 example when --example-dir is given, plus (--protdp-out) the interface rows that
`protdp predict` stored in its scores.json against ipsae.py on the ColabFold scores JSON and
ranked_0.pdb of the same folder. Every printed column is compared: ipsae.py
prints six decimals for ipSAE / ipTM (tolerance 2e-6), four for pDockQ, pDockQ2, LIS (1.5e-4),
three for ipTM_af (1.5e-3), two for d0 (6e-3), integers exactly. --reference writes the rows
ipsae.py printed for the cases (tests/data/interface_ipsae_reference.json, for CI).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from interface_cases import build_cases  # noqa: E402

COLUMNS = ("chain_1", "chain_2", "pae", "dist", "type", "ipsae", "ipsae_d0chn", "ipsae_d0dom",
           "iptm_af", "iptm_d0chn", "pdockq", "pdockq2", "lis", "n0res", "n0chn", "n0dom",
           "d0res", "d0chn", "d0dom", "nres1", "nres2", "dist1", "dist2", "model")
TOLERANCE = {"ipsae": 2e-6, "ipsae_d0chn": 2e-6, "ipsae_d0dom": 2e-6, "iptm_d0chn": 2e-6,
             "pdockq": 1.5e-4, "pdockq2": 1.5e-4, "lis": 1.5e-4, "iptm_af": 1.5e-3,
             "d0res": 6e-3, "d0chn": 6e-3, "d0dom": 6e-3,
             "n0res": 0, "n0chn": 0, "n0dom": 0, "nres1": 0, "nres2": 0, "dist1": 0, "dist2": 0}
CUTOFFS = ((10.0, 10.0), (15.0, 15.0), (5.0, 8.0))


def parse_ipsae_table(text: str) -> list[dict]:
    """The rows of ipsae.py's `<stem>_<PAE>_<DIST>.txt`."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != len(COLUMNS) or parts[0] == "Chn1":
            continue
        row = dict(zip(COLUMNS, parts))
        for k in TOLERANCE:
            row[k] = int(row[k]) if TOLERANCE[k] == 0 else float(row[k])
        rows.append(row)
    return rows


def run_ipsae(ipsae: Path, pae: Path, structure: Path, pae_cutoff: float, dist_cutoff: float
              ) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ipsae), str(pae), str(structure),
                           str(pae_cutoff), str(dist_cutoff)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"ipsae.py failed on {pae}: {proc.stderr[-2000:]}")
    stem = str(structure).rsplit(".", 1)[0]
    p, d = str(int(pae_cutoff)).zfill(2), str(int(dist_cutoff)).zfill(2)
    return parse_ipsae_table(Path(f"{stem}_{p}_{d}.txt").read_text()), seconds


def compare(ours: list[dict], theirs: list[dict]) -> dict:
    """Max |difference| per column over matching rows; row keys must agree in order."""
    keys_ours = [(r["chain_1"], r["chain_2"], r["type"]) for r in ours]
    keys_theirs = [(r["chain_1"], r["chain_2"], r["type"]) for r in theirs]
    if keys_ours != keys_theirs:
        return {"rows_match": False, "ours": keys_ours, "theirs": keys_theirs, "ok": False}
    keys = [k for k in TOLERANCE if k in ours[0]]        # stored rows have no iptm_af
    worst = {k: max(abs(float(a[k]) - float(b[k])) for a, b in zip(ours, theirs))
             for k in keys}
    return {"rows_match": True, "rows": len(ours), "max_abs_diff": worst,
            "ok": all(worst[k] <= TOLERANCE[k] for k in keys)}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ipsae", required=True, type=Path, help="a fetched copy of ipsae.py")
    ap.add_argument("--fixture", type=Path,
                    default=HERE.parent.parent / "shared" / "af2_reference" / "multimer")
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--example-dir", type=Path, help="IPSAE's Example/ folder (AF3 example)")
    ap.add_argument("--protdp-out", type=Path, action="append", default=[],
                    help="a `protdp predict --out` folder: its complexes' stored "
                         "interface_scores vs ipsae.py on the ColabFold JSON + ranked_0.pdb")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "interface_vs_ipsae.json")
    ap.add_argument("--reference", type=Path,
                    help="also write ipsae.py's rows at 10/10 for the built cases here")
    args = ap.parse_args(argv)

    from protdp.interface.readers import read_prediction
    from protdp.interface.table import prediction_rows

    work = Path(tempfile.mkdtemp(prefix="interface_vs_ipsae_"))
    cases = build_cases(work, args.fixture, args.data)
    if args.example_dir:
        ex = work / "ipsae_example"
        ex.mkdir()
        for name in ("fold_aurka_0_tpx2_0_full_data_0.json", "fold_aurka_0_tpx2_0_model_0.cif"):
            shutil.copy(args.example_dir / name, ex / name)
        cases["ipsae_example_af3_aurka_tpx2"] = (ex / "fold_aurka_0_tpx2_0_full_data_0.json",
                                                 ex / "fold_aurka_0_tpx2_0_model_0.cif")
    report, reference, all_ok = {}, {}, True
    for name, (pae, structure) in cases.items():
        for pae_cutoff, dist_cutoff in CUTOFFS:
            theirs, t_ipsae = run_ipsae(args.ipsae, pae, structure, pae_cutoff, dist_cutoff)
            t0 = time.perf_counter()
            pred = read_prediction(pae, structure)
            ours = prediction_rows(pred, pae_cutoff, dist_cutoff, ipsae_py_order=True)
            t_ours = time.perf_counter() - t0
            result = compare(ours, theirs)
            true_max = prediction_rows(pred, pae_cutoff, dist_cutoff)
            result["max_rows_changed_by_ipsae_py_order"] = sum(
                a != b for a, b in zip(ours, true_max))
            result.update(format=pred.format, residues=int(len(pred.residues.chain_ids)),
                          chains=pred.residues.chains, ipsae_seconds=round(t_ipsae, 3),
                          protdp_seconds=round(t_ours, 3))
            report[f"{name}@{pae_cutoff:g}/{dist_cutoff:g}"] = result
            all_ok &= result["ok"]
            print(f"{name:32s} {pae_cutoff:4g}/{dist_cutoff:<4g} {'ok' if result['ok'] else 'DIFF'}"
                  f" {json.dumps(result.get('max_abs_diff'))}")
            if (pae_cutoff, dist_cutoff) == (10.0, 10.0) and name in build_names():
                reference[name] = {"pae_file": Path(pae).name,
                                   "structure": Path(structure).name,
                                   "sha256": {Path(pae).name: sha256(pae),
                                              Path(structure).name: sha256(structure)},
                                   "rows": [{k: r[k] for k in COLUMNS if k != "model"}
                                            for r in theirs]}
    for folder in args.protdp_out:
        for name, result in stored_vs_ipsae(args.ipsae, folder, work).items():
            report[name] = result
            all_ok &= result["ok"]
            print(f"{name:32s} 10/10   {'ok' if result['ok'] else 'DIFF'} "
                  f"{json.dumps(result.get('max_abs_diff'))}")
    from protdp.fileio import atomic_write_json

    atomic_write_json(args.out, {"ipsae_py_sha256": sha256(args.ipsae), "tolerance": TOLERANCE,
                                 "all_within_tolerance": all_ok, "cases": report})
    if args.reference:
        atomic_write_json(args.reference, {"ipsae_py_sha256": sha256(args.ipsae),
                                           "pae_cutoff": 10.0, "dist_cutoff": 10.0,
                                           "cases": reference})
    shutil.rmtree(work, ignore_errors=True)
    print(f"all within tolerance: {all_ok}; wrote {args.out}")
    return 0 if all_ok else 1


def stored_vs_ipsae(ipsae: Path, out: Path, work: Path) -> dict:
    """Each complex of a `protdp predict` folder: the `interface_scores` its scores.json stores
    (computed inside the predictor) vs ipsae.py on copies of the ColabFold scores JSON and
    ranked_0.pdb written beside it (pae 10, dist 10)."""
    results = {}
    for current in sorted(Path(out).glob("targets/*/CURRENT")):
        pdir = current.parent / current.read_text().strip()
        stored = json.loads((pdir / "scores.json").read_text()).get("interface_scores")
        cf = next(pdir.glob("*_scores_rank_001_*.json"), None)
        if not stored or cf is None:
            continue
        dest = work / f"protdp_{current.parent.name}"
        dest.mkdir()
        shutil.copy(cf, dest / cf.name)
        shutil.copy(pdir / "ranked_0.pdb", dest / "ranked_0.pdb")
        theirs, seconds = run_ipsae(ipsae, dest / cf.name, dest / "ranked_0.pdb", 10.0, 10.0)
        result = compare(stored, theirs)
        result.update(format="protdp predict (stored scores.json rows)",
                      residues=stored[0]["n0chn"] if len(stored) == 3 else None,
                      ipsae_seconds=round(seconds, 3))
        results[f"protdp_predict_{current.parent.name}@10/10"] = result
    return results


def build_names() -> set:
    return {"colabfold_fixture_4hhb", "colabfold_fixture_2p90x2", "colabfold_4hhb",
            "af3_4hhb_haem_tpo", "af3_2q2k_dna", "boltz_2q2k_dna"}


if __name__ == "__main__":
    sys.exit(main())
