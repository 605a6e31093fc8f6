r"""`protdp complex features`: AlphaFold-Multimer model inputs and the MSA pairing, per complex.

    protdp msa search --complexes --fasta complexes.fasta --db uniref90.fasta.gz --out msas/
    protdp msa search --complexes --fasta complexes.fasta --db uniprot.fasta.gz \
        --max-sequences 50000 --out msas/
    protdp complex features --fasta complexes.fasta --msa-dir msas/ --out features/

Complexes are read as `protdp.complex.inputs.read_complexes` reads them (ColabFold 'A:B'
records, one file per complex, or a folder of such files). MSAs the user gives for a complex
come first (`protdp.complex.given_msas`): ColabFold's complex a3m `<msa-dir>/<complex>.a3m`
(`#L1,L2<TAB>c1,c2` header), or the user's own pairing `<msa-dir>/<complex>/paired/<chain>.a3m`
(+ `unpaired/<chain>.a3m`), paired rows kept as given. Otherwise each distinct chain's MSAs are
those `protdp msa search --complexes` wrote under `<msa-dir>/<complex>_<chain id>/` (every
database except the pairing one, merged as `protdp predict` merges them); the pairing reads
`<msa-dir>/<complex>_<chain id>/stockholm/<pairing-db>.sto`. Per complex, OUT/<complex>/ gets
`features.npz` (AlphaFold's multimer `np_example`) and `pairing.json` (which rows were paired by
which species); OUT/complex_features.tsv lists every complex with its status. A bad complex is
one line there (and on stderr) and the others go on. Templates are not searched here (zero
template slots). --pair-mode unpaired|paired|unpaired_paired (ColabFold's names) keeps the
unpaired rows, the paired block, or both (`protdp.complex.pair_modes`).

`protdp complex predict --features-dir OUT ...` is `protdp predict --fasta OUT ...` (one
prediction path, issue 41): the features folder is read as precomputed complexes
(`protdp.inference.complex_features_input`), with the release check (`--allow-unreleased`),
the gate, the review queue, the prediction folder layout, ModelCIF, provenance and resume of
`protdp predict`; every other `protdp predict` flag passes through.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

import numpy as np

from protdp.errors import InputError, ProtdpError
from protdp.inference.complexes import chain_inputs, malformed_species_note
from protdp.inference.writers import printable, safe_name
from protdp.msa.writers import atomic_write
from protdp.complex.features import ChainInput, complex_features, write_pairing_report
from protdp.complex.inputs import ComplexTarget, read_complexes
from protdp.complex.pair_modes import DEFAULT_PAIR_MODE, PAIR_MODES

MAX_LENGTH = 10_000                 # per chain, as `protdp msa search`
MAX_UNKNOWN_FRACTION = 0.5
SUMMARY = "complex_features.tsv"
COLUMNS = ("index", "complex", "chains", "length", "paired_rows", "msa_rows", "status",
           "detail")


def _chain_inputs(t: ComplexTarget, msa_dir: Path, pairing_db: str,
                  pair_mode: str = DEFAULT_PAIR_MODE) -> list[ChainInput]:
    """Each chain's MSAs and pairing alignment (shared with `protdp predict`)."""
    return chain_inputs(t, msa_dir, pairing_db=pairing_db, max_length=MAX_LENGTH,
                        max_unknown_fraction=MAX_UNKNOWN_FRACTION, pair_mode=pair_mode)[0]


def _save_npz(path: Path, arrays: dict) -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write(path, buf.getvalue())


def run(fasta: str, msa_dir: str, out: str, pairing_db: str,
        pair_mode: str = DEFAULT_PAIR_MODE) -> list[dict]:
    out_dir = Path(out)
    if not Path(msa_dir).is_dir():     # a typo: one line, not every complex rejected
        raise InputError("MSA directory not found (give the --out folder of `protdp msa "
                         "search --complexes`)", path=msa_dir)
    rows = []
    for t in read_complexes(fasta):
        row = {"index": t.index, "complex": printable(t.complex_id),
               "chains": len(t.chains), "length": sum(len(s) for s in t.sequences),
               "paired_rows": "", "msa_rows": "", "status": "error", "detail": t.error or ""}
        rows.append(row)
        if t.error:
            continue
        try:
            cf = complex_features(_chain_inputs(t, Path(msa_dir), pairing_db, pair_mode))
        except (ProtdpError, ValueError) as exc:
            row["detail"] = str(exc).replace("\n", " ")
            continue
        folder = out_dir / safe_name(t.complex_id)
        _save_npz(folder / "features.npz", cf.features)
        write_pairing_report(folder / "pairing.json", t.complex_id, cf.report)
        row.update(status="ok", msa_rows=int(cf.features["num_alignments"]),
                   paired_rows=len(cf.report.get("paired_rows", [])),
                   detail=malformed_species_note(cf.report))
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows([[r[c] for c in COLUMNS] for r in rows])
    atomic_write(out_dir / SUMMARY, buf.getvalue().encode())
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp complex", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("features", help="paired AlphaFold-Multimer features per complex",
                       description=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--fasta", required=True, help="complexes (file or folder)")
    s.add_argument("--msa-dir", required=True,
                   help="output of `protdp msa search --complexes`, and/or ColabFold's "
                        "<complex>.a3m, and/or <complex>/paired/<chain>.a3m (your pairing)")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--pairing-db", default="uniprot",
                   help="database whose Stockholm alignment is paired (%(default)s)")
    s.add_argument("--pair-mode", choices=PAIR_MODES, default=DEFAULT_PAIR_MODE,
                   help="paired block, unpaired rows or both, as ColabFold names them "
                        "(%(default)s)")
    pr = sub.add_parser("predict", help="`protdp predict` of each complex folder written by "
                        "`protdp complex features` (any other `protdp predict` flag, e.g. "
                        "--allow-unreleased, --queue-url, --seeds, passes through)",
                        description="`protdp predict --fasta FEATURES_DIR`: the release check "
                        "(an unreleased checkpoint is refused unless --allow-unreleased), gate, "
                        "review queue, layout, ModelCIF, provenance and resume of `protdp "
                        "predict`; every other `protdp predict` flag (--allow-unreleased, "
                        "--queue-url, --seeds, --no-plots, ...) passes through.")
    pr.add_argument("--features-dir", required=True, help="output of `protdp complex features`")
    pr.add_argument("--checkpoint", required=True, action="append",
                    help="multimer checkpoint (`protdp weights import` of params_model_N_multimer_v3.npz); "
                         "repeat it for an ensemble")
    pr.add_argument("--out", required=True,
                    help="output folder (`protdp predict`'s: targets/<complex>/<id>/, summary.tsv)")
    pr.add_argument("--seed", type=int, default=0,
                    help="MSA sampling seed, `protdp predict --random-seed` (%(default)s)")
    pr.add_argument("--gating", default=None, help="gate policy YAML (default: the shipped one)")
    pr.add_argument("--num-recycles", type=int, default=None,
                    help="recycles (default: the checkpoint's; early stop as AlphaFold-Multimer)")
    _add_store_parser(sub)
    return p


# ---- `protdp complex store`: the complex store for fine-tuning (protdp.complex.store) ----
def _add_store_parser(sub) -> None:
    st = sub.add_parser("store", help="HDF5 store of complexes (assembly mmCIF + per-chain MSAs) "
                        "for `protdp train --data` (fine-tuning AlphaFold-Multimer)")
    st.add_argument("--manifest", required=True, help="TSV: complex_id, structure_file, chain, "
                    "msa_file ('-' = no MSA; comma-separated files are merged), one row per chain")
    st.add_argument("--out", required=True, help="store file to write (.h5)")
    st.add_argument("--force", action="store_true", help="replace an existing complex store")


def _store(args) -> int:
    from protdp.complex.store import build_complex_store

    report = build_complex_store(args.manifest, args.out, force=args.force,
                                 log=lambda line: print(f"  {line}", file=sys.stderr))
    print(f"protdp complex store: {report.summary()}")
    return 0 if report.built else 1
# ---- end of `protdp complex store` ----


def predict_argv(args, extra: list[str]) -> list[str]:
    """`protdp complex predict` as the `protdp predict` command line it stands for: the
    features folder is its --fasta (`protdp.inference.complex_features_input`), so release
    check (--allow-unreleased), gate, review queue, layout, ModelCIF, provenance and resume
    are `protdp predict`'s; every other `protdp predict` flag passes through."""
    folder = Path(args.features_dir)
    if not folder.is_dir():
        raise InputError("not a folder (give the --out folder of `protdp complex features`)",
                         path=folder)
    if not any(folder.glob("*/features.npz")):
        raise InputError("no <complex>/features.npz in this folder (write them with `protdp "
                         "complex features --out`)", path=folder)
    argv = [a for c in args.checkpoint for a in ("--checkpoint", c)]
    argv += ["--fasta", str(folder), "--out", args.out, "--random-seed", str(args.seed)]
    if args.num_recycles is not None:
        argv += ["--num-recycles", str(args.num_recycles)]
    if args.gating is not None:
        argv += ["--gating", args.gating]
    return argv + extra


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra and args.cmd != "predict":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "store":
        return _store(args)
    if args.cmd == "predict":            # one prediction path: `protdp predict` (issue 41)
        from protdp.inference.cli import main as predict_main
        return predict_main(predict_argv(args, extra))
    rows = run(args.fasta, args.msa_dir, args.out, args.pairing_db, args.pair_mode)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"protdp complex features: {len(rows)} complexes: {ok} ok, {len(rows) - ok} rejected; "
          f"summary: {Path(args.out) / SUMMARY}")
    for r in rows:
        if r["detail"]:
            what = "rejected" if r["status"] != "ok" else "warning"
            print(f"  {what}: {r['complex']}: {r['detail']}", file=sys.stderr)
    return 1 if rows and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
