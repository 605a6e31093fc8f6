"""protdp vs AlphaFold's own outputs on AlphaFold's own processed features (issue 16 D7).

Inputs follow the layout of DeepMind's model (documented in the AF2 reference fixture's
README): `features.npz` is the processed feature dict passed to `modules.AlphaFold` (leading
axis = num_ensemble (1) x (num_recycle + 1): slice i feeds recycling pass i, each with its own
MSA sample), `outputs.npz` the flattened output dict ('/'-joined keys, confidence metrics under
'confidence/'). protdp runs the same passes in float32 or float64 and reports the largest
absolute difference per output; padded MSA rows are compared too (protdp computes them as
AlphaFold does: unmasked transitions, outer-product-mean bias / 1e-3 on empty pairs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from protdp.errors import InputError
from protdp.model.inputs import MSA_KEYS
from protdp.weights.store import read_npz

RESIDUE_KEYS = ("aatype", "residue_index", "seq_mask", "target_feat", "between_segment_residues",
                "template_aatype", "template_all_atom_positions", "template_all_atom_masks",
                "template_mask", "template_pseudo_beta", "template_pseudo_beta_mask")
REQUIRED = ("aatype", "residue_index", "seq_mask", "msa_feat", "msa_mask")
PADDED_ROWS = ("compared like real rows: protdp reproduces AlphaFold's arithmetic on padding "
               "(unmasked transitions, outer-product-mean bias / 1e-3 on empty pairs)")


@dataclass(frozen=True)
class Check:
    """One compared output: protdp key, AlphaFold key, tolerance and its kind."""

    name: str
    ours: str
    theirs: str
    tolerance: float
    relative: bool          # True: |diff| / max|reference| (representations, logits)


CHECKS = (
    Check("final_atom_positions", "final_atom_positions", "structure_module/final_atom_positions",
          1e-3, False),
    Check("final_atom_mask", "final_atom_mask", "structure_module/final_atom_mask", 0.0, False),
    Check("plddt", "plddt", "confidence/plddt", 0.01, False),
    Check("predicted_aligned_error", "pae", "confidence/predicted_aligned_error", 1e-3, False),
    Check("ptm", "ptm", "confidence/ptm", 1e-4, False),
    Check("distogram_logits", "distogram_logits", "distogram/logits", 1e-4, True),
    Check("masked_msa_logits", "masked_msa_logits", "masked_msa/logits", 1e-4, True),
    Check("experimentally_resolved_logits", "experimentally_resolved_logits",
          "experimentally_resolved/logits", 1e-4, True),
    Check("predicted_lddt_logits", "plddt_logits", "predicted_lddt/logits", 1e-4, True),
    Check("predicted_aligned_error_logits", "pae_logits", "predicted_aligned_error/logits", 1e-4, True),
    Check("single", "single", "representations/single", 1e-4, True),
    Check("pair", "pair", "representations/pair", 1e-4, True),
    Check("msa_first_row", "msa_first_row", "representations/msa_first_row", 1e-4, True),
    Check("msa", "msa", "representations/msa", 1e-4, True),
    Check("structure_module", "sm.single", "representations/structure_module", 1e-4, True),
)


def batch_from_features(features: dict[str, np.ndarray], path: Path) -> tuple[dict, int | None]:
    """AlphaFold's processed features -> a protdp batch (MSA keys keep the per-pass axis) and
    the number of passes in the file (None without a leading pass axis)."""
    missing = [k for k in REQUIRED if k not in features]
    if missing:
        raise InputError(f"not an AlphaFold processed-feature dict: missing {missing}", path=path,
                         field=missing[0])
    passes = features["aatype"].shape[0] if features["aatype"].ndim == 2 else None
    batch = {}
    for key, value in features.items():
        if value.dtype.kind not in "biuf":
            continue
        if key in RESIDUE_KEYS:
            batch[key] = torch.from_numpy(np.ascontiguousarray(value[0] if passes else value))
        elif key in MSA_KEYS:
            batch[key] = torch.from_numpy(np.ascontiguousarray(value))
    return batch, passes


def _get(out: dict, key: str):
    value = out
    for part in key.split("."):
        value = value[part]
    return value


def compare_outputs(out: dict, reference: dict[str, np.ndarray],
                    checks: tuple[Check, ...] = CHECKS) -> dict:
    """Largest absolute differences (positions under AlphaFold's atom mask) and the verdict."""
    diffs, rel, failed, skipped = {}, {}, [], []
    mask = reference.get("structure_module/final_atom_mask")
    for c in checks:
        if c.theirs not in reference or (c.ours.split(".")[0] not in out):
            skipped.append(c.name)
            continue
        ours = _get(out, c.ours).detach().double().cpu().numpy()
        theirs = np.asarray(reference[c.theirs], dtype=np.float64)
        if ours.shape != theirs.shape:
            raise InputError(f"protdp gives shape {ours.shape}, the reference {theirs.shape}",
                             field=c.theirs)
        err = np.abs(ours - theirs)
        if c.name == "final_atom_positions" and mask is not None:
            err = err * (np.asarray(mask)[..., None] > 0)
        diffs[c.name] = float(err.max()) if err.size else 0.0
        figure = diffs[c.name]
        if c.relative:
            rel[c.name] = figure = diffs[c.name] / max(float(np.abs(theirs).max()), 1e-12)
        if not figure <= c.tolerance:
            failed.append(c.name)
    return {"max_abs_diff": diffs, "max_rel_diff": rel, "failed": failed, "not_compared": skipped,
            "tolerance": {c.name: {"value": c.tolerance, "kind": "relative" if c.relative else "absolute"}
                          for c in checks}, "within_tolerance": not failed}


def run_compare(checkpoint: str | Path, features_path: str | Path, reference_path: str | Path,
                dtype: str = "float32", num_recycles: int | None = None) -> dict:
    """Load the checkpoint, run it on the features, compare with the reference outputs."""
    from protdp.inference.checkpoint import load_model_checkpoint

    if dtype not in ("float32", "float64"):
        raise InputError(f"--dtype must be float32 or float64, got '{dtype}'")
    features_path, reference_path = Path(features_path), Path(reference_path)
    batch, passes = batch_from_features(read_npz(features_path, "features file"), features_path)
    reference = read_npz(reference_path, "reference outputs file")
    loaded = load_model_checkpoint(checkpoint)
    model = loaded.model.to(getattr(torch, dtype)).eval()
    if num_recycles is None:
        num_recycles = passes - 1 if passes else model.config.num_recycles
    try:
        with torch.no_grad():
            out = model(batch, num_recycles=num_recycles)
    except InputError as exc:
        raise InputError(exc.reason, path=features_path, field=exc.field) from None
    try:
        result = compare_outputs(out, reference)
    except InputError as exc:
        raise InputError(exc.reason, path=reference_path, field=exc.field) from None
    report = {"checkpoint": str(loaded.path), "features": str(features_path),
              "reference": str(reference_path), "dtype": dtype, "num_recycles": num_recycles,
              "msa_samples": passes, "padded_rows": PADDED_ROWS, **result}
    if not result.get("within_tolerance", True):
        report["hint"] = (f"the structure-module layer count ({model.config.sm_layers}) and the "
                          f"recycles are not in the parameter arrays: if the source used other "
                          f"values, re-import with --sm-layers N / --num-recycles N (or "
                          f"--alphafold-config) and compare again")
    return report
