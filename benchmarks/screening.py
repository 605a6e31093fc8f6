"""Screening speed: exact k-mer vs phmmer (`protdp.data.screening.ScreeningList`) on a real
proteome — the 2,100-protein bacterial proteome that the pyhmmer wheel ships in its test data
(`pyhmmer/tests/data/seqs/938293.PRJEB85.HG003687.faa`).

The list is the shipped harmless demo list (ubiquitin, lysozyme) plus `--planted` proteins
taken from the proteome itself, so each mode must flag at least those (a recall check next to
the speed). Each mode screens the proteome one sequence at a time through the public API
(`ScreeningList.hits`), which is how the data filter and the predictor call it. As a peer, the
same phmmer search is also run the way pyhmmer is built to be used: all queries in one
`pyhmmer.hmmer.phmmer` call against a pre-digitised target block (what screening.py's phmmer
mode would cost with a batched API). Results: benchmarks/results/screening.json.

    .venv/bin/python benchmarks/screening.py [--phmmer-limit 400] [--planted 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.data.screening import ScreeningList, read_fasta  # noqa: E402


def proteome_path() -> Path:
    import pyhmmer
    return Path(os.path.dirname(pyhmmer.__file__)) / "tests/data/seqs/938293.PRJEB85.HG003687.faa"


def read_proteome(path: Path) -> list[tuple[str, str]]:
    """Prodigal FASTA: strip the stop '*' (read_fasta keeps letters only)."""
    return read_fasta(path)


class Timer:
    """Wall and CPU seconds (this machine is shared: CPU time is the steadier number)."""

    def __enter__(self):
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w0, time.process_time() - self.c0


def screen_all(screen: ScreeningList, seqs: list[tuple[str, str]]) -> tuple[Timer, list[str]]:
    with Timer() as t:
        flagged = [name for name, seq in seqs if screen.hits(seq)]
    return t, flagged


def _digitize(records, alphabet):
    import pyhmmer
    return [pyhmmer.easel.TextSequence(name=n.encode(), sequence=s).digitize(alphabet)
            for n, s in records]


def _name(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def batched_phmmer(entries: list[tuple[str, str]], seqs: list[tuple[str, str]],
                   evalue: float) -> tuple[Timer, list[str]]:
    """Each screened sequence is a phmmer query against the list (one call, list digitised once)."""
    import pyhmmer
    alphabet = pyhmmer.easel.Alphabet.amino()
    with Timer() as t:
        targets = pyhmmer.easel.DigitalSequenceBlock(alphabet, _digitize(entries, alphabet))
        flagged = [_name(top.query.name) for top in pyhmmer.hmmer.phmmer(
            _digitize(seqs, alphabet), targets, cpus=1, E=evalue)
            if any(hit.evalue <= evalue for hit in top)]
    return t, flagged


def list_as_query_phmmer(entries: list[tuple[str, str]], seqs: list[tuple[str, str]],
                         evalue: float) -> tuple[Timer, list[str]]:
    """The list entries are the phmmer queries and the batch to screen is the target database
    (a profile is built once per list entry; targets stream through the SIMD filters). E-values
    are then relative to the batch size instead of the list size."""
    import pyhmmer
    alphabet = pyhmmer.easel.Alphabet.amino()
    with Timer() as t:
        targets = pyhmmer.easel.DigitalSequenceBlock(alphabet, _digitize(seqs, alphabet))
        flagged = set()
        for top in pyhmmer.hmmer.phmmer(_digitize(entries, alphabet), targets, cpus=1, E=evalue):
            flagged.update(_name(hit.name) for hit in top if hit.evalue <= evalue)
    return t, sorted(flagged)


def _times(t: Timer, n: int, residues: int) -> dict:
    return {"seconds": t.wall, "cpu_seconds": t.cpu, "sequences_per_s": n / t.wall,
            "sequences_per_s_cpu": n / t.cpu, "residues_per_s_cpu": residues / t.cpu}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--planted", type=int, default=5, help="proteome proteins added to the list")
    ap.add_argument("--phmmer-limit", type=int, default=400,
                    help="screen only the first N sequences in per-sequence phmmer mode (slow)")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--evalue", type=float, default=1e-5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/screening.json"))
    args = ap.parse_args()

    proteome = read_proteome(proteome_path())
    step = max(1, len(proteome) // max(1, args.planted))
    planted = [proteome[i * step] for i in range(args.planted)]
    entries = read_fasta(ROOT / "configs/screening/demo_list.fasta") + planted
    planted_ids = {name for name, _ in planted}
    residues = sum(len(s) for _, s in proteome)

    results = {"proteome": {"file": proteome_path().name, "sequences": len(proteome),
                            "residues": residues},
               "list": {"entries": len(entries), "demo": len(entries) - len(planted),
                        "planted_from_proteome": sorted(planted_ids)},
               "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count()},
               "modes": {}}

    with Timer() as build:
        kmer = ScreeningList(entries, k=args.k, mode="kmer")
    t, flagged = screen_all(kmer, proteome)
    results["modes"]["kmer"] = {"k": args.k, "sequences": len(proteome), **_times(t, len(proteome), residues),
                                "index_build_seconds": build.wall,
                                "flagged": len(flagged),
                                "planted_recall": len(planted_ids & set(flagged)) / len(planted_ids)}

    sub = proteome[:args.phmmer_limit]
    sub_res = sum(len(s) for _, s in sub)
    ph = ScreeningList(entries, k=args.k, mode="phmmer", evalue=args.evalue)
    t, flagged = screen_all(ph, sub)
    in_sub = planted_ids & {n for n, _ in sub}
    results["modes"]["phmmer"] = {
        "evalue": args.evalue, "sequences": len(sub), **_times(t, len(sub), sub_res),
        "flagged": len(flagged),
        "planted_recall": (len(in_sub & set(flagged)) / len(in_sub)) if in_sub else None,
        "note": "per-sequence ScreeningList.hits (k-mer pass + one phmmer call per query that "
                "re-digitises the whole list)"}

    t, flagged_b = batched_phmmer(entries, sub, args.evalue)
    results["modes"]["phmmer_batched_peer"] = {
        "evalue": args.evalue, "sequences": len(sub), **_times(t, len(sub), sub_res),
        "flagged": len(flagged_b),
        "planted_recall": (len(in_sub & set(flagged_b)) / len(in_sub)) if in_sub else None,
        "note": "same searches, all queries in one pyhmmer.hmmer.phmmer call, list digitised once"}
    t, flagged_l = list_as_query_phmmer(entries, proteome, args.evalue)
    results["modes"]["phmmer_list_as_query_peer"] = {
        "evalue": args.evalue, "sequences": len(proteome), **_times(t, len(proteome), residues),
        "flagged": len(flagged_l),
        "planted_recall": len(planted_ids & set(flagged_l)) / len(planted_ids),
        "note": "list entries as phmmer queries, the screened batch as the target database"}
    m = results["modes"]
    cpu_rate = {k: v["sequences"] / v["cpu_seconds"] for k, v in m.items()}
    results["ratios_cpu"] = {
        "kmer_vs_phmmer_per_sequence": cpu_rate["kmer"] / cpu_rate["phmmer"],
        "phmmer_batched_vs_per_sequence": cpu_rate["phmmer_batched_peer"] / cpu_rate["phmmer"],
        "phmmer_list_as_query_vs_per_sequence": cpu_rate["phmmer_list_as_query_peer"] / cpu_rate["phmmer"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"proteome: {len(proteome)} sequences, {residues:,} residues; list {len(entries)} entries "
          f"({len(planted)} planted)")
    for name, r in m.items():
        print(f"  {name:<26} {r['sequences']:>5} seqs  wall {r['seconds']:8.2f} s  cpu "
              f"{r['cpu_seconds']:8.2f} s {r['sequences_per_s_cpu']:10.1f} seq/s(cpu)  flagged "
              f"{r['flagged']:>3}  planted recall {r['planted_recall']}")
    print("CPU-time ratios: " + ", ".join(f"{k} {v:.1f}x" for k, v in results["ratios_cpu"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
