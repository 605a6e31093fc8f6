"""`protdp msa search`: MSAs for the targets of a FASTA file, with pyhmmer (AF2's jackhmmer
settings), into a folder that `protdp predict --msa-dir` reads.

    protdp msa search --fasta targets.fasta --db uniref90.fasta.gz [--db mgnify.fasta.gz] \
        --out msas/ [--workers N] [--iterations 1] [--max-sequences 10000] \
        [--templates-db pdb_seqres.txt --mmcif-dir mmcif/ --max-template-date 2021-11-01]

Targets are read exactly as `protdp predict` reads them (same ids, same file names), so
`protdp predict --fasta targets.fasta --msa-dir msas/` finds every MSA. A finished target is not
searched again; a bad record is reported in msas/msa_search.tsv and the others go on.
"""

from __future__ import annotations

import argparse
import os
import sys

from protdp.errors import ConfigError, InputError
from protdp.msa.run import search_targets
from protdp.msa.search import Query
from protdp.msa.settings import SearchSettings
from protdp.complex.pair_modes import DEFAULT_PAIR_MODE, PAIR_MODES

MAX_QUERY_LENGTH = 10_000          # longer queries are rejected (HMMER itself allows 100,000)
MAX_UNKNOWN_FRACTION = 0.5         # as `protdp predict`: mostly-unknown sequences are rejected


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


def add_search_arguments(p: argparse.ArgumentParser, *, db_required: bool,
                         prefix: str = "") -> None:
    """Search flags shared by `protdp msa search` and `protdp predict --db` (which spells them
    with prefix 'search-', e.g. --search-iterations)."""
    d = SearchSettings()
    p.add_argument("--db", action="append", required=db_required, metavar="SEQDB",
                   help="sequence database: FASTA, FASTA.gz or HMMER's hmmpgmd format "
                        "(streamed); repeat for several (one MSA per database, merged by the "
                        "predictor)")
    p.add_argument(f"--{prefix}iterations", type=int, default=d.iterations, dest="iterations",
                   help="jackhmmer iterations -N (%(default)s, AF2)")
    p.add_argument(f"--{prefix}evalue", type=float, default=d.evalue, dest="evalue",
                   help="reporting and inclusion E-value -E/--incE (%(default)s, AF2)")
    p.add_argument(f"--{prefix}max-sequences", type=int, default=d.max_sequences,
                   dest="max_sequences",
                   help="rows kept per database, query included (%(default)s: AF2 UniRef90; "
                        "AF2 keeps 501 for MGnify)")
    p.add_argument("--search-workers", type=int, default=default_workers(), dest="workers",
                   help="search threads (default: the CPUs available, %(default)s)")
    p.add_argument("--search-batch", type=int, default=32, dest="batch_size",
                   help="targets searched per pass over a database (%(default)s); a kill loses "
                        "at most one batch")


def settings_from_args(args) -> SearchSettings:
    if args.workers < 1:
        raise ConfigError(f"--search-workers must be >= 1, got {args.workers}")
    if args.batch_size < 1:
        raise ConfigError(f"--search-batch must be >= 1, got {args.batch_size}")
    try:
        return SearchSettings(iterations=args.iterations, evalue=args.evalue,
                              inclusion_evalue=args.evalue, max_sequences=args.max_sequences)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def read_queries(fasta: str, targets=None, *, max_length: int = MAX_QUERY_LENGTH,
                 max_unknown_fraction: float = MAX_UNKNOWN_FRACTION
                 ) -> tuple[list[Query], list[tuple[Query, str]]]:
    """FASTA -> (queries, rejected (query, reason)), with predict's reader and names."""
    from protdp.inference.targets import clean_sequence, read_targets
    from protdp.inference.writers import printable

    good, bad = [], []
    for t in read_targets(fasta) if targets is None else targets:
        query = Query(t.target_id, t.file_name, "")
        if t.error:
            bad.append((query, t.error))
            continue
        try:
            query.sequence = clean_sequence(t.raw_sequence, max_length=max_length,
                                            max_unknown_fraction=max_unknown_fraction)
        except InputError as exc:
            bad.append((query, f"{fasta}:{t.line}: target '{printable(t.target_id)}': {exc}"))
            continue
        good.append(query)
    return good, bad


def read_complex_queries(fasta: str, *, max_length: int = MAX_QUERY_LENGTH
                         ) -> tuple[list[Query], list[tuple[Query, str]]]:
    """Complexes (protdp.complex.inputs.read_complexes) -> one query per distinct chain,
    named `<complex>_<chain id>` (`chain_msa_names`); a bad complex is one rejected line."""
    from protdp.inference.targets import clean_sequence
    from protdp.inference.writers import safe_name
    from protdp.complex.inputs import chain_msa_names, read_complexes

    good, bad, owner = [], [], {}
    for t in read_complexes(fasta):
        if t.error:
            bad.append((Query(t.complex_id, "", ""), t.error))
            continue
        names = chain_msa_names(t)
        for c in t.chains:
            if names[c.chain_id] != f"{t.complex_id}_{c.chain_id}":
                continue                                    # identical to an earlier chain
            q = Query(names[c.chain_id], safe_name(names[c.chain_id]), "")
            key = q.stem.casefold()
            try:
                if key in owner:
                    raise InputError(f"MSA folder name '{q.stem}' collides with that of "
                                     f"'{owner[key]}'")
                q.sequence = clean_sequence(c.sequence, max_length=max_length,
                                            max_unknown_fraction=MAX_UNKNOWN_FRACTION)
            except InputError as exc:
                bad.append((q, f"{t.path}:{c.line}: complex '{t.complex_id}' chain "
                               f"{c.chain_id}: {exc}"))
                continue
            owner[key] = q.name
            good.append(q)
    return good, bad


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp msa", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search", help="jackhmmer-style MSA search with pyhmmer",
                       description=__doc__.split("\n\n", 1)[1])
    s.add_argument("--fasta", required=True, help="targets, one FASTA record each")
    s.add_argument("--out", required=True, help="output folder (<target>/<db>.a3m, TSV)")
    add_search_arguments(s, db_required=True)
    s.add_argument("--max-length", type=int, default=MAX_QUERY_LENGTH,
                   help="reject longer targets (%(default)s)")
    s.add_argument("--complexes", action="store_true",
                   help="the FASTA holds complexes (ColabFold 'A:B' records, one complex per "
                        "file, or a folder of such files): every distinct chain is searched as "
                        "<complex>_<chain id>; for AlphaFold-Multimer pairing search UniProt "
                        "with --max-sequences 50000 and pair <chain>/stockholm/<db>.sto")
    s.add_argument("--format", choices=("folders", "colabfold"), default="folders",
                   help="with --complexes, colabfold also writes <out>/<complex>.a3m in "
                        "ColabFold's complex a3m (paired block + unpaired rows; %(default)s)")
    s.add_argument("--pairing-db", default="uniprot",
                   help="--format colabfold: database whose Stockholm is species-paired "
                        "(%(default)s)")
    s.add_argument("--pair-mode", choices=PAIR_MODES, default=DEFAULT_PAIR_MODE,
                   help="--format colabfold: rows written, as ColabFold names them "
                        "(%(default)s)")
    s.add_argument("--force", action="store_true", help="search finished targets again")
    s.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_template_arguments(s)
    return p


def add_template_arguments(p: argparse.ArgumentParser) -> None:
    """Template search flags (AlphaFold v2.3's hmmsearch route, `protdp.templates`)."""
    t = p.add_argument_group("templates (AlphaFold's hmmsearch route; files beside the MSAs)")
    t.add_argument("--templates-db", metavar="PDB_SEQRES",
                   help="pdb_seqres.txt-style FASTA to search for templates")
    t.add_argument("--mmcif-dir", help="folder of <pdb_id>.cif files the hits are read from")
    t.add_argument("--max-template-date", default=None, metavar="YYYY-MM-DD",
                   help="templates released after this date are not used (required with "
                        "--templates-db)")
    t.add_argument("--obsolete-pdbs", default=None, help="PDB obsolete.dat (optional)")
    t.add_argument("--kalign-binary", default="kalign", help="kalign for realignments")


def template_inputs(args):
    """(featurizer, template database) from the template flags, checked before any MSA search
    (a missing flag or file is one line at once, not after hours of jackhmmer)."""
    import datetime as dt
    from pathlib import Path

    from protdp.templates.featurize import Featurizer, parse_obsolete
    from protdp.templates.search import read_database

    if not args.mmcif_dir or not args.max_template_date:
        raise ConfigError("--templates-db needs --mmcif-dir and --max-template-date")
    try:
        cutoff = dt.date.fromisoformat(args.max_template_date)
    except ValueError:
        raise ConfigError(f"--max-template-date must be YYYY-MM-DD, got "
                          f"{args.max_template_date!r}") from None
    if not Path(args.mmcif_dir).is_dir():
        raise ConfigError(f"--mmcif-dir {args.mmcif_dir}: not a folder")
    featurizer = Featurizer(Path(args.mmcif_dir), cutoff, kalign_binary=args.kalign_binary,
                            obsolete=parse_obsolete(args.obsolete_pdbs) if args.obsolete_pdbs else {})
    return featurizer, read_database(args.templates_db)


def search_templates_for(queries, args, out_dir, featurizer, database
                         ) -> list[tuple[Query, str]]:
    """Template search per searched target; a bad target is reported, the others go on."""
    from pathlib import Path

    from protdp.msa.database import database_name
    from protdp.msa.run import a3m_path
    from protdp.templates.run import search_target

    first_db = database_name(args.db[0])
    failed = []
    for q in queries:
        target_dir = Path(out_dir) / q.stem
        candidates = [a3m_path(Path(out_dir), q.stem, first_db)] + sorted(target_dir.glob("*.a3m"))
        a3m = next((c for c in candidates if c.is_file()), None)
        try:
            if a3m is None:
                raise InputError("no MSA to build the template HMM from", path=target_dir)
            result = search_target(q.sequence, a3m, database, featurizer, target_dir)
            print(f"  templates {q.name}: {len(result.used)} used"
                  + (f" ({', '.join(u['id'] + '_' + u['chain'] for u in result.used)})"
                     if result.used else ""))
        except InputError as exc:
            failed.append((q, f"templates: {exc}"))
    return failed


def _export_colabfold(args) -> list[tuple[Query, str]]:
    """--format colabfold: <out>/<complex>.a3m per complex (protdp.inference.complex_msa_export)."""
    from protdp.inference.complex_msa_export import export_colabfold_a3m

    failed = []
    for e in export_colabfold_a3m(args.fasta, args.out, max_length=args.max_length,
                                  max_unknown_fraction=MAX_UNKNOWN_FRACTION,
                                  pairing_db=args.pairing_db, pair_mode=args.pair_mode):
        if e.path is not None:
            print(f"  colabfold a3m {e.complex_id}: {e.path}")
        else:
            failed.append((Query(e.complex_id, "", ""), f"colabfold a3m: {e.error}"))
    return failed


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    settings = settings_from_args(args)
    if args.format == "colabfold" and not args.complexes:
        raise ConfigError("--format colabfold writes complexes' a3m: add --complexes")
    if args.max_length < 1:
        raise ConfigError(f"--max-length must be >= 1, got {args.max_length}")
    read = read_complex_queries if args.complexes else read_queries
    queries, rejected = read(args.fasta, max_length=args.max_length)
    templates = template_inputs(args) if args.templates_db else None
    report = search_targets(queries, args.db, args.out, settings=settings, workers=args.workers,
                            batch_size=args.batch_size, progress=not args.no_progress,
                            force=args.force, failed=rejected)
    c = report.counts()
    print(f"protdp msa search: {len(queries) + len(rejected)} targets x {len(report.databases)} "
          f"database(s): {c.get('searched', 0)} searched, {c.get('skipped', 0)} already done, "
          f"{c.get('error', 0)} rejected; summary: {report.summary_path}")
    if args.templates_db:
        rejected += search_templates_for(queries, args, args.out, *templates)
    if args.format == "colabfold":
        rejected += _export_colabfold(args)
    for q, why in rejected:
        print(f"  rejected: {why}", file=sys.stderr)
    return 1 if rejected and not queries else 0


if __name__ == "__main__":
    sys.exit(main())
