"""Prediction files in the formats downstream tools parse (AlphaFold, AFDB, ColabFold).

In each prediction folder (see `layout`), for every (model, seed) name N (`model_names`), rank
K (0-based; ColabFold's NNN = K + 1):
- AlphaFold (`run_alphafold.py` v2.3): `unrelaxed_N.pdb|.cif`, `ranked_K.pdb|.cif`;
  `confidence_N.json` ({"residueNumber", "confidenceScore" (2 decimals), "confidenceCategory"
  D/L/M/H}); `pae_N.json` (AFDB's list form, 1 decimal, `max_predicted_aligned_error` the
  head's largest bin centre, 31.75 Å); `ranking_debug.json` ({"plddts"|"iptm+ptm": {...},
  "ptm": {...}[, "iptm": {...}], "order": [...]}, full floats; ptm / iptm as AlphaPulldown
  adds them); `timings.json` ({"features": s, "process_features_N": s,
  "predict_and_compile_N": s, ...; with --relax "relax_N"}); complexes
  `msas/chain_id_map.json` ({chain id: {"description", "sequence"}});
- `result_N.npz`: AlphaFold's slim result keys (`plddt`, `predicted_aligned_error`,
  `max_predicted_aligned_error`, `ptm`, `ranking_confidence`, `num_recycles`; the distogram as
  `distogram_logits` / `distogram_bin_edges` only with --save-distogram; complexes `iptm`,
  `chain_pair_iptm`) in a numpy file that loads without pickle;
- ColabFold (`batch.py`): `<name>_scores_rank_NNN_<tag>.json` (`plddt`, `pae` 2 decimals,
  `max_pae` = the matrix maximum, `ptm`, `iptm`) beside `<name>_unrelaxed_rank_NNN_<tag>.pdb`,
  tag `<model type>_N` (`alphafold2_ptm_model_3_seed_000`); `<name>_predicted_aligned_error_v1.json`
  of the top model ({"predicted_aligned_error", "max_predicted_aligned_error"} = its scores'
  `pae`, `max_pae`); `log.txt` (`colabfold_log`);
- AFDB: `AF-<name>-F1-predicted_aligned_error_v4.json` (the list form, as pae_N.json, of the
  top model; a complex adds each chain's residue range, `chains`).
The batch `summary.csv` has one line per (target, model, seed) prediction (`max_pae` the
matrix maximum, `model_name` the weights'); for a complex also its ipTM and (on the
top-ranked line) the chain-pair ipTM, `A-B:0.8123 A-C:...`, and the best chain pair's ipSAE
(`A-B:0.812345`) and pDockQ2 (issue 43).
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from protdp.fileio import atomic_write_bytes
from protdp.inference.json_text import JsonMatrix, compact_json
from protdp.inference.writers import printable, write_json

SUMMARY_CSV_COLUMNS = ("id", "model", "seed", "rank", "length", "msa_depth", "mean_plddt", "ptm",
                       "max_pae", "recycles", "seconds", "route", "failure_reason", "iptm",
                       "chain_pair_iptm", "ipsae", "pdockq2", "model_name")


def write_result_npz(path: Path, pred: dict, conf: float, max_pae: float | None,
                     save_distogram: bool, distogram_edges: np.ndarray | None) -> Path:
    """The slim result file (AlphaFold's key names), atomically."""
    arrays = {"plddt": np.asarray(pred["plddt"], np.float32),
              "ranking_confidence": np.float32(conf),
              "num_recycles": np.int32(pred["num_recycles"])}
    if pred.get("pae") is not None:
        arrays["predicted_aligned_error"] = np.asarray(pred["pae"], np.float32)
        arrays["max_predicted_aligned_error"] = np.float32(max_pae)
        arrays["ptm"] = np.float32(pred["ptm"])
    if pred.get("iptm") is not None:           # AlphaFold-Multimer's result keys
        arrays["iptm"] = np.float32(pred["iptm"])
        arrays["chain_pair_iptm"] = np.asarray(pred["chain_pair_iptm"], np.float32)
    if save_distogram and pred.get("distogram_logits") is not None:
        arrays["distogram_logits"] = np.asarray(pred["distogram_logits"], np.float32)
        arrays["distogram_bin_edges"] = np.asarray(distogram_edges, np.float32)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return path


PAE_JSON_DECIMALS = 1
"""Decimals of the PAE in the JSON files (the AFDB PAE file, scores.json): AlphaFold's
`confidence.pae_json` rounds `pae.astype(np.float64)` to 1 decimal ("floats to 1 decimal
place, whereas AFDB returns integer values"); rounding in float64 leaves no float32 noise
(3.1400001049041748) in the written decimals."""
COLABFOLD_PAE_DECIMALS = 2
"""Decimals of the PAE in ColabFold's scores JSON (its `np.around(pae, 2)`)."""
TOP_PAE_JSON = "pae_json"
"""Key under which the top-ranked prediction keeps its `pae_json_values` (`top_pae_json`)."""


def pae_json_values(pae: np.ndarray, decimals: int = PAE_JSON_DECIMALS) -> JsonMatrix:
    """The PAE [L, L] (Å) as JSON lists, rounded as AlphaFold's `pae_json` does (in float64),
    encoded once however many files hold it (`json_text.JsonMatrix`)."""
    return JsonMatrix.rounded(pae, decimals)


def top_pae_json(pred: dict) -> JsonMatrix:
    """The top-ranked prediction's `pae_json_values`, converted once and kept in `pred`: its
    `pae_<m>.json`, the AFDB file and scores.json hold the same values (the first two the
    same text). Only the top model's is kept (L = 2000: ~130 MB of Python floats)."""
    if pred.get(TOP_PAE_JSON) is None:
        pred[TOP_PAE_JSON] = pae_json_values(pred["pae"])
    return pred[TOP_PAE_JSON]


def afdb_pae(pae: np.ndarray | JsonMatrix, max_pae: float,
             chains: list[tuple[str, str]] | None = None) -> list:
    """AFDB / AlphaFold PAE JSON document (`confidence.pae_json`: a one-element list, values
    `pae_json_values` (given, or converted from the array), `max_predicted_aligned_error` the
    largest value the head can predict, 31.75 Å for AlphaFold's bins); a complex adds `chains`,
    each chain's [start, end) residue range (0-based, `protdp.complex.outputs.chain_ranges`)."""
    values = pae if isinstance(pae, JsonMatrix) else pae_json_values(pae)
    doc = {"predicted_aligned_error": values,
           "max_predicted_aligned_error": float(max_pae)}
    if chains:
        from protdp.complex.outputs import chain_ranges
        doc["chains"] = chain_ranges(chains)
    return [doc]


def confidence_category(score: float) -> str:
    """AlphaFold's pLDDT category (`confidence._confidence_category`): D(isordered) < 50 <=
    L(ow) < 70 <= M(edium) < 90 <= H(igh)."""
    return "D" if score < 50 else "L" if score < 70 else "M" if score < 90 else "H"


def confidence_doc(plddt: np.ndarray) -> dict:
    """AlphaFold's `confidence_<model>.json` (`confidence.confidence_json`)."""
    scores = [round(float(v), 2) for v in np.asarray(plddt, np.float64)]
    return {"residueNumber": list(range(1, len(scores) + 1)), "confidenceScore": scores,
            "confidenceCategory": [confidence_category(v) for v in scores]}


def matrix_max_pae(pred: dict) -> float | None:
    """The largest value of the predicted PAE matrix (ColabFold's `max_pae`, summary.csv's)."""
    return None if pred.get("pae") is None else float(np.max(np.asarray(pred["pae"],
                                                                         np.float64)))


def colabfold_scores(pred: dict) -> dict:
    """ColabFold's `<n>_scores_rank_NNN_<tag>.json`: pLDDT and PAE to 2 decimals, `max_pae`
    the matrix maximum (`pae.max()`), pTM / ipTM (4 decimals, as scores.json)."""
    doc = {"plddt": np.round(np.asarray(pred["plddt"], np.float64), 2).tolist()}
    if pred.get("pae") is not None:
        # ColabFold's 2 decimals, rounded in float64 (float32 would print its noise)
        doc.update(max_pae=matrix_max_pae(pred),
                   pae=pae_json_values(pred["pae"], COLABFOLD_PAE_DECIMALS),
                   ptm=round(float(pred["ptm"]), 4))
    if pred.get("iptm") is not None:            # ColabFold's multimer scores
        doc["iptm"] = round(float(pred["iptm"]), 4)
    return doc


def colabfold_pae(scores: dict) -> dict:
    """ColabFold's `<n>_predicted_aligned_error_v1.json` of the top-ranked model: its scores'
    `pae` and `max_pae` under the AFDB key names, one object (not AFDB's list): the same
    `JsonMatrix`, so its text is encoded once for both files."""
    return {"predicted_aligned_error": scores["pae"],
            "max_predicted_aligned_error": scores["max_pae"]}


def afdb_pae_name(name: str) -> str:
    """The AFDB's own PAE file name (`AF-<id>-F1-predicted_aligned_error_v4.json`)."""
    return f"AF-{name}-F1-predicted_aligned_error_v4.json"


def colabfold_name(name: str, kind: str, rank: int, tag: str, ext: str) -> str:
    """`<n>_<kind>_rank_NNN_<tag>.<ext>` (ColabFold's file names, rank 1-based)."""
    return f"{name}_{kind}_rank_{rank:03d}_{tag}.{ext}"


def write_af_files(folder: Path, name: str, preds: dict[str, dict], order: list[str],
                   ranking_debug: dict, timings: dict, max_pae: float | None, *,
                   save_distogram: bool, distogram_edges: np.ndarray | None,
                   chains: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Everything but the structures; returns {kind: file name} of the files written.
    `max_pae`: the PAE head's largest bin centre (AlphaFold's `max_predicted_aligned_error`)."""
    files = {"ranking_debug": write_json(folder / "ranking_debug.json", ranking_debug).name,
             "timings": write_json(folder / "timings.json", timings).name}
    for k, n in enumerate(order):
        files.update(_write_model_files(folder, name, k, n, preds[n], max_pae,
                                        (save_distogram, distogram_edges), chains))
    from protdp.inference.colabfold_log import write_colabfold_log
    files["log"] = write_colabfold_log(folder, name, len(preds[order[0]]["plddt"]), preds,
                                       order)
    return files


def _write_model_files(folder: Path, name: str, k: int, n: str, p: dict,
                       max_pae: float | None, distogram: tuple, chains) -> dict[str, str]:
    """The files of the prediction `n` ranked `k` (0-based); the top-ranked one's also
    ColabFold's `_predicted_aligned_error_v1.json` and the AFDB file. Its PAE matrices live
    as long as this call, but the top model's 1-decimal one (`top_pae_json`: scores.json's)."""
    from protdp.inference.ranking import ranking_confidence
    files = {f"result_{n}": write_result_npz(folder / f"result_{n}.npz", p,
                                             ranking_confidence(p), max_pae, *distogram).name,
             f"confidence_{n}": _write_compact(folder / f"confidence_{n}.json",
                                               confidence_doc(p["plddt"])).name}
    if p.get("pae") is not None:      # the top model's values also go to AFDB's file
        files[f"pae_{n}"] = _write_compact(folder / f"pae_{n}.json", afdb_pae(
            top_pae_json(p) if k == 0 else p["pae"], max_pae)).name
    scores = colabfold_scores(p)
    files[f"scores_rank_{k + 1:03d}"] = write_json(
        folder / colabfold_name(name, "scores", k + 1, p.get("colabfold_tag", n), "json"),
        scores).name
    if k == 0 and "pae" in scores:
        files["pae_json"] = write_json(folder / f"{name}_predicted_aligned_error_v1.json",
                                       colabfold_pae(scores)).name
        files["afdb_pae_json"] = _write_compact(folder / afdb_pae_name(name),
                                                afdb_pae(top_pae_json(p), max_pae,
                                                         chains)).name
    return files


def _write_compact(path: Path, doc) -> Path:
    """AlphaFold's / AFDB's compact JSON (no spaces), written atomically."""
    return atomic_write_bytes(path, compact_json(doc).encode())


def write_summary_csv(path: Path, rows: list[dict]) -> Path:
    """OUT/summary.csv: one line per (target, model, seed) prediction or failed target."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SUMMARY_CSV_COLUMNS)
    for row in sorted(rows, key=lambda r: r["index"]):
        members = row.get("ensemble") or [None]
        for m in members:
            m = m or {}
            w.writerow([printable(str(row["target"])), m.get("model", ""), m.get("seed", ""),
                        m.get("rank", ""), _fmt(row.get("length")), _fmt(row.get("msa_depth")),
                        _fmt(m.get("mean_plddt", row.get("mean_plddt"))),
                        _fmt(m.get("ptm", row.get("ptm"))), _fmt(m.get("max_pae")),
                        _fmt(m.get("recycles")), _fmt(m.get("seconds")), row["route"],
                        printable(row.get("detail", "")) if row["route"] == "rejected" else "",
                        _fmt4(m.get("iptm")), _pairs(row.get("chain_pair_iptm")) if
                        m.get("rank") in (1, None) else "", *_best_interface(row, m),
                        m.get("model_name") or ""])
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(buf.getvalue())
    os.replace(tmp, path)
    return path


def _best_interface(row: dict, member: dict) -> tuple[str, str]:
    """The top model's best chain pair (max-row ipSAE) as `A-B:0.812345` and its pDockQ2."""
    best = row.get("best_interface") if member.get("rank") in (1, None) else None
    if not best:
        return "", ""
    return f"{best['chain_1']}-{best['chain_2']}:{best['ipsae']:.6f}", _fmt4(best["pdockq2"])


def _fmt4(v) -> str:
    return "" if v is None or not np.isfinite(v) else f"{v:.4f}"


def _pairs(matrix: dict | None) -> str:
    """The top model's chain-pair ipTM of a complex as `A-B:0.8123 ...` (each pair once)."""
    if not matrix:
        return ""
    ids = list(matrix)
    return " ".join(f"{a}-{b}:{_fmt4(matrix[a][b])}" for i, a in enumerate(ids)
                    for b in ids[i + 1:])


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.2f}" if np.isfinite(v) else ""
    return str(v)
