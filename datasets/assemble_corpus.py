#!/usr/bin/env python3
"""Assemble a training corpus from public archives: PDB mmCIF files (wwPDB layout) and
precomputed MSAs (OpenProteinSet layout), with checksums, resume and a manifest that
`protdp data build --pairs` reads directly.

    python datasets/assemble_corpus.py all --out corpus/ --ids ids.txt
    python datasets/assemble_corpus.py all --out corpus/ --deposited-before 2021-09-30 \
        --max-resolution 3.0 --method "X-RAY DIFFRACTION" --limit 1000
    protdp data build --pairs corpus/pairs.tsv --out data.h5 --workers 8

Steps (`all` runs the three): `pdb` fetches <out>/mmcif/<id>.cif, `msas` fetches
<out>/msas/<id>_<chain>/<file> for the protein chains of those entries (or --chains), `manifest`
writes <out>/pairs.tsv (pair_id, msa_file, structure_file, chain; paths relative to it) for every
chain with a structure and at least one MSA. Every kept file is listed in <out>/checksums.sha256
(`cd corpus && sha256sum -c checksums.sha256`); a rerun skips files whose sha256 still matches
and resumes partial downloads (<file>.part, HTTP Range). Base URLs are options (http(s):// or
file://). What failed is in <out>/report.json; exit status 1 if anything failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import openproteinset as ops  # noqa: E402
import pdb_mmcif as pdb  # noqa: E402
from fetch import (ChecksumLog, FetchError, NotFound, fetch, read_sha256sums,  # noqa: E402
                   read_url_text, sha256_path)

MANIFEST = "pairs.tsv"
REPORT = "report.json"


def _url(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel


def _upstream_sums(source: str | None) -> dict[str, str]:
    if not source:
        return {}
    try:
        return read_sha256sums(read_url_text(source))
    except (OSError, ValueError, FetchError) as exc:
        raise ValueError(f"checksum list {source}: {exc}") from None


class Run:
    """Shared state of one invocation: checksum log, report, options."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = ChecksumLog(self.out)
        self.report = {"fetched": 0, "skipped": 0, "resumed": 0, "refetched_after_error": 0,
                       "missing": [], "failed": []}

    def record(self, kind: str, item: str, url: str, exc: Exception) -> None:
        key = "missing" if isinstance(exc, NotFound) else "failed"
        self.report[key].append({"kind": kind, "item": item, "url": url, "reason": str(exc)})

    def keep(self, got, dest: Path) -> None:
        """Log `dest` (its own sha256: for mmCIF the unpacked file) and count the fetch."""
        self.log.add(dest, got.sha256 if got.path == dest else sha256_path(dest))
        self.report["fetched"] += 1
        self.report["resumed"] += int(got.resumed)
        self.report["refetched_after_error"] += int(got.attempts > 1)

    def map(self, fn, items) -> None:
        with ThreadPoolExecutor(max_workers=self.args.workers) as pool:
            list(pool.map(fn, items))

    def finish(self) -> int:
        self.log.compact()
        path = self.out / REPORT
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.report, indent=1))
        os.replace(tmp, path)
        r = self.report
        print(f"fetched {r['fetched']} (resumed {r['resumed']}, retried "
              f"{r['refetched_after_error']}), already present {r['skipped']}, missing in the "
              f"archive {len(r['missing'])}, failed {len(r['failed'])}; report: {path}")
        for f in r["failed"][:20]:
            print(f"  failed {f['kind']} {f['item']}: {f['reason']}", file=sys.stderr)
        if not r["fetched"] and not r["skipped"] and (r["missing"] or r["failed"]):
            print("assemble_corpus: error: nothing was fetched (every file was missing or "
                  "failed; wrong --pdb-base / --msa-base?)", file=sys.stderr)
            return 1
        return 1 if r["failed"] else 0


# ---------------------------------------------------------------------------------- pdb step

def select_ids(args) -> list[str]:
    """Entry ids from --ids, else from the archive's entries.idx and the filters."""
    if args.ids:
        ids = pdb.read_id_list(Path(args.ids).read_text(), args.ids)
    else:
        index_url = _url(args.pdb_base, pdb.INDEX_PATH)
        entries = pdb.parse_entries_idx(read_url_text(index_url))
        if not entries:
            raise ValueError(f"{index_url}: no entries in the index")
        ids = pdb.select_entries(entries, deposited_after=args.deposited_after,
                                 deposited_before=args.deposited_before,
                                 max_resolution=args.max_resolution,
                                 methods=tuple(m.upper() for m in args.method))
    return ids[: args.limit] if args.limit else ids


def step_pdb(run: Run) -> None:
    args = run.args
    ids = select_ids(args)
    sums = _upstream_sums(args.pdb_checksums)
    (run.out / "mmcif").mkdir(exist_ok=True)

    def one(pid: str) -> None:
        cif = run.out / "mmcif" / f"{pid}.cif"
        if run.log.verified(cif):
            run.report["skipped"] += 1
            return
        rel = pdb.entry_path(pid)
        url = _url(args.pdb_base, rel)
        gz = run.out / "mmcif" / f".{pid}.cif.gz"
        try:
            got = fetch(url, gz, sha256=sums.get(rel), check=pdb.check_cif_gz,
                        retries=args.retries)
            pdb.unpack(gz, cif)
            gz.unlink()
            run.keep(got, cif)
        except (FetchError, OSError) as exc:
            run.record("mmcif", pid, url, exc)

    run.map(one, ids)
    print(f"pdb: {len(ids)} entries selected from {args.pdb_base}")


# ---------------------------------------------------------------------------------- msa step

def chains_of_corpus(run: Run) -> list[str]:
    """'<id>_<chain>' for every protein chain of every mmCIF file in the corpus."""
    cifs = sorted(p for p in (run.out / "mmcif").glob("*.cif") if run.log.verified(p))
    out: list[str] = []

    def one(cif: Path) -> list[str]:
        try:
            return [ops.chain_name(cif.stem, c) for c in ops.protein_chains(cif) if c]
        except Exception as exc:            # protdp InputError and parser errors: report
            run.record("chains", cif.name, str(cif), exc)
            return []

    with ThreadPoolExecutor(max_workers=run.args.workers) as pool:
        for names in pool.map(one, cifs):
            out += names
    return out


def step_msas(run: Run) -> None:
    args = run.args
    chains = (ops.read_chain_list(Path(args.chains).read_text(), args.chains) if args.chains
              else chains_of_corpus(run))
    sums = _upstream_sums(args.msa_checksums)
    jobs = [(c, f) for c in chains for f in args.msa_files]

    def one(job: tuple[str, str]) -> None:
        chain, name = job
        dest = run.out / "msas" / chain / name
        if run.log.verified(dest):
            run.report["skipped"] += 1
            return
        rel = ops.msa_path(chain, name)
        url = _url(args.msa_base, rel)
        try:
            run.keep(fetch(url, dest, sha256=sums.get(rel), check=ops.check_msa,
                           retries=args.retries), dest)
        except (FetchError, OSError) as exc:
            run.record("msa", f"{chain}/{name}", url, exc)

    run.map(one, jobs)
    print(f"msas: {len(chains)} chains x {len(args.msa_files)} files from {args.msa_base}")


# ----------------------------------------------------------------------------- manifest step

def step_manifest(run: Run) -> Path:
    """pairs.tsv: one row per (chain, MSA file), for chains with a structure and an MSA."""
    rows = []
    for chain_dir in sorted(p for p in (run.out / "msas").glob("*_*") if p.is_dir()):
        pid, _, chain = chain_dir.name.partition("_")
        cif = run.out / "mmcif" / f"{pid}.cif"
        if not run.log.verified(cif):
            continue
        for msa in sorted(chain_dir.iterdir()):
            if msa.is_file() and not msa.name.endswith(".part") and run.log.verified(msa):
                rows.append(f"{chain_dir.name}\t{msa.relative_to(run.out).as_posix()}\t"
                            f"mmcif/{cif.name}\t{chain}")
    path = run.out / MANIFEST
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("pair_id\tmsa_file\tstructure_file\tchain\n" + "".join(r + "\n" for r in rows))
    os.replace(tmp, path)
    print(f"manifest: {len(rows)} (chain, MSA) rows, "
          f"{len({r.split(chr(9))[0] for r in rows})} chains -> {path}")
    return path


# ------------------------------------------------------------------------------------ CLI

def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, got {text!r}") from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="assemble_corpus.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("step", choices=("all", "pdb", "msas", "manifest"))
    p.add_argument("--out", required=True, help="corpus folder")
    sel = p.add_argument_group("entries (pdb step)")
    sel.add_argument("--ids", help="file of PDB ids (or <id>_<chain>), one per line")
    sel.add_argument("--deposited-after", type=_date, help="YYYY-MM-DD (entries.idx)")
    sel.add_argument("--deposited-before", type=_date, help="YYYY-MM-DD (entries.idx)")
    sel.add_argument("--max-resolution", type=float, help="Angstrom; entries without one fail")
    sel.add_argument("--method", action="append", default=[],
                     help='experiment type, e.g. "X-RAY DIFFRACTION" (repeatable)')
    sel.add_argument("--limit", type=_positive, help="at most this many entries")
    src = p.add_argument_group("archives")
    src.add_argument("--pdb-base", default=pdb.DEFAULT_BASE,
                     help="root of a wwPDB-layout archive (%(default)s)")
    src.add_argument("--msa-base", default=ops.DEFAULT_BASE,
                     help="root of an OpenProteinSet-layout archive (%(default)s)")
    src.add_argument("--msa-files", nargs="+", default=list(ops.DEFAULT_FILES),
                     help="MSA files per chain (%(default)s)")
    src.add_argument("--chains", help="file of <id>_<chain> to fetch MSAs for (default: the "
                                      "protein chains of the corpus mmCIF files)")
    src.add_argument("--pdb-checksums", help="sha256sum list (archive-relative paths) to verify")
    src.add_argument("--msa-checksums", help="sha256sum list (archive-relative paths) to verify")
    run = p.add_argument_group("running")
    run.add_argument("--workers", type=_positive, default=8, help="parallel downloads")
    run.add_argument("--retries", type=int, default=3, help="retries per file (%(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.step in ("all", "pdb") and not args.ids and not (
            args.deposited_after or args.deposited_before or args.max_resolution or args.method
            or args.limit):
        print("assemble_corpus: error: give --ids or at least one filter (--deposited-before, "
              "--max-resolution, --method, --limit); refusing to fetch the whole PDB by "
              "accident", file=sys.stderr)
        return 2
    run = Run(args)
    try:
        if args.step in ("all", "pdb"):
            step_pdb(run)
        if args.step in ("all", "msas"):
            step_msas(run)
        if args.step in ("all", "manifest"):
            step_manifest(run)
    except (ValueError, OSError, FetchError) as exc:
        print(f"assemble_corpus: error: {exc}", file=sys.stderr)
        run.finish()
        return 2
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
