"""MSA search speed: protdp's streamed pyhmmer search vs HMMER's `jackhmmer` binary, side by side.

Same query set, same database file, same settings (AF2's: -N 1 -E/--incE 1e-4, F1/F2/F3
5e-4/5e-5/5e-7), same number of threads. The database is every real sequence of the MSAs in
../shared/data (gaps removed) plus the pyhmmer test proteome (~93k sequences), each with
shuffled decoys (tests/msa_fixtures.py; several rounds for the larger sizes), subsampled to
sizes doubling from 23k to 736k sequences to show how time and memory grow with the database.

Engines, each run as its own process (wall time, CPU time and peak RSS from wait4):
  jackhmmer   HMMER 3 binary, one process per query with --cpu THREADS (as AF2 runs it)
  protdp      `protdp msa search --search-workers THREADS`: all queries in one streamed pass
  pyhmmer     `pyhmmer.hmmer.jackhmmer(cpus=THREADS)`: pyhmmer's own API, whole database in RAM
The hit sets of protdp and jackhmmer are compared for every query and size. The largest database
is also searched as FASTA.gz (decompressed while streaming).
Results: benchmarks/results/msa_search.json.

    .venv/bin/python benchmarks/msa_search.py [--threads 2] [--sizes 23000 46000 ... 736000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from msa_fixtures import (FAMILIES, msa_sequences, proteome, stockholm_names,  # noqa: E402
                          write_fasta)
from protdp.msa import SearchSettings  # noqa: E402
from protdp.paths import data_root  # noqa: E402

QUERY_FAMILIES = ("102m_A", "2p90_A02", "T1055", "2qke_E", "5zyh_A", "T1001")

_PYHMMER_SCRIPT = """
import sys, pyhmmer
from pyhmmer.easel import Alphabet, SequenceFile
aa = Alphabet.amino()
threads, db, queries = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with SequenceFile(queries, digital=True, alphabet=aa) as f:
    qs = list(f)
with SequenceFile(db, digital=True, alphabet=aa) as f:
    targets = f.read_block()
opts = dict(E=1e-4, incE=1e-4, domE=10.0, incdomE=1e-3, F1=5e-4, F2=5e-5, F3=5e-7)
for q, res in zip(qs, pyhmmer.hmmer.jackhmmer(qs, targets, max_iterations=1, cpus=threads,
                                               **opts)):
    print(q.name, len(res.hits.included))
"""


def all_records(data_dir: Path, decoy_rounds: int = 1, seed: int = 0) -> tuple[list, list]:
    """(query family records, other records): real sequences, each with `decoy_rounds`
    shuffled decoys (more rounds make databases beyond the ~93k real sequences)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    fam, other = [], []
    sources = [(name, data_dir / FAMILIES[name], True) for name in QUERY_FAMILIES]
    sources += [(p.name.split(".")[0], p, False) for p in sorted(data_dir.glob("msa*/*.a3m"))]
    real = []
    for name, path, is_query_family in sources:
        for i, seq in enumerate(msa_sequences(path)):
            if seq not in seen:
                seen.add(seq)
                real.append((f"{name}|{i}", seq, is_query_family))
    real += [(f"bg|{name}", seq, False) for name, seq in proteome()]
    for label, seq, is_query_family in real:
        group = fam if is_query_family else other
        group.append((f"fam|{label}", seq))
        for r in range(decoy_rounds):
            letters = list(seq)
            rng.shuffle(letters)
            group.append((f"decoy{r}|{label}", "".join(letters)))
    rng.shuffle(other)
    return fam, other


# Linux counts the RSS a forked child had before exec (here: this big parent) in ru_maxrss, so
# every engine is started by this small launcher, whose own fork is small when it execs.
_LAUNCHER = """
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as fh:
    json.dump({"code": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime,
               "maxrss_kib": usage.ru_maxrss}, fh)
"""


class Child:
    """Run one engine process; wall time here, CPU time and peak RSS of that process alone."""

    @staticmethod
    def run(cmd: list[str], env=None) -> dict:
        with tempfile.NamedTemporaryFile(suffix=".json") as stats:
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", _LAUNCHER, stats.name, *cmd], env=env,
                                 capture_output=True)
            wall = time.perf_counter() - t0
            usage = json.loads(Path(stats.name).read_text())
        if res.returncode or usage["code"]:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed: {res.stderr.decode()[-2000:]}")
        return {"wall_s": round(wall, 3), "cpu_s": round(usage["cpu_s"], 3),
                "peak_rss_mib": round(usage["maxrss_kib"] / 1024, 1), "stdout": res.stdout.decode()}


def run_jackhmmer(queries: list[tuple[str, str]], db: Path, threads: int, work: Path) -> dict:
    """One jackhmmer process per query (AF2 style); times summed, RSS the max."""
    settings = SearchSettings()
    work.mkdir(parents=True, exist_ok=True)
    total = {"wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mib": 0.0}
    hits = {}
    for name, seq in queries:
        q = write_fasta(work / f"{name}.fasta", [(name, seq)])
        sto = work / f"{name}.jackhmmer.sto"
        r = Child.run(["jackhmmer", "-o", "/dev/null", "-A", str(sto), "--noali",
                       *settings.jackhmmer_args(threads), str(q), str(db)])
        total["wall_s"] += r["wall_s"]
        total["cpu_s"] += r["cpu_s"]
        total["peak_rss_mib"] = max(total["peak_rss_mib"], r["peak_rss_mib"])
        hits[name] = stockholm_names(sto)[1:]
    return {**{k: round(v, 3) for k, v in total.items()}, "hits": hits}


def run_protdp(queries_fasta: Path, db: Path, threads: int, out: Path, names: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = Child.run([sys.executable, "-m", "protdp.cli", "msa", "search", "--fasta",
                   str(queries_fasta), "--db", str(db), "--out", str(out), "--no-progress",
                   "--search-workers", str(threads), "--force"], env=env)
    from protdp.msa.database import database_name
    hits = {n: stockholm_names(out / n / "stockholm" / f"{database_name(db)}.sto")[1:]
            for n in names}
    r.pop("stdout")
    return {**r, "hits": hits}


def run_pyhmmer(queries_fasta: Path, db: Path, threads: int) -> dict:
    r = Child.run([sys.executable, "-c", _PYHMMER_SCRIPT, str(threads), str(db),
                   str(queries_fasta)])
    r.pop("stdout")
    return r


def measure(records: list, queries: list, qfasta: Path, work: Path, threads: int,
            gz: bool) -> dict:
    """All engines on one database size; hit sets compared, decoys counted."""
    work.mkdir(parents=True)
    names = [n for n, _ in queries]
    db = write_fasta(work / "db.fasta", records)
    row = {"sequences": len(records), "residues": sum(len(s) for _, s in records),
           "file_mib": round(db.stat().st_size / 2**20, 2)}
    row["jackhmmer"] = run_jackhmmer(queries, db, threads, work / "jackhmmer")
    row["protdp"] = run_protdp(qfasta, db, threads, work / "protdp", names)
    row["pyhmmer_in_memory"] = run_pyhmmer(qfasta, db, threads)
    ours, ref = row["protdp"].pop("hits"), row["jackhmmer"].pop("hits")
    row["hit_sets_identical"] = all(ours[n] == ref[n] for n in names)
    row["differences"] = {n: sorted(set(ours[n]) ^ set(ref[n]))[:10]
                          for n in names if ours[n] != ref[n]}
    row["hits"] = {n: len(h) for n, h in ours.items()}
    row["decoy_hits"] = sum(1 for n in names
                            for ln in (work / "protdp" / n / "db.a3m").read_text().splitlines()
                            if ln.startswith(">decoy"))
    for key in ("wall_s", "cpu_s"):
        row[f"ratio_{key}_jackhmmer_over_protdp"] = round(
            row["jackhmmer"][key] / row["protdp"][key], 3)
    if gz:
        gzdb = write_fasta(work / "db.fasta.gz", records)
        row["protdp_gz"] = run_protdp(qfasta, gzdb, threads, work / "protdp_gz", names)
        row["protdp_gz"].pop("hits")
        row["protdp_gz"]["file_mib"] = round(gzdb.stat().st_size / 2**20, 2)
    return row


def summarize(result: dict) -> dict:
    """How CPU time grows: log-log slope between the smallest and largest database, and the
    marginal CPU seconds per million residues between the two largest (fixed costs cancel)."""
    import math

    sizes = result["sizes"]
    if len(sizes) < 2:
        return result
    a, b, c = sizes[0], sizes[-2], sizes[-1]
    for eng in ("jackhmmer", "protdp", "pyhmmer_in_memory"):
        growth = math.log(c[eng]["cpu_s"] / a[eng]["cpu_s"])
        result[f"scaling_exponent_{eng}"] = round(growth / math.log(c["residues"] / a["residues"]),
                                                  3)
        result[f"marginal_cpu_s_per_mresidue_{eng}"] = round(
            (c[eng]["cpu_s"] - b[eng]["cpu_s"]) / ((c["residues"] - b["residues"]) / 1e6), 4)
    result["largest"] = {"sequences": c["sequences"], "residues": c["residues"],
                         "peak_rss_mib": {e: c[e]["peak_rss_mib"] for e in
                                          ("jackhmmer", "protdp", "pyhmmer_in_memory")},
                         "protdp_gz_peak_rss_mib": c.get("protdp_gz", {}).get("peak_rss_mib"),
                         "ratio_cpu_s_jackhmmer_over_protdp":
                             c["ratio_cpu_s_jackhmmer_over_protdp"],
                         "ratio_wall_s_jackhmmer_over_protdp":
                             c["ratio_wall_s_jackhmmer_over_protdp"]}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+",
                    default=[23_000, 46_000, 92_000, 184_000, 368_000, 736_000],
                    help="database sizes in sequences")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "msa_search.json"))
    args = ap.parse_args()
    assert shutil.which("jackhmmer"), "install HMMER (apt-get install hmmer)"
    data_dir = data_root()
    n_real = 95_000                      # ~93k real sequences: decoy rounds to reach the sizes
    fam, other = all_records(data_dir, decoy_rounds=max(1, -(-max(args.sizes) // n_real) - 1))
    members = {f: msa_sequences(data_dir / FAMILIES[f]) for f in QUERY_FAMILIES}
    queries = [(f, members[f][0]) for f in QUERY_FAMILIES]
    import pyhmmer
    hmmer = subprocess.run(["jackhmmer", "-h"], capture_output=True, text=True).stdout
    result = {"settings": SearchSettings().__dict__, "threads": args.threads,
              "queries": {n: len(s) for n, s in queries},
              "versions": {"pyhmmer": pyhmmer.__version__,
                           "jackhmmer": next(ln for ln in hmmer.splitlines() if "HMMER" in ln)},
              "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                          "note": "2 cores shared with other jobs: cpu_s is the steadier number"},
              "sizes": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        qfasta = write_fasta(work / "queries.fasta", queries)
        for size in sorted(args.sizes):
            records = fam + other[: max(0, size - len(fam))]   # query families always in
            if len(records) < size:
                raise SystemExit(f"only {len(records)} records for size {size}")
            row = measure(records, queries, qfasta, work / str(size), args.threads,
                          gz=size == max(args.sizes))
            print(json.dumps({k: v for k, v in row.items() if k != "differences"}), flush=True)
            result["sizes"].append(row)
    summarize(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
