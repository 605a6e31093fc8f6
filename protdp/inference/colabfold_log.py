"""ColabFold's `log.txt` of one prediction: what tools that take a folder for ColabFold's read
first (af_analysis finds the query, each model's tag, recycles, pLDDT, pTM, ipTM there).

ColabFold (`batch.py`, logging format `%(asctime)s %(message)s`) writes, per query:

    <time> Query 1/1: <jobname> (length <L>)
    <time> <tag> recycle=<r> pLDDT=<.3g> pTM=<.3g>[ ipTM=<.3g>][ tol=<.3g>]   (each recycle)
    <time> <tag> took <s>s (<r> recycles)
    <time> reranking models by '<plddt|multimer>' metric
    <time> rank_001_<tag> pLDDT=... pTM=...[ ipTM=...]
    <time> Done

protdp logs each model's final recycle only (the values its files hold; `tol` where the
Cα change was measured: monomers, from the 2nd pass), in prediction order, then the ranking.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from protdp.fileio import atomic_write_bytes

LOG_FILE = "log.txt"


def _scores(pred: dict, tol: bool = False) -> str:
    """ColabFold's ` pLDDT=.. pTM=.. ipTM=..[ tol=..]` (3 significant digits); `tol` the last
    recycle's Cα distance-matrix change (`recycling.ca_distance_change`) when it was measured."""
    line = f" pLDDT={float(np.mean(pred['plddt'])):.3g}"
    for key, label in (("ptm", "pTM"), ("iptm", "ipTM")):
        if pred.get(key) is not None:
            line += f" {label}={float(pred[key]):.3g}"
    changes = (pred.get("early_stop") or {}).get("ca_distance_change") or []
    if tol and changes and pred["num_recycles"] > 0:
        line += f" tol={float(changes[-1]):.3g}"
    return line


def colabfold_log(name: str, length: int, preds: dict[str, dict], order: list[str],
                  when: dt.datetime) -> str:
    """The log text (`preds` in prediction order, `order` best first)."""
    stamp = when.strftime("%Y-%m-%d %H:%M:%S,") + f"{when.microsecond // 1000:03d}"
    lines = [f"Query 1/1: {name} (length {length})"]
    for n, p in preds.items():
        tag = p.get("colabfold_tag", n)
        lines += [f"{tag} recycle={p['num_recycles']}{_scores(p, tol=True)}",
                  f"{tag} took {float(p['seconds']):.1f}s ({p['num_recycles']} recycles)"]
    multimer = all(p.get("iptm") is not None for p in preds.values())
    lines.append(f"reranking models by '{'multimer' if multimer else 'plddt'}' metric")
    lines += [f"rank_{k + 1:03d}_{preds[n].get('colabfold_tag', n)}{_scores(preds[n])}"
              for k, n in enumerate(order)]
    lines.append("Done")
    return "".join(f"{stamp} {line}\n" for line in lines)


def write_colabfold_log(folder: Path, name: str, length: int, preds: dict[str, dict],
                        order: list[str]) -> str:
    """`log.txt` in `folder`, atomically; returns its name."""
    text = colabfold_log(name, length, preds, order, dt.datetime.now(dt.timezone.utc))
    atomic_write_bytes(folder / LOG_FILE, text.encode())
    return LOG_FILE
