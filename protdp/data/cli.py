"""`protdp data build|verify|shards|info`: build the HDF5 family store, check it, inspect it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from protdp.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp data", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="build/update the HDF5 family store from raw files")
    b.add_argument("--msa-dir", help="folder of MSAs (a3m/sto/fasta/aln/clustal, optionally "
                                     ".gz), paired by file name")
    b.add_argument("--structure-dir", help="folder of structures (pdb/cif, optionally .gz)")
    b.add_argument("--pairs", help="TSV with msa_file, structure_file, chain (paths relative "
                                   "to the TSV); overrides name pairing")
    b.add_argument("--out", required=True, help="output store, e.g. data.h5")
    b.add_argument("--workers", type=int, default=1, help="parallel parser processes")
    b.add_argument("--config", default=None,
                   help="filter config YAML (default: configs/data/default.yaml values)")
    b.add_argument("--screening", default=None,
                   help="FASTA of sequences of concern (overrides the config's screening_fasta)")
    b.add_argument("--rejects", default=None, help="rejects report (default: rejects.jsonl "
                                                   "beside --out)")
    b.add_argument("--strict", action="store_true", help="exit 1 if anything was rejected")
    b.add_argument("--allow-single-sequence", action="store_true",
                   help="keep structures whose MSA is absent or unreadable as single-sequence "
                        "families (default: reject them)")
    b.add_argument("--force", action="store_true", help="rebuild every family")
    b.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    b.add_argument("--report-json", default=None, help="also write the build report as JSON")

    v = sub.add_parser("verify", help="read every family of a store and report problems "
                                      "(exit 1 if any)")
    v.add_argument("store", help="store built by `protdp data build`")

    s = sub.add_parser("shards", help="per-rank sharding summary of a store")
    s.add_argument("--data", required=True, help="store built by `protdp data build`")
    s.add_argument("--world-size", type=int, required=True)
    s.add_argument("--micro-batch-size", type=int, default=1)
    s.add_argument("--crop-size", type=int, default=256)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--epoch", type=int, default=0)

    i = sub.add_parser("info", help="list the families of a store")
    i.add_argument("--data", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "build":
        return _build(args)
    if args.cmd == "verify":
        from protdp.data.store import verify_store
        from protdp.complex.store import is_complex_store, verify_complex_report
        if is_complex_store(args.store):           # complex stores too (issue 47)
            report = verify_complex_report(args.store)
            print(report.summary())
            return 0 if report.ok else 1
        report = verify_store(args.store)
        print(report.summary())
        return 0 if report.ok else 1
    if args.cmd == "shards":
        from protdp.data.sampler import sharding_summary
        for flag, value in (("--world-size", args.world_size), ("--crop-size", args.crop_size)):
            if value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")
        from protdp.data.store import FamilyStore
        print(sharding_summary(FamilyStore(args.data), args.world_size,
                               micro_batch_size=args.micro_batch_size, crop_size=args.crop_size,
                               seed=args.seed, epoch=args.epoch))
        return 0
    if args.cmd == "info":
        from protdp.data.store import FamilyStore
        store = FamilyStore(args.data)
        print(f"{args.data}: {len(store)} families")
        for fid, L, n in zip(store.family_ids, store.lengths, store.num_seqs):
            print(f"  {fid:<16} L={int(L):<5} N_seq={int(n)}")
        return 0
    return 2


def _build(args) -> int:
    from protdp.config import to_dict
    from protdp.data.filters import FilterConfig
    from protdp.data.safeio import atomic_write_text, writable_output
    from protdp.data.store import build_store
    if not (args.pairs or args.msa_dir or args.structure_dir):
        raise ConfigError("give --pairs FILE or --msa-dir/--structure-dir")
    limit = 4 * (os.cpu_count() or 1)
    if not 1 <= args.workers <= limit:
        raise ConfigError(f"--workers must be within 1..{limit} (4 x the {os.cpu_count()} CPUs), "
                          f"got {args.workers}")
    if args.report_json:                                 # checked before any work starts
        writable_output(args.report_json, "report JSON (--report-json)", "json",
                        force=args.force, inputs=(args.pairs, args.config))
    cfg = FilterConfig.load(args.config)
    overrides = {}
    if args.screening:
        overrides["screening_fasta"] = args.screening
    if args.allow_single_sequence:
        overrides["allow_single_sequence"] = True
    if overrides:
        cfg = FilterConfig(**{**to_dict(cfg), **overrides})
    report = build_store(args.out, pairs=args.pairs, msa_dir=args.msa_dir,
                         structure_dir=args.structure_dir, config=cfg,
                         workers=args.workers, rejects_path=args.rejects,
                         progress=not args.no_progress, force=args.force)
    print(report.summary())
    if args.report_json:
        atomic_write_text(args.report_json, json.dumps(report.to_dict(), indent=2) + "\n")
    if not report.balanced:
        print("error: inputs != accepted + rejected + skipped", file=sys.stderr)
        return 1
    if args.strict and (report.rejected_files or report.rejected_families or
                        report.skipped_files):
        print(f"--strict: {report.rejected_files} file(s), {report.rejected_families} "
              f"family(ies) rejected and {report.skipped_files} file(s) skipped; see "
              f"{report.rejects_path}", file=sys.stderr)
        return 1
    return 0
