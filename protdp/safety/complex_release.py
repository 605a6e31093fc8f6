"""Release checks of an AlphaFold-Multimer checkpoint (`protdp release` of a folder holding
`multimer_model.pt`: `protdp weights import` of *_multimer_v3.npz, or a `protdp train` run
fine-tuned on complexes, `protdp.train.complex`) on held-out complexes of a complex store
(`protdp.complex.store`).

Each held-out complex is predicted whole (no crop; each chain's first `max_msa_rows` MSA rows,
unpaired, as the trainer builds its examples: `protdp.complex.training.complex_example`; the
model's own recycles and in-model MSA sampling, seed 0) and scored against its structure:

- lDDT-Cα over all chains (Mariani et al. 2013; `protdp.metrics`), every residue pair of the
  complex within 15 Å in the true structure, intra- and inter-chain;
- interface lDDT-Cα: the same score restricted to inter-chain pairs (the "interface lDDT",
  ilDDT, of CASP15's assembly assessment: Ozden et al. 2023, Proteins 91:1616), None for a
  complex whose chains have no Cα pair within 15 Å;
- identical chains (copies of one entity) are matched to the true copies by the assignment
  that maximises the complex's lDDT-Cα (AlphaFold-Multimer's predictions name symmetric copies
  arbitrarily; AF-Multimer supplement §7.3 resolves the same ambiguity for the loss).

The confidences the gate reads for complexes are then judged against what they predict:
per-residue pLDDT against per-residue lDDT-Cα (the monomer checks, `release.judge_calibration`:
Spearman, ECE, AFDB bands), ipTM against the interface lDDT (mean absolute difference), and
the gate's complex thresholds (`GatePolicy.min_iptm`, `max_interface_pae`): no held-out complex
that they would accept may have an interface lDDT below `ReleasePolicy.min_interface_lddt`.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch

from protdp.errors import InputError
from protdp.inference.checkpoint import LoadedModel
from protdp.metrics import LDDT_CUTOFF, LDDT_THRESHOLDS, lddt_ca, per_residue_lddt_ca
from protdp.complex.training import CA, complex_example
from protdp.train.checkpointing import META, resolve_iteration_dir

MAX_CHAIN_MAPPINGS = 720      # copies permuted exhaustively up to this many assignments
TRUTH_KEYS = ("all_atom_positions", "all_atom_mask", "true_all_atom_positions",
              "true_all_atom_mask", "true_asym_id", "true_entity_id", "resolution", "crop_mode")


def training_meta(folder: str | Path) -> dict:
    """The run's newest checkpoint meta (config, data manifest) of a checkpoint fine-tuned on
    complexes (its `multimer_model.pt` is the EMA of that save); {} for imported weights."""
    folder = Path(folder)
    if not any(p.name.startswith("iter_") for p in folder.iterdir() if p.is_dir()):
        return {}
    meta_path = resolve_iteration_dir(folder) / META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable checkpoint meta ({exc})", path=meta_path) from None
    return meta if isinstance(meta, dict) else {}


# ------------------------------------------------------------------------------ metrics

def interface_lddt_ca(pred_ca, true_ca, mask, asym_id) -> float | None:
    """lDDT-Cα over inter-chain pairs only (module docstring): pred_ca / true_ca [L, 3],
    mask [L], asym_id [L] -> a fraction in [0, 1], None without an inter-chain pair < 15 Å."""
    pred, true = np.asarray(pred_ca, float), np.asarray(true_ca, float)
    m, asym = np.asarray(mask, float), np.asarray(asym_id)
    d_true = np.linalg.norm(true[:, None] - true[None], axis=-1)                  # [L, L]
    d_pred = np.linalg.norm(pred[:, None] - pred[None], axis=-1)
    scored = (d_true < LDDT_CUTOFF) & (asym[:, None] != asym[None]) & (m[:, None] * m[None] > 0)
    if not scored.any():
        return None
    diff = np.abs(d_true - d_pred)[scored]
    return float(np.mean([(diff < t).mean() for t in LDDT_THRESHOLDS]))


def _copy_blocks(asym_id: np.ndarray, entity_id: np.ndarray) -> dict[int, list[np.ndarray]]:
    """entity -> the residue indices of each of its copies (chains), in residue order."""
    out: dict[int, list[np.ndarray]] = {}
    for a in dict.fromkeys(asym_id.tolist()):
        idx = np.flatnonzero(asym_id == a)
        out.setdefault(int(entity_id[idx[0]]), []).append(idx)
    return out


def chain_mappings(asym_id, entity_id) -> list[np.ndarray]:
    """Residue orders of the truth [L] for every assignment of the true copies of each entity
    to the predicted ones (identity first); only the identity beyond MAX_CHAIN_MAPPINGS."""
    asym_id, entity_id = np.asarray(asym_id), np.asarray(entity_id)
    blocks = _copy_blocks(asym_id, entity_id)
    per_entity = [list(itertools.permutations(range(len(c)))) for c in blocks.values()]
    if int(np.prod([len(p) for p in per_entity])) > MAX_CHAIN_MAPPINGS:
        per_entity = [p[:1] for p in per_entity]
    orders = []
    for choice in itertools.product(*per_entity):
        order = np.arange(len(asym_id))
        for copies, perm in zip(blocks.values(), choice):
            for dst, src in zip(copies, perm):
                order[dst] = copies[src]
        orders.append(order)
    return orders


def score_complex(pred_ca, true_ca, mask, asym_id, entity_id) -> dict:
    """lDDT-Cα (global and per residue) and interface lDDT-Cα under the best copy mapping."""
    best = None
    for order in chain_mappings(asym_id, entity_id):
        score = lddt_ca(pred_ca, true_ca[order], mask[order])
        if best is None or score > best[0] + 1e-12:
            best = (score, order)
    score, order = best
    t, m = true_ca[order], mask[order]
    return {"lddt_ca": score, "per_residue": per_residue_lddt_ca(pred_ca, t, m), "mask": m,
            "interface_lddt": interface_lddt_ca(pred_ca, t, m, asym_id),
            "mapped": not np.array_equal(order, np.arange(len(order)))}


# ------------------------------------------------------------------------------ model run

def evaluate_complexes(loaded: LoadedModel, store, complex_ids: list[str], max_msa_rows: int,
                       device: str | torch.device = "cpu") -> list[dict]:
    """Predict each complex whole and score it (module docstring); per complex: the monomer
    calibration record ('plddt', 'true_lddt' on observed residues, 'mean_plddt', 'lddt_ca')
    plus 'interface_lddt', 'iptm', 'interface_pae', 'chains'."""
    from tqdm import tqdm

    from protdp.inference.complexes import run_complex_member

    out = []
    for cid in tqdm(complex_ids, desc="held-out complexes", unit="complex"):   # minutes each on CPU
        record = store.read(cid)
        x = complex_example(record, crop_size=store.length(cid), seed=0,
                            max_rows_per_chain=max_msa_rows)
        features = {k: v for k, v in x.items() if k not in TRUTH_KEYS}
        pred = run_complex_member(loaded.model, features, torch.device(device), seed=0,
                                  num_recycles=None)
        plddt, pred_ca = pred["plddt"].astype(float), pred["positions"][:, CA].astype(float)
        if not (np.isfinite(plddt).all() and np.isfinite(pred_ca).all()
                and np.isfinite(pred["iptm"])):
            raise InputError(f"non-finite prediction for complex '{cid}'", path=store.path)
        s = score_complex(pred_ca, x["all_atom_positions"][:, CA].astype(float),
                          x["all_atom_mask"][:, CA].astype(float), x["asym_id"], x["entity_id"])
        obs = s["mask"] > 0
        out.append({"family_id": cid, "complex_id": cid, "length": int(len(plddt)),
                    "chains": len(record["chains"]), "observed": int(obs.sum()),
                    "mean_plddt": float(plddt.mean()), "lddt_ca": s["lddt_ca"],
                    "interface_lddt": s["interface_lddt"], "copies_remapped": s["mapped"],
                    "iptm": float(pred["iptm"]), "ptm": float(pred["ptm"]),
                    "interface_pae": pred["interface_pae"],
                    "min_pair_ipsae": _weakest_ipsae(x, pred),                    # issue 43
                    "plddt": plddt[obs].round(3).tolist(),
                    "true_lddt": np.asarray(s["per_residue"])[obs].round(4).tolist()})
    return out


# ------------------------------------------------------------------------------ checks

def _weakest_ipsae(x: dict, pred: dict) -> float | None:
    """The complex's weakest chain-pair ipSAE (`protdp.interface`, what low_ipsae tests)."""
    from protdp.interface.complex import (chains_from_features, complex_interface_rows,
                                          weakest_pair_ipsae)

    chains = chains_from_features(x["asym_id"], x["aatype"])
    return weakest_pair_ipsae(complex_interface_rows(chains, pred["positions"], pred["plddt"],
                                                     pred["pae"]))


def gate_accepts(c: dict, gate) -> bool:
    """Whether the gate's complex checks (`protdp.gating.route`: low_iptm, uncertain_interface,
    low_ipsae) would pass this complex."""
    ipae, ipsae = c.get("interface_pae"), c.get("min_pair_ipsae")
    return (c["iptm"] >= gate.min_iptm and (ipae is None or ipae <= gate.max_interface_pae)
            and (ipsae is None or ipsae >= gate.min_ipsae))


def interface_checks(per_complex: list[dict], policy, gate, check, enough: bool, why: str
                     ) -> list[dict]:
    """interface_accuracy, iptm_calibration and gate_accepted_interfaces (module docstring);
    `check` builds one check entry (release._check)."""
    judged = [c for c in per_complex if c["interface_lddt"] is not None]
    if enough and not judged:
        enough, why = False, "no held-out complex has chains in contact (< 15 Å)"
    mean_i = float(np.mean([c["interface_lddt"] for c in judged])) if judged else None
    err = float(np.mean([abs(c["iptm"] - c["interface_lddt"]) for c in judged])) \
        if judged else None
    accepted = [c for c in judged if gate_accepts(c, gate)]
    bad = [c["complex_id"] for c in accepted if c["interface_lddt"] < policy.min_interface_lddt]
    gate_text = (f"gate min_iptm {gate.min_iptm:g}, max_interface_pae "
                 f"{gate.max_interface_pae:g} Å, min_ipsae {gate.min_ipsae:g} accepts "
                 f"{len(accepted)} of {len(judged)}")
    return [
        check("interface_accuracy", mean_i, policy.min_interface_lddt,
              "mean interface lDDT-Ca >=",
              enough and mean_i is not None and mean_i >= policy.min_interface_lddt, why),
        check("iptm_calibration", err, policy.max_iptm_error,
              "mean |ipTM - interface lDDT-Ca| <=",
              enough and err is not None and err <= policy.max_iptm_error, why),
        check("gate_accepted_interfaces", len(bad), 0,
              f"accepted with interface lDDT-Ca < {policy.min_interface_lddt:g} ==",
              enough and not bad, why or (f"{gate_text}; below: {bad[:10]}" if bad
                                          else gate_text))]


def complex_summary(per_complex: list[dict]) -> dict:
    """The record's per-complex figures (no per-residue vectors) and, reported but not judged
    (a rank correlation needs more complexes than a release usually holds out), Spearman of
    the gate's complex inputs with the interface lDDT-Cα (None below 3 complexes)."""
    from protdp.safety.calibration import spearman

    keys = ("complex_id", "length", "chains", "observed", "mean_plddt", "lddt_ca",
            "interface_lddt", "copies_remapped", "iptm", "ptm", "interface_pae")
    judged = [c for c in per_complex if c["interface_lddt"] is not None
              and c["interface_pae"] is not None]
    target = np.array([c["interface_lddt"] for c in judged])
    return {"per_complex": [{k: c[k] for k in keys} for c in per_complex],
            "spearman_with_interface_lddt": {
                "iptm": spearman(np.array([c["iptm"] for c in judged]), target),
                "interface_pae": spearman(np.array([c["interface_pae"] for c in judged]),
                                          target)}}
