"""Self-distillation data from reviewed predictions (AF2 supplement §1.3 trained on its own
high-confidence predictions; here a human approval is the filter).

`export_distillation(store, out)` writes every *approved* prediction of the review queue as a
family of the HDF5 store format (docs/store_format.md, v2): the MSA the prediction was made
from (the files its provenance.json lists, each checked against its recorded sha256), the
predicted all-atom structure as the label (from the item's own folder, read with protdp's
structure reader), resolution unknown, and group attributes `source_kind = "distillation"` and
`distillation` (JSON: checkpoint, reviewer, decision time, item and prediction ids, mean pLDDT).
Rejected, escalated and pending items never reach the export. Decisions are read through
`protdp.review.trusted` (an admin token, `verify` first): an approved item that fails verify,
was superseded, or whose files are not the bytes hashed at enqueue is skipped with its reason
(returned), never exported from the wrong data.
Written to a temporary file, verified and renamed: a crash leaves no half-written store.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.parse import merge_msas, pair_msa_structure, parse_msa, parse_structure
from protdp.data.residues import msa_row_to_ids
from protdp.data.store import new_store_file, verify_store, write_family, write_index
from protdp.errors import InputError, ProtdpError
from protdp.fileio import sha256_file
from protdp.review.files import STRUCTURE_KINDS, resolve_item_file

SOURCE_KIND = "distillation"


@dataclass
class DistillReport:
    path: Path
    exported: list[str] = field(default_factory=list)         # family ids written
    skipped: list[dict] = field(default_factory=list)         # {"item_id", "reason"}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read ({type(exc).__name__})", path=path) from None


def _msa_of(prov: dict, sequence: str):
    """The prediction's own MSA (every listed file unchanged), or the query alone."""
    files = (prov.get("inputs") or {}).get("msa_files") or []
    for f in files:
        if not Path(f["path"]).is_file() or sha256_file(f["path"]) != f["sha256"]:
            raise InputError("the MSA file changed or is gone since the prediction",
                             path=f["path"])
    if not files:
        return msa_row_to_ids(sequence)[None], np.zeros((1, len(sequence)), np.uint8), []
    msa = merge_msas([parse_msa(f["path"]) for f in files])
    return msa.tokens(), msa.deletion_matrix, files


def _item_file(record: dict, kind: str) -> Path:
    """The item's `kind` file, resolved inside its own folder only (protdp.review.files)."""
    path = resolve_item_file(record, kind)
    if path is None:
        raise InputError(f"no readable {kind} file in the item's folder", path=record["folder"])
    return path


def distillation_family(record: dict, min_residue_plddt: float = 0.0) -> tuple[dict, list, list]:
    """(family dict, source files, their sha256) of one approved export record."""
    kinds = [k for k in STRUCTURE_KINDS if k in (record["paths"] or {})]
    if not kinds:
        raise InputError("no predicted structure file", path=record["folder"])
    structure = _item_file(record, kinds[0])
    scores = _read_json(_item_file(record, "scores"))
    prov = _read_json(_item_file(record, "provenance"))
    sequence = scores["sequence"]
    tokens, dels, msa_files = _msa_of(prov, sequence)
    chain = parse_structure(structure)
    paired = pair_msa_structure(sequence, chain, str(structure), str(structure))
    mask = paired.all_atom_mask.astype(bool)
    low = np.asarray(scores["plddt"], float) < min_residue_plddt      # [L] not trusted
    mask[low] = False
    family = {
        "family_id": f"distill_{record['item_id']:06d}",
        "msa": tokens.astype(np.uint8), "deletion_matrix": np.minimum(dels, 255).astype(np.uint8),
        "residue_index": np.arange(len(sequence), dtype=np.int32),
        "all_atom_positions": np.where(mask[..., None], paired.all_atom_positions, 0)
        .astype(np.float32),
        "all_atom_mask": mask.astype(np.uint8),
        "between_segment_residues": np.zeros(len(sequence), np.uint8),
        # resolution 0: like AF2's distillation examples, below the pLDDT / experimentally-
        # resolved losses' minimum resolution, so the model is not trained to trust itself
        "sequence": sequence, "resolution": 0.0, "chain": chain.chain_id,
        "placement": "predicted", "warnings": [],
    }
    files = [str(structure)] + [f["path"] for f in msa_files]
    digests = [sha256_file(structure)] + [f["sha256"] for f in msa_files]
    provenance = {"item_id": record["item_id"], "prediction_id": record["prediction_id"],
                  "target": record["target"], "reviewer": record["decided_by"],
                  "decided_at": record["decided_at"], "comment": record["comment"],
                  "mean_plddt": record["mean_plddt"], "checkpoint": prov.get("checkpoint"),
                  "min_residue_plddt": min_residue_plddt}
    family["distillation"] = provenance
    return family, files, digests


def export_distillation(store, out: str | Path, *, admin_token: str | None,
                        min_residue_plddt: float = 0.0) -> DistillReport:
    """Approved predictions of `store` (a ReviewStore) -> HDF5 store at `out`."""
    from protdp.review.trusted import trusted_records

    out = Path(out)
    report = DistillReport(out)
    records, refused = trusted_records(store, admin_token, require_bytes=True)
    report.skipped += [{"item_id": r["item_id"], "reason": r["reason"]} for r in refused
                       if r["decision"] == "approved"]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    h5 = new_store_file(tmp, json.dumps({"source": SOURCE_KIND}), str(out.parent.resolve()))
    try:
        for rec in records:
            if rec["decision"] != "approved":
                continue
            try:
                fam, files, digests = distillation_family(rec, min_residue_plddt)
            except (ProtdpError, KeyError, ValueError, OSError) as exc:
                report.skipped.append({"item_id": rec["item_id"], "reason": str(exc)})
                continue
            write_family(h5, fam, files, digests, [])
            g = h5["families"][fam["family_id"]]
            g.attrs["source_kind"] = SOURCE_KIND
            g.attrs["distillation"] = json.dumps(fam["distillation"], sort_keys=True)
            report.exported.append(fam["family_id"])
        write_index(h5)
    finally:
        h5.close()
    verified = verify_store(tmp)
    if not verified.ok:
        tmp.unlink(missing_ok=True)
        raise InputError(f"the exported store did not verify: {verified.summary()}", path=out)
    os.replace(tmp, out)
    return report
