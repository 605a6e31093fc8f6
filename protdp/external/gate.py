"""Other tools' predictions through protdp's gate and review queue (issue 43, item 5).

Each target found (`discover`) is read (`protdp.interface.readers`), scored per chain pair
(`protdp.interface`), routed by the same `route` as protdp's own predictions, and written to
`OUT/<folder>/`: a byte copy of every file that fed a number (the structure, the PAE file and
the siblings with pLDDT / ipTM / the ranking: `COPIES`; each read once, parsed, hashed and
copied from that one read, `protdp.interface.inputs`) and our `scores.json` (pLDDT, ipTM / pTM
as the tool reported them, chain ranges, interface PAE, `interface_scores`, the PAE, the gate
decision). Flagged targets are enqueued with all those files, so an approval binds every byte
behind the numbers and `protdp review verify` sees a change to any of them. A malformed
prediction is one row naming its file; the rest go on.

Folders (`folder_names`) are `safe_name(target)`, plus 10 hex of the SHA-256 of the target
and its PAE file's path under the input folder when two targets' names are equal ignoring case
(on a case-sensitive file system too, so a case-insensitive one gets the same names) or the
name is one of the gate's own files. A folder is written into only when it is new or its `MARKER`
names the same target, tool and input file (the gate's earlier run), never another folder.

The gate's MSA-depth and training-crop checks do not apply (the tool's MSA and training are
unknown); every other check does, including low_iptm when the tool's ipTM is unknown
(AlphaFold2 keeps it only in its pickle, which protdp never opens).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from protdp.data.residues import THREE_TO_ONE
from protdp.errors import InputError, ProtdpError
from protdp.external.discover import Found, discover, ranked_first
from protdp.fileio import atomic_write_bytes, atomic_write_json
from protdp.gating import band_of
from protdp.gating.route import route
from protdp.inference.writers import safe_name
from protdp.interface.complex import best_interface
from protdp.interface.inputs import InputBytes, read_input_bytes
from protdp.interface.readers import Prediction, read_prediction
from protdp.interface.table import prediction_rows
from protdp.text import printable

SUMMARY_COLUMNS = ("target", "status", "route", "reasons", "best_pair", "ipsae", "detail",
                   "folder", "best_chain_1", "best_chain_2")
SUMMARY_FILE = "gate_summary.tsv"
MARKER = "gate_source.json"        # {"target", "from", "origin"}: whose folder this is
# role of an input file -> (review file kind, copy name; None: model.<pdb|cif>, "." + suffix)
COPIES = {"structure": (None, "model"), "pae": ("pae", "pae."), "summary": ("summary",
          "summary.json"), "plddt": ("plddt", "plddt."), "ranking": ("ranking",
          "ranking_debug.json")}
COPY_NAMES = ("model.pdb", "model.cif", "pae.json", "pae.npz", "summary.json", "plddt.json",
              "plddt.npz", "ranking_debug.json")


def _origin(found: Found, root: Path) -> str:
    """The target's input file (its PAE file, else its ranking) relative to `root`, as text."""
    path = found.pae or found.siblings.get("ranking")
    if path is None:
        return found.target
    rel = Path(path).relative_to(root) if Path(path).is_relative_to(root) else Path(path)
    return rel.as_posix().encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def folder_names(found: list[Found], root: Path) -> list[str]:
    """OUT's folder of each target (see the module docstring): unique ignoring case and
    deterministic (a function of the targets' names and input paths)."""
    base = [safe_name(f.target) for f in found]
    taken = Counter(b.casefold() for b in base)
    reserved = (SUMMARY_FILE, "review_queue.sqlite")
    digests = [hashlib.sha256(f"{f.target}\0{_origin(f, root)}".encode()).hexdigest()
               for f in found]
    names = [f"{b}-{d[:10]}" if taken[b.casefold()] > 1 or b.casefold().startswith(reserved)
             else b for b, d in zip(base, digests)]
    again = Counter(n.casefold() for n in names)          # "x-<10 hex>" was also a target
    return [f"{b}-{d}" if again[n.casefold()] > 1 else n for n, b, d in zip(names, base, digests)]


def _plddt_present(found: Found, pred: Prediction) -> None:
    """The gate decides on pLDDT: a prediction whose files hold none is an error row."""
    if "plddt" in pred.missing:
        where = found.siblings.get("plddt") or found.pae
        raise InputError("no per-residue pLDDT in the files (for Boltz a plddt_<t>_model_0.npz "
                         "beside the PAE file; AlphaFold 3 atom_plddts)", path=where)


def _ranking_agrees(found: Found, inputs: InputBytes) -> None:
    """AlphaFold2: the ranking bound to the item names the model that was scored."""
    path = found.siblings.get("ranking")
    if path is not None and ranked_first(inputs.read(path, "ranking"), path) != found.model:
        raise InputError("changed while it was being gated; run the gate again", path=path)


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
                    inputs: InputBytes) -> dict:
    """Our scores.json of one external prediction, gate decision included."""
    res = pred.residues
    chains = chain_ranges(res.chain_ids, found.structure)
    ids = [c["chain_id"] for c in chains]
    rows = prediction_rows(pred, 10.0, 10.0)
    cross = res.chain_ids[:, None] != res.chain_ids[None, :]                   # [N, N]
    member = {c: res.chain_ids == c for c in ids}
    block = {a: {b: round(float(pred.pae[np.ix_(member[a], member[b])].mean()), 2)
                 for b in ids} for a in ids}
    reported = pred.reported                   # parsed once, from the bytes bound below
    pair_known = "chain_pair_iptm" not in pred.missing
    sequence = "".join(THREE_TO_ONE.get(n, "X") for n in res.residue_names.tolist())
    interface = {"iptm": reported.get("iptm"), "interface_pae": float(pred.pae[cross].mean()),
                 "interface_scores": rows}
    plddt = np.round(pred.plddt, 2)
    decision = route(plddt, length=len(plddt), msa_depth=policy.min_msa_depth,
                     training_crop=None, policy=policy, sequence=sequence, interface=interface)
    mean = decision.mean_plddt
    return {"target": found.target, "source": {
                "format": source, "pae_file": found.pae.name, "structure": found.structure.name,
                "files": {f.role: f.path.name for f in inputs.files.values()},
                "sha256": {f.path.name: f.sha256 for f in inputs.files.values()}},
            "sequence": sequence, "length": len(sequence), "plddt": plddt.tolist(),
            "mean_plddt": mean, "band": None if mean is None else band_of(mean),
            "afdb_bands": decision.afdb_bands, "very_low_fraction": decision.very_low_fraction,
            "ptm": reported.get("ptm"), "iptm": reported.get("iptm"), "chains": chains,
            "chain_pair_iptm": {a: {b: v if pair_known and (v := pred.iptm.get((a, b), -1.0))
                                    >= 0 else None for b in ids if b != a} for a in ids},
            "interface_pae": round(interface["interface_pae"], 2), "chain_pair_pae": block,
            "interface_scores": rows, "best_interface": best_interface(rows),
            "pae": np.round(pred.pae, 2).tolist(), "msa_depth": None,
            "route": decision.route, "reasons": decision.reasons, "details": decision.details,
            "gate": decision.to_dict()}


def claim_folder(folder: Path, identity: dict) -> None:
    """Make `folder` for this target, or accept it when the gate made it for the same target,
    tool and input file (its `MARKER`; a folder of the gate before markers: its scores.json's
    target and format); anything else is refused, never written into."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError("exists and is not a folder protdp made; refusing to write into it",
                         path=folder)
    try:
        folder.mkdir()
    except FileExistsError:
        if _folder_identity(folder, identity) != identity:
            raise InputError(f"exists and is not the folder protdp gate made for this target "
                             f"({identity['origin']}); refusing to write into it",
                             path=folder) from None
    atomic_write_json(folder / MARKER, identity)


def _folder_identity(folder: Path, identity: dict) -> dict | None:
    """The identity an existing folder records (None: not one the gate made)."""
    try:
        if (folder / MARKER).exists() or (folder / MARKER).is_symlink():
            doc = json.loads(read_input_bytes(folder / MARKER, folder, 2**20))
            return doc if isinstance(doc, dict) else None
        old = json.loads(read_input_bytes(folder / "scores.json", folder))
    except (InputError, ValueError, RecursionError):
        return None
    src = old.get("source") if isinstance(old, dict) else None
    if isinstance(src, dict) and old.get("target") == identity["target"] \
            and src.get("format") == identity["from"]:
        return identity                    # written by the gate before it wrote markers
    return None


def _write_folder(folder: Path, found: Found, scores: dict,
                  inputs: InputBytes) -> dict[str, Path]:
    """OUT/<folder>/: every input file copied byte for byte (`COPIES`), scores.json; copies a
    previous run left that this one has not (a sibling since removed) are removed."""
    paths = {}
    for f in inputs.files.values():
        kind, name = COPIES[f.role]
        suffix = f.path.suffix.lower()
        if kind is None:
            kind = "cif" if suffix in (".cif", ".mmcif") else "pdb"
            name = f"model.{kind}"
        elif name.endswith("."):
            name += suffix.lstrip(".")
        paths[kind] = atomic_write_bytes(folder / name, f.data)
    for stale in set(COPY_NAMES) - {p.name for p in paths.values()}:
        if (folder / stale).is_file() and not (folder / stale).is_symlink():
            (folder / stale).unlink()
    paths["scores"] = atomic_write_json(folder / "scores.json", scores)
    return paths


def _score(found: Found, source: str, policy, root: Path) -> tuple[dict, InputBytes]:
    """(scores.json, the input files read): every number from bytes read once."""
    inputs = InputBytes(root)
    pred = read_prediction(found.pae, found.structure, siblings=found.siblings,
                           inputs=inputs)
    _plddt_present(found, pred)
    if found.model is not None:
        _ranking_agrees(found, inputs)
    inputs.unchanged()
    return external_scores(found, source, pred, policy, inputs), inputs


def gate_one(found: Found, source: str, out: Path, policy, enqueuer=None, *,
             folder: str | None = None, root: Path | None = None) -> dict:
    """One target -> its summary row (status "ok" or "error"); enqueues a flagged one."""
    root = found.pae.parent if root is None and found.pae is not None else root
    folder = folder or safe_name(found.target)
    row = {"target": found.target, "status": "error", "route": "", "reasons": "",
           "best_pair": "", "ipsae": "", "detail": found.problem or "", "folder": "",
           "best_chain_1": "", "best_chain_2": ""}
    if found.problem:
        return row
    try:
        scores, inputs = _score(found, source, policy, root)
        claim_folder(out / folder, {"target": found.target, "from": source,
                                    "origin": _origin(found, root)})
        paths = _write_folder(out / folder, found, scores, inputs)
    except (ProtdpError, ValueError, OSError) as exc:
        row["detail"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return row
    best = scores["best_interface"] or {}
    row.update(status="ok", route=scores["route"], reasons=",".join(scores["reasons"]),
               best_pair=f"{best.get('chain_1', '')}-{best.get('chain_2', '')}" if best else "",
               ipsae=f"{best['ipsae']:.6f}" if best else "", folder=folder,
               best_chain_1=best.get("chain_1", ""), best_chain_2=best.get("chain_2", ""),
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
    mine = Path(os.path.realpath(out))     # OUT inside the folder: its copies are not inputs
    found = [f for f in discover(root, source) if not any(
        p is not None and Path(os.path.realpath(p)).is_relative_to(mine)
        for p in (f.pae, f.siblings.get("ranking")))]
    if not found:
        raise InputError(f"no {source} predictions found in this folder", path=root)
    out.mkdir(parents=True, exist_ok=True)
    rows = [gate_one(f, source, out, policy, enqueuer, folder=name, root=root)
            for f, name in zip(found, folder_names(found, root))]
    lines = ["\t".join(SUMMARY_COLUMNS)] + [
        "\t".join(printable(r[k]) for k in SUMMARY_COLUMNS) for r in rows]
    atomic_write_bytes(out / SUMMARY_FILE, ("\n".join(lines) + "\n").encode())
    return rows
