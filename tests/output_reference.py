"""The prediction's JSON files written the way protdp wrote them before the PAE was converted
once (`protdp.inference.json_text`): every file rounded the PAE again, `.tolist()`-ed it
again and encoded it with json.dumps (indent=1 files through Python's pure-Python encoder).
The reference of tests/test_json_text.py (the files must be byte-identical) and the peer of
benchmarks/output_writing.py. Also a synthetic prediction ensemble both feed the writers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from protdp.fileio import atomic_write_bytes
from protdp.gating import GatePolicy
from protdp.gating.route import route
from protdp.inference.af_outputs import (afdb_pae_name, colabfold_name, confidence_doc,
                                         matrix_max_pae, write_result_npz)
from protdp.inference.colabfold_log import write_colabfold_log
from protdp.inference.ranking import rank, ranking_confidence
from protdp.inference.scores_json import prediction_scores
from protdp.inference.targets import Target
from protdp.inference.writers import round_plddt


def finite_or_none(obj):
    """NaN / Inf -> None, numpy -> Python, recursively (the writers' old `_finite_or_none`)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite_or_none(obj.tolist())
    if isinstance(obj, np.generic):
        return finite_or_none(obj.item())
    return obj


def write_json(path: Path, obj) -> Path:
    return atomic_write_bytes(path, json.dumps(finite_or_none(obj), indent=1, ensure_ascii=True,
                                               allow_nan=False).encode())


def write_compact(path: Path, doc) -> Path:
    return atomic_write_bytes(path, json.dumps(doc, separators=(",", ":")).encode())


def pae_values(pae, decimals: int = 1) -> list:
    return np.round(np.asarray(pae, np.float64), decimals).tolist()


def afdb_pae(pae, max_pae: float, chains=None) -> list:
    doc = {"predicted_aligned_error": pae_values(pae),
           "max_predicted_aligned_error": float(max_pae)}
    if chains:
        from protdp.complex.outputs import chain_ranges
        doc["chains"] = chain_ranges(chains)
    return [doc]


def colabfold_scores(pred: dict) -> dict:
    doc = {"plddt": np.round(np.asarray(pred["plddt"], np.float64), 2).tolist()}
    if pred.get("pae") is not None:
        doc.update(max_pae=matrix_max_pae(pred), pae=pae_values(pred["pae"], 2),
                   ptm=round(float(pred["ptm"]), 4))
    if pred.get("iptm") is not None:
        doc["iptm"] = round(float(pred["iptm"]), 4)
    return doc


def write_af_files(folder: Path, name: str, preds: dict, order: list, ranking_debug: dict,
                   timings: dict, max_pae: float, chains=None) -> None:
    """The old `af_outputs.write_af_files` (no distogram), each PAE file converting anew."""
    write_json(folder / "ranking_debug.json", ranking_debug)
    write_json(folder / "timings.json", timings)
    for k, n in enumerate(order):
        p = preds[n]
        write_result_npz(folder / f"result_{n}.npz", p, ranking_confidence(p), max_pae, False,
                         None)
        write_compact(folder / f"confidence_{n}.json", confidence_doc(p["plddt"]))
        if p.get("pae") is not None:
            write_compact(folder / f"pae_{n}.json", afdb_pae(p["pae"], max_pae))
        scores = colabfold_scores(p)
        write_json(folder / colabfold_name(name, "scores", k + 1, p["colabfold_tag"], "json"),
                   scores)
        if k == 0 and "pae" in scores:
            write_json(folder / f"{name}_predicted_aligned_error_v1.json",
                       {"predicted_aligned_error": scores["pae"],
                        "max_predicted_aligned_error": scores["max_pae"]})
            write_compact(folder / afdb_pae_name(name), afdb_pae(p["pae"], max_pae, chains))
    write_colabfold_log(folder, name, len(preds[order[0]]["plddt"]), preds, order)


def write_scores_json(path: Path, scores: dict, top: dict) -> None:
    """The old scores.json: the top model's PAE converted again for it."""
    write_json(path, {**scores, "pae": pae_values(top["pae"])})


def synthetic_preds(length: int, models: int = 2, seed: int = 0, nonfinite: bool = False,
                    iptm: bool = False) -> tuple[dict, list[str], dict]:
    """(preds, order best first, ranking_debug) of `models` fake predictions of `length`
    residues with every key the writers read; `nonfinite`: the last model's PAE holds NaN and
    Inf, its pLDDT a NaN."""
    rng = np.random.default_rng(seed)
    preds = {}
    for m in range(models):
        pae = (rng.random((length, length)) * 31.75).astype(np.float32)          # [L, L]
        plddt = (rng.random(length) * 100).astype(np.float32)                    # [L]
        if nonfinite and m == models - 1:
            pae[0, 1], pae[1, 0], plddt[2] = np.nan, np.inf, np.nan
        name = f"model_{m + 1}_ptm_seed_000"
        preds[name] = {
            "plddt": plddt, "pae": pae, "ptm": float(rng.random()), "seed": 0,
            "iptm": float(rng.random()) if iptm else None,
            "chain_pair_iptm": rng.random((2, 2)) if iptm else None,
            "num_recycles": 3, "seconds": 1.5, "model_index": m, "model_number": m + 1,
            "model_name": f"model_{m + 1}_ptm",
            "colabfold_tag": f"alphafold2_ptm_model_{m + 1}_seed_000", "chunk_size": None,
            "oom_retries": 0, "predicted_peak_gib": 0.1, "early_stop": None,
            "checkpoint_sha256": "0" * 64, "msa_rows_used": 1}
    order, ranking_debug = rank(preds)
    return preds, order, ranking_debug


def synthetic_scores(preds: dict, order: list[str], seq: str) -> dict:
    """scores.json's document of a synthetic ensemble (`prediction_scores`, the gate's route
    with the default policy, a monomer target `t1`)."""
    top = preds[order[0]]
    plddt = round_plddt(top["plddt"])
    decision = route(plddt, length=len(seq), msa_depth=1, training_crop=None,
                     policy=GatePolicy(), sequence=seq)
    return prediction_scores(Target(0, "t1", "t1", seq, 1, file_name="t1"), seq, preds, order,
                             decision, plddt, np.ones(len(seq), bool), spread=None, hits=[],
                             msa_depth=1, coverage=[1] * len(seq), bf16=False, built=None)
