"""`protdp weights compare` for AlphaFold-Multimer checkpoints: protdp's `MultimerModel` vs
AlphaFold-Multimer's own outputs on AlphaFold's own multimer `np_example` (issue 46 D4).

AlphaFold-Multimer has no feature pipeline outside the model: MSA sampling, clustering, BERT
masking and the extra MSA happen inside it, driven by JAX's threefry RNG (AF-Multimer
supplement 2.1; `modules_multimer.EmbeddingsAndEvoformer.sample_msa`). A port can only match
AlphaFold's outputs when it replays AlphaFold's recorded sampling, so the comparison needs the
recorded sampling file (`sampled_msa_<case>.npz` of af2_reference/multimer):

- `index_order` [passes, N_msa] int: per recycling pass, the row order of
  `gumbel_argsort_sample_idx` (first `num_msa` rows = cluster MSA, next `num_extra_msa` = extra);
- `template_unit_diagonal` [T, L, 3] float (optional): AlphaFold's float32 rounding residue on
  the diagonal of the template backbone unit vectors (compile-dependent XLA noise that
  `normalized` blows up to unit length; `protdp.model.multimer.template.backbone_unit_vectors`
  gives exactly 0 there). It is a real input of AlphaFold's template embedding; without it the
  shared fixture's atoms differ by 0.71 / 0.32 Å, which is reported, not hidden.

Tolerances are `protdp.weights.compare.CHECKS` (the one definition of the float32 targets:
atoms 1e-3 Å, pLDDT 0.01, pTM 1e-4, ...); ipTM and the ranking confidence take pTM's.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from protdp.errors import InputError
from protdp.weights.compare import CHECKS, compare_outputs
from protdp.weights.store import read_npz

MULTIMER_REQUIRED = ("aatype", "residue_index", "seq_mask", "asym_id", "entity_id", "sym_id",
                     "msa", "deletion_matrix", "msa_mask", "cluster_bias_mask")
ORDER_KEY, DIAGONAL_KEY = "index_order", "template_unit_diagonal"
SAMPLING_FLAG = "--sampled-msa"
_PTM = next(c for c in CHECKS if c.name == "ptm")
MULTIMER_CHECKS = CHECKS + (
    replace(_PTM, name="iptm", ours="iptm", theirs="confidence/iptm"),
    replace(_PTM, name="ranking_confidence", ours="ranking_confidence",
            theirs="confidence/ranking_confidence"),
)


def multimer_batch(features: dict[str, np.ndarray], path: Path) -> dict[str, torch.Tensor]:
    """AlphaFold-Multimer's np_example -> MultimerModel's batch (numeric arrays as tensors)."""
    missing = [k for k in MULTIMER_REQUIRED if k not in features]
    if missing:
        raise InputError(f"not an AlphaFold-Multimer feature dict: missing {missing}", path=path,
                         field=missing[0])
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in features.items()
            if v.dtype.kind in "biuf"}


def read_recorded_sampling(path: Path, batch: dict) -> tuple[list[torch.Tensor], np.ndarray | None]:
    """The recorded sampling file -> (per-pass row orders, template unit diagonal or None),
    checked against the features (every order a permutation of the MSA rows; the diagonal
    [T, L, 3] with the features' T and L)."""
    rec = read_npz(path, "recorded MSA sampling file")
    if ORDER_KEY not in rec:
        raise InputError(f"no '{ORDER_KEY}' array (AlphaFold's recorded MSA sampling)", path=path,
                         field=ORDER_KEY)
    order = np.asarray(rec[ORDER_KEY])
    rows = int(batch["msa"].shape[0])
    if order.ndim != 2 or order.dtype.kind not in "iu" or order.shape[1] != rows:
        raise InputError(f"shape {order.shape} ({order.dtype}), expected [passes, {rows}] integers "
                         f"(the features' MSA rows)", path=path, field=ORDER_KEY)
    for k, o in enumerate(order):
        if not np.array_equal(np.sort(o), np.arange(rows)):
            raise InputError(f"pass {k} is not a permutation of the {rows} MSA rows", path=path,
                             field=ORDER_KEY)
    diagonal = rec.get(DIAGONAL_KEY)
    if diagonal is not None:
        want = (int(batch["template_all_atom_positions"].shape[0]), int(batch["aatype"].shape[0]), 3) \
            if "template_all_atom_positions" in batch else None
        if want is None or tuple(diagonal.shape) != want:
            raise InputError(f"shape {tuple(diagonal.shape)}, expected {want} [templates, residues, "
                             f"3]", path=path, field=DIAGONAL_KEY)
    return [torch.from_numpy(o.astype(np.int64)) for o in order], diagonal


def with_unit_diagonal(plain, diagonal: np.ndarray, template_positions: torch.Tensor):
    """`backbone_unit_vectors` with AlphaFold's recorded diagonal [T, L, 3]: `plain` (the
    function to wrap) on template t's positions, the diagonal replaced by `diagonal[t]`;
    template t is matched by its atom positions [T, L, 37, 3] (equal inputs, equal residue),
    any other input is left as `plain` computes it."""
    diag = torch.from_numpy(np.asarray(diagonal, dtype=np.float32))            # [T, L, 3]
    tpos = template_positions.float()                                          # [T, L, 37, 3]
    eye = torch.eye(diag.shape[1], dtype=torch.bool)[..., None]                # [L, L, 1]

    def with_alphafold_diagonal(pos):
        unit = plain(pos)                                                      # [L, L, 3]
        k = next((k for k in range(tpos.shape[0]) if torch.equal(pos.float(), tpos[k])), None)
        if k is None:
            return unit
        on_diag = torch.diag_embed(diag[k].T).permute(1, 2, 0).to(unit.dtype)  # [L, L, 3]
        return torch.where(eye, on_diag, unit)

    return with_alphafold_diagonal


@contextlib.contextmanager
def replayed_unit_diagonal(diagonal: np.ndarray | None, template_positions: torch.Tensor | None):
    """Within the block, the template backbone unit vectors carry AlphaFold's recorded diagonal
    (`with_unit_diagonal`); no-op for None. Replaces `multimer_template.backbone_unit_vectors`
    for the block only (one comparison at a time; restored on exit)."""
    if diagonal is None or template_positions is None:
        yield
        return
    from protdp.model.multimer import template as multimer_template

    plain = multimer_template.backbone_unit_vectors
    multimer_template.backbone_unit_vectors = with_unit_diagonal(plain, diagonal,
                                                                 template_positions)
    try:
        yield
    finally:
        multimer_template.backbone_unit_vectors = plain


def _has_templates(batch: dict) -> bool:
    mask = batch.get("template_all_atom_mask")
    return mask is not None and bool((mask.sum(dim=(-1, -2)) > 0).any())


def run_multimer_compare(checkpoint: str | Path, features_path: str | Path,
                         reference_path: str | Path, sampled_msa: str | Path | None,
                         dtype: str = "float32") -> dict:
    """Load the multimer checkpoint, replay AlphaFold's recorded sampling on its features,
    compare with its outputs. Without the recording the comparison is refused: the outputs
    would differ by MSA sampling alone."""
    from protdp.weights.multimer_checkpoint import load_multimer

    if sampled_msa is None:
        raise InputError(f"an AlphaFold-Multimer checkpoint samples the MSA inside the model: "
                         f"pass {SAMPLING_FLAG} FILE (AlphaFold's recorded sampling, "
                         f"sampled_msa_<case>.npz); without it the outputs differ by sampling",
                         path=checkpoint)
    if dtype not in ("float32", "float64"):
        raise InputError(f"--dtype must be float32 or float64, got '{dtype}'")
    features_path, reference_path = Path(features_path), Path(reference_path)
    sampled_msa = Path(sampled_msa)
    batch = multimer_batch(read_npz(features_path, "features file"), features_path)
    orders, diagonal = read_recorded_sampling(sampled_msa, batch)
    reference = read_npz(reference_path, "reference outputs file")
    model = load_multimer(checkpoint).to(getattr(torch, dtype))
    num_recycles = len(orders) - 1
    try:
        with torch.no_grad(), replayed_unit_diagonal(diagonal,
                                                     batch.get("template_all_atom_positions")):
            out = model(batch, num_recycles=num_recycles, orders=orders)
    except InputError as exc:
        raise InputError(exc.reason, path=features_path, field=exc.field) from None
    try:
        result = compare_outputs(out, reference, checks=MULTIMER_CHECKS)
    except InputError as exc:
        raise InputError(exc.reason, path=reference_path, field=exc.field) from None
    report = {"checkpoint": str(checkpoint), "kind": "alphafold_multimer",
              "features": str(features_path), "reference": str(reference_path),
              "sampled_msa": str(sampled_msa), "dtype": dtype, "num_recycles": num_recycles,
              "recycles_run": int(out["num_recycles"]),
              "template_unit_diagonal": "replayed" if diagonal is not None else "not given",
              **result}
    if "num_recycles" in reference and int(reference["num_recycles"]) != int(out["num_recycles"]):
        report["failed"].append("num_recycles")
        report["within_tolerance"] = False
    if diagonal is None and _has_templates(batch):
        report["note"] = (f"the features have templates but {sampled_msa.name} has no "
                          f"'{DIAGONAL_KEY}': AlphaFold's rounding noise on the template "
                          f"unit-vector diagonal is not replayed, which alone moves the shared "
                          f"fixture's atoms by 0.3-0.7 A")
    return report
