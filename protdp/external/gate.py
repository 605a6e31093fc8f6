"""Other tools' predictions through protdp's gate and review queue (issue 43, item 5).

Each target found (`discover`) is read (`protdp.interface.readers`), scored per chain pair
(`protdp.interface`), routed by the same `route` as protdp's own predictions, and written to
`OUT/<target>/`: a copy of the structure and of the PAE file (the exact bytes the queue binds
and a reviewer sees) and our `scores.json` (pLDDT, ipTM / pTM as the tool reported them, chain
ranges, interface PAE, `interface_scores`, the PAE, the gate decision). Flagged targets are
enqueued with those files. A malformed prediction is one row naming its file; the rest go on.

The gate's MSA-depth and training-crop checks do not apply (the tool's MSA and training are
unknown); every other check does, including low_iptm when the tool's ipTM is unknown
(AlphaFold2 keeps it only in its pickle, which protdp never opens).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from protdp.data.residues import THREE_TO_ONE
from protdp.errors import InputError, ProtdpError
from protdp.external.discover import Found, discover
from protdp.fileio import atomic_write_bytes, atomic_write_json, read_json_object
from protdp.gating import band_of
from protdp.gating.route import route
from protdp.interface.complex import best_interface
from protdp.interface.readers import Prediction, read_prediction
from protdp.interface.table import prediction_rows

SUMMARY_COLUMNS = ("target", "status", "route", "reasons", "best_pair", "ipsae", "detail")
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _read_once(found: Found) -> dict[Path, bytes]:
    """The structure's and PAE file's bytes, read once: what is hashed, copied and bound."""
    return {p: p.read_bytes() for p in (found.structure, found.pae)}


def _unchanged(blobs: dict[Path, bytes]) -> None:
    """After scoring: the files still hold the bytes that are copied (else the scores could be
    of other bytes than the ones a reviewer is shown)."""
    for path, data in blobs.items():
        if path.read_bytes() != data:
            raise InputError("changed while it was being gated; run the gate again", path=path)


def _summary_numbers(found: Found) -> dict:
    """ipTM / pTM the tool reported (AF3 summary, Boltz confidence; ColabFold's scores JSON)."""
    path = found.extra.get("summary") or (found.pae if found.pae.suffix == ".json" else None)
    if path is None:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        raise InputError("not a readable JSON file", path=path) from None
    doc = doc if isinstance(doc, dict) else {}
    return {k: float(doc[k]) for k in ("iptm", "ptm") if isinstance(doc.get(k), (int, float))
            and not isinstance(doc.get(k), bool) and np.isfinite(doc[k])}


def _alphafold2_plddt(found: Found, pred: Prediction) -> Prediction:
    """AlphaFold 2.3's pLDDT from confidence_<model>.json (`confidenceScore`)."""
    from dataclasses import replace

    path = found.extra.get("confidence")
    if path is None:
        raise InputError(f"no confidence_<model>.json beside {found.pae.name} (pLDDT)",
                         path=found.pae.parent)
    values = read_json_object(path, "AlphaFold confidence JSON").get("confidenceScore")
    plddt = np.asarray(values, dtype=float) if isinstance(values, list) else np.zeros(0)
    if plddt.shape != pred.plddt.shape or not np.all(np.isfinite(plddt)):
        raise InputError(f"confidenceScore must be {len(pred.plddt)} finite values",
                         path=path, field="confidenceScore")
    return replace(pred, plddt=plddt, cb_plddt=plddt)


def chain_ranges(chain_ids: np.ndarray, path: Path) -> list[dict]:
    """[{chain_id, start, end, length}] of contiguous chains in residue order."""
    out = []
    for k, c in enumerate(chain_ids.tolist()):
        if out and out[-1]["chain_id"] == c:
            out[-1]["end"], out[-1]["length"] = k + 1, out[-1]["length"] + 1
        elif any(r["chain_id"] == c for r in out):
            raise InputError(f"chain {c} is not contiguous in residue order", path=path)
        else:
            out.append({"chain_id": c, "start": k, "end": k + 1, "length": 1})
    return out


def external_scores(found: Found, source: str, pred: Prediction, policy,
                    blobs: dict[Path, bytes]) -> dict:
    """Our scores.json of one external prediction, gate decision included."""
    res = pred.residues
    chains = chain_ranges(res.chain_ids, found.structure)
    ids = [c["chain_id"] for c in chains]
    rows = prediction_rows(pred, 10.0, 10.0)
    cross = res.chain_ids[:, None] != res.chain_ids[None, :]                   # [N, N]
    member = {c: res.chain_ids == c for c in ids}
    block = {a: {b: round(float(pred.pae[np.ix_(member[a], member[b])].mean()), 2)
                 for b in ids} for a in ids}
    reported = _summary_numbers(found)
    sequence = "".join(THREE_TO_ONE.get(n, "X") for n in res.residue_names.tolist())
    interface = {"iptm": reported.get("iptm"), "interface_pae": float(pred.pae[cross].mean()),
                 "interface_scores": rows}
    plddt = np.round(pred.plddt, 2)
    decision = route(plddt, length=len(plddt), msa_depth=policy.min_msa_depth,
                     training_crop=None, policy=policy, sequence=sequence, interface=interface)
    mean = decision.mean_plddt
    return {"target": found.target, "source": {
                "format": source, "pae_file": found.pae.name, "structure": found.structure.name,
                "sha256": {p.name: hashlib.sha256(b).hexdigest() for p, b in blobs.items()}},
            "sequence": sequence, "length": len(sequence), "plddt": plddt.tolist(),
            "mean_plddt": mean, "band": None if mean is None else band_of(mean),
            "afdb_bands": decision.afdb_bands, "very_low_fraction": decision.very_low_fraction,
            "ptm": reported.get("ptm"), "iptm": reported.get("iptm"), "chains": chains,
            "chain_pair_iptm": {a: {b: v if (v := pred.iptm.get((a, b), -1.0)) >= 0 else None
                                    for b in ids if b != a} for a in ids},
            "interface_pae": round(interface["interface_pae"], 2), "chain_pair_pae": block,
            "interface_scores": rows, "best_interface": best_interface(rows),
            "pae": np.round(pred.pae, 2).tolist(), "msa_depth": None,
            "route": decision.route, "reasons": decision.reasons, "details": decision.details,
            "gate": decision.to_dict()}


def _write_folder(out: Path, found: Found, scores: dict,
                  blobs: dict[Path, bytes]) -> dict[str, Path]:
    """OUT/<target>/: the structure and PAE file copied byte for byte, scores.json."""
    folder = out / SAFE_NAME.sub("_", found.target)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError("exists and is not a folder protdp made; refusing to write into it",
                         path=folder)
    folder.mkdir(parents=True, exist_ok=True)
    kind = "cif" if found.structure.suffix.lower() in (".cif", ".mmcif") else "pdb"
    paths = {kind: folder / f"model.{kind}", "pae": folder / f"pae{found.pae.suffix.lower()}"}
    atomic_write_bytes(paths[kind], blobs[found.structure])
    atomic_write_bytes(paths["pae"], blobs[found.pae])
    paths["scores"] = atomic_write_json(folder / "scores.json", scores)
    return paths


def gate_one(found: Found, source: str, out: Path, policy, enqueuer=None) -> dict:
    """One target -> its summary row (status "ok" or "error"); enqueues a flagged one."""
    row = {"target": found.target, "status": "error", "route": "", "reasons": "",
           "best_pair": "", "ipsae": "", "detail": found.problem or ""}
    if found.problem:
        return row
    try:
        blobs = _read_once(found)
        pred = read_prediction(found.pae, found.structure)
        if source == "alphafold2":
            pred = _alphafold2_plddt(found, pred)
        _unchanged(blobs)
        scores = external_scores(found, source, pred, policy, blobs)
        paths = _write_folder(out, found, scores, blobs)
    except (ProtdpError, ValueError, OSError) as exc:
        row["detail"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return row
    best = scores["best_interface"] or {}
    row.update(status="ok", route=scores["route"], reasons=",".join(scores["reasons"]),
               best_pair=f"{best.get('chain_1', '')}-{best.get('chain_2', '')}" if best else "",
               ipsae=f"{best['ipsae']:.6f}" if best else "",
               detail="; ".join(scores["details"].values()))
    if enqueuer is not None and scores["route"] == "needs_review":
        digest = scores["source"]["sha256"][found.structure.name][:16]
        row["review_item"] = enqueuer.enqueue(
            f"{source}:{found.target}:{digest}", found.target,
            {k: scores[k] for k in scores if k not in ("pae", "gate")},
            {k: str(p) for k, p in paths.items()}, scores["reasons"],
            details=scores["details"], actor="gate", rebind=True)  # copies just written
    return row


def gate_folder(root: str | Path, source: str, out: str | Path, policy,
                enqueuer=None) -> list[dict]:
    """Every target under `root` (see the module docstring) -> summary rows, also written to
    OUT/gate_summary.tsv."""
    root, out = Path(root), Path(out)
    if not root.is_dir():
        raise InputError("not a folder", path=root)
    found = discover(root, source)
    if not found:
        raise InputError(f"no {source} predictions found in this folder", path=root)
    out.mkdir(parents=True, exist_ok=True)
    rows = [gate_one(f, source, out, policy, enqueuer) for f in found]
    lines = ["\t".join(SUMMARY_COLUMNS)] + [
        "\t".join(str(r[k]).replace("\t", " ").replace("\n", " ") for k in SUMMARY_COLUMNS)
        for r in rows]
    atomic_write_bytes(out / "gate_summary.tsv", ("\n".join(lines) + "\n").encode())
    return rows
