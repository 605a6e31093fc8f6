"""A prediction's `scores.json`: the one place it is assembled (`prediction_scores`).

It holds the top-ranked model's per-residue pLDDT (2 decimals, the PDB B-factor's values),
pTM, PAE (`af_outputs.top_pae_json`: its pae_<m>.json's values, converted once), the MSA
numbers, the gate decision (route, reasons, details), and one `ensemble` entry per (model,
seed) prediction, best first: its AlphaFold weights name (`model_names`: `model_3_ptm`,
`model_1_multimer_v3`, `protdp_<sha>`), ColabFold tag, rank, mean pLDDT, pTM, ipTM, `max_pae`
(the PAE matrix maximum, as ColabFold's and summary.csv's), recycles, timing and memory. A
complex adds `complexes.complex_scores` (chains, ipTM, chain-pair matrices, interface PAE).
Other scores are added here, in `prediction_scores`, so that scores.json, the review item and
summary rows stay one record.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from protdp.gating import GateDecision, band_of
from protdp.inference.af_outputs import matrix_max_pae, top_pae_json


def ensemble_entries(preds: dict[str, dict], order: list[str]) -> list[dict]:
    """One summary per (model, seed) prediction, best first."""
    def entry(k: int, n: str) -> dict:
        p = preds[n]
        max_pae = matrix_max_pae(p)
        return {"name": n, "model_name": p.get("model_name"),
                "colabfold_tag": p.get("colabfold_tag"), "seed": p["seed"],
                # complexes' members carry no model_number: their position
                "model": p.get("model_number", p["model_index"] + 1),
                "rank": k + 1, "mean_plddt": round(float(np.mean(p["plddt"])), 2),
                "ptm": p.get("ptm"), "iptm": p.get("iptm"),
                "max_pae": None if max_pae is None else round(max_pae, 2),
                "recycles": p["num_recycles"], "seconds": p["seconds"],
                "chunk_size": p["chunk_size"], "oom_retries": p["oom_retries"],
                "predicted_peak_gib": p["predicted_peak_gib"], "early_stop": p["early_stop"],
                "checkpoint_sha256": p["checkpoint_sha256"]}
    return [entry(k, n) for k, n in enumerate(order)]


def prediction_scores(target, seq: str, preds: dict[str, dict], order: list[str],
                      decision: GateDecision, plddt: np.ndarray, finite_xyz: np.ndarray, *,
                      spread: dict | None, hits: list, msa_depth: int, coverage: list[int],
                      bf16: bool, built: dict | None) -> dict:
    """scores.json of one prediction (`target`: the `Target`; `plddt` [L] the top model's,
    rounded, NaN where it has no position; `built`: a complex's inputs or None)."""
    from protdp.inference.complexes import complex_scores

    top = preds[order[0]]
    mean = decision.mean_plddt
    scores = {
        "target": target.target_id, "file_name": target.file_name, "sequence": seq,
        "length": len(seq), "plddt": plddt, "mean_plddt": mean,
        "band": None if mean is None else band_of(mean),
        "afdb_bands": decision.afdb_bands, "very_low_fraction": decision.very_low_fraction,
        "ptm": top.get("ptm"), "pae": None if "pae" not in top else top_pae_json(top),
        "trunk_dtype": "bfloat16" if bf16 else "float32",
        "msa_depth": msa_depth, "msa_rows_used": top["msa_rows_used"],
        "msa_coverage": coverage, "num_recycles": top["num_recycles"],
        "nonfinite_residues": int((~finite_xyz).sum() + (~np.isfinite(top["plddt"])).sum()),
        "screening_hits": [dataclasses.asdict(h) for h in hits],
        "top_model": order[0], "model_name": top.get("model_name"),
        "ensemble": ensemble_entries(preds, order), "ensemble_spread": spread,
        "route": decision.route, "reasons": decision.reasons, "details": decision.details,
    }
    if built is not None:        # issue 32: the complex's chains and interface scores
        scores.update(complex_scores(built["chains"], top))
        if built["note"]:
            scores["details"] = {**scores["details"], "pairing": built["note"]}
    return scores
