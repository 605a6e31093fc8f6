"""Training losses (AF2 supplement §1.9, Eq. 7 weights; AF2 `folding.py` / `modules.py` heads):

    L = 0.5 L_FAPE + 0.5 L_aux + 0.3 L_dist + 2.0 L_msa + 0.01 L_conf
        (+ 0.01 L_PAE) (+ 0.01 L_exp_resolved + 1.0 L_viol when fine-tuning)

- L_FAPE ("fape"): all-atom FAPE of the final layer (Alg. 28) over the 8 rigid-group frames and
  the atom14 atoms, against the ground truth renamed per residue to the better-fitting naming
  of its symmetric atoms (Alg. 26);
- L_aux: backbone FAPE averaged over structure-module layers ("backbone_fape") + the torsion
  loss ("torsion", Alg. 27): chi1-4 against the truth or its pi-shifted alternative, averaged
  over layers, + `angle_norm_weight` x the norm penalty of all 7 raw torsions;
- L_dist, L_msa, L_conf (pLDDT, Alg. 29), L_PAE (§1.9.7), L_exp_resolved (§1.9.10) and
  L_viol (§1.9.11, `protdp.model.violations`). Resolution filters (AF2: [0.1, 3] Å) apply to
  pLDDT, PAE and experimentally-resolved; unknown (NaN) resolution counts.
Masked residues/atoms never contribute. Non-finite inputs raise `NonFiniteError`.
"""

from __future__ import annotations

import torch

from protdp.errors import InputError
from protdp.metrics import lddt_ca_tensor
from protdp.model.all_atom import atom37_exists, residue_table
from protdp.model.config import LossConfig, ModelConfig
from protdp.model.ground_truth import structure_truth
from protdp.model.heads import distogram_edges, pae_edges
from protdp.model.inputs import select_pass
from protdp.model.rigid import Rigid
from protdp.model.violations import violation_loss
from protdp.data.residue_constants import CHI_PI_PERIODIC

FLOAT_BATCH_KEYS = ("backbone_positions", "backbone_mask", "all_atom_positions", "all_atom_mask",
                    "seq_mask", "msa_mask", "bert_mask")


class NonFiniteError(InputError):
    """A loss input (model output or batch tensor) holds NaN or Inf."""


def _check_finite(tensors: dict, what: str) -> None:
    for key, value in tensors.items():
        if (isinstance(value, torch.Tensor) and value.is_floating_point()
                and not torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise NonFiniteError(f"{bad} non-finite value(s) in {what}", field=key)


def fape(pred_frames: Rigid, true_frames: Rigid, frames_mask: torch.Tensor,
         pred_points: torch.Tensor, true_points: torch.Tensor, points_mask: torch.Tensor,
         clamp: float | None = 10.0, length_scale: float = 10.0, eps: float = 1e-4) -> torch.Tensor:
    """Algorithm 28. Frames [*, F], points [*, P, 3], masks [*, F] / [*, P] -> [*]."""
    local_pred = pred_frames.unsqueeze(-1).invert_apply(pred_points[..., None, :, :])  # [*, F, P, 3]
    local_true = true_frames.unsqueeze(-1).invert_apply(true_points[..., None, :, :])
    dist = torch.sqrt(((local_pred - local_true) ** 2).sum(-1) + eps)                # [*, F, P]
    if clamp is not None:
        dist = dist.clamp(max=clamp)
    pair_mask = frames_mask[..., :, None] * points_mask[..., None, :]
    return (dist / length_scale * pair_mask).sum((-1, -2)) / (pair_mask.sum((-1, -2)) + eps)


def _nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy: logits [*, bins], integer target [*] -> [*]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -torch.gather(logp, -1, target[..., None].long())[..., 0]


def _masked_mean(value: torch.Tensor, mask: torch.Tensor, dims, eps: float = 1e-8) -> torch.Tensor:
    return (value * mask).sum(dims) / (mask.sum(dims) + eps)


def _pair_dists(x: torch.Tensor) -> torch.Tensor:
    """x [*, L, 14, 3] -> all atom-atom distances [*, L, L, 14, 14]."""
    return torch.sqrt(1e-10 + ((x[..., :, None, :, None, :] - x[..., None, :, None, :, :]) ** 2).sum(-1))


def alt_naming_is_better(truth: dict, pred14: torch.Tensor) -> torch.Tensor:
    """Algorithm 26 lines 1-5: per residue [*, L], 1 where swapping the symmetric atoms of the
    ground truth fits the prediction's distances to the unambiguous atoms better."""
    pred_d = _pair_dists(pred14)
    err = torch.sqrt(1e-10 + (pred_d - _pair_dists(truth["atom14"])) ** 2)
    alt_err = torch.sqrt(1e-10 + (pred_d - _pair_dists(truth["atom14_alt"])) ** 2)
    exists, amb = truth["atom14_mask"], truth["atom14_ambiguous"]
    mask = ((exists * amb)[..., :, None, :, None] * (exists * (1.0 - amb))[..., None, :, None, :])
    return ((mask * alt_err).sum((-1, -2, -3)) < (mask * err).sum((-1, -2, -3))).to(pred14.dtype)


def structure_losses(outputs: dict, batch: dict, lc: LossConfig,
                     truth: dict | None = None) -> dict[str, torch.Tensor]:
    """All-atom FAPE, per-layer backbone FAPE and the torsion loss; each [*]."""
    sm = outputs["sm"]
    truth = structure_truth(batch) if truth is None else truth
    kw = dict(clamp=lc.fape_clamp, length_scale=lc.fape_length_scale, eps=lc.fape_eps)

    traj = sm["frames"]                                                       # [layers, *, L, 4, 4]
    gt_bb = truth["frames"].index((..., 0))
    bb_mask = truth["backbone_mask"]
    per_layer = []
    for layer in range(traj.shape[0]):
        frames = Rigid.from_tensor_4x4(traj[layer])
        per_layer.append(fape(frames, gt_bb, bb_mask, frames.trans, gt_bb.trans, bb_mask, **kw))

    pred14 = sm["atom14_positions"]
    alt = alt_naming_is_better(truth, pred14.detach())                       # [*, L]
    a = alt[..., None]
    gt14 = (1 - a[..., None]) * truth["atom14"] + a[..., None] * truth["atom14_alt"]
    gt14_mask = (1 - a) * truth["atom14_mask"] + a * truth["atom14_alt_mask"]
    rot = torch.where(a[..., None, None] > 0, truth["alt_frames"].rot, truth["frames"].rot)
    gt_frames = Rigid(rot, truth["frames"].trans)                            # [*, L, 8]
    pred_frames = Rigid.from_tensor_4x4(sm["sidechain_frames"])
    # frames [*, L, 8] and atoms [*, L, 14] flattened to [*, L*8] / [*, L*14]
    flat_frames = lambda f: Rigid(f.rot.flatten(-4, -3), f.trans.flatten(-3, -2))  # noqa: E731
    all_atom = fape(flat_frames(pred_frames), flat_frames(gt_frames),
                    truth["frames_mask"].flatten(-2), pred14.flatten(-3, -2), gt14.flatten(-3, -2),
                    gt14_mask.flatten(-2), **kw)
    return {"fape": all_atom, "backbone_fape": torch.stack(per_layer).mean(0),
            "torsion": torsion_loss(sm["angles"], truth, batch, lc)}


def torsion_loss(angles: torch.Tensor, truth: dict, batch: dict, lc: LossConfig) -> torch.Tensor:
    """Algorithm 27: chi error (the nearer of truth and its pi-shift for pi-periodic chis)
    averaged over layers and present chis, + angle_norm_weight x |norm - 1| over all 7 raw
    torsions. angles [layers, *, L, 7, 2] (unnormalised) -> [*]."""
    norm = torch.sqrt((angles ** 2).sum(-1) + 1e-6)                          # [layers, *, L, 7]
    pred = (angles / torch.sqrt(torch.clamp((angles ** 2).sum(-1, keepdim=True), min=1e-12)))[..., 3:, :]
    true = truth["chi_sin_cos"]
    shift = 1.0 - 2.0 * residue_table(CHI_PI_PERIODIC, batch["aatype"], true.dtype)  # [*, L, 4]
    err = torch.minimum(((pred - true) ** 2).sum(-1), ((pred - true * shift[..., None]) ** 2).sum(-1))
    chi_mask = truth["chi_mask"].expand_as(err)
    chi = (err * chi_mask).sum((0, -1, -2)) / (chi_mask.sum((0, -1, -2)) + 1e-10)
    seq = batch["seq_mask"].to(norm.dtype)[..., None].expand_as(norm)
    angle_norm = ((norm - 1.0).abs() * seq).sum((0, -1, -2)) / (seq.sum((0, -1, -2)) + 1e-10)
    return chi + lc.angle_norm_weight * angle_norm


def _resolution_keep(batch: dict, lc: LossConfig, like: torch.Tensor) -> torch.Tensor:
    """1 where the structure's resolution is in [min, max] Å or unknown (NaN), per example."""
    if "resolution" not in batch:
        return torch.ones_like(like)
    res = torch.as_tensor(batch["resolution"], dtype=torch.float32, device=like.device)
    keep = torch.isnan(res) | ((res >= lc.plddt_min_resolution) & (res <= lc.plddt_max_resolution))
    return keep.to(like.dtype)


def distogram_loss(logits: torch.Tensor, truth: dict, cfg: ModelConfig) -> torch.Tensor:
    """Cross-entropy over pseudo-beta distance bins; logits [*, L, L, bins] -> [*]."""
    cb, mask = truth["pseudo_beta"], truth["pseudo_beta_mask"]
    d2 = ((cb[..., :, None, :] - cb[..., None, :, :]) ** 2).sum(-1, keepdim=True)
    target = (d2 > distogram_edges(cfg).to(cb.device, cb.dtype) ** 2).sum(-1)  # [*, L, L]
    pair_mask = mask[..., :, None] * mask[..., None, :]
    return _masked_mean(_nll(logits, target), pair_mask, (-1, -2), eps=1e-6)


def masked_msa_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Cross-entropy at BERT-masked MSA positions; logits [*, S, L, 23] -> [*]."""
    n_rows = logits.shape[-3]
    target = batch["true_msa"][..., :n_rows, :].long()
    mask = batch["bert_mask"][..., :n_rows, :].float()
    return _masked_mean(_nll(logits, target), mask, (-1, -2))


def plddt_loss(logits: torch.Tensor, outputs: dict, truth: dict, batch: dict,
               lc: LossConfig) -> torch.Tensor:
    """Alg. 29: CE against binned per-residue lDDT-Cα of the detached prediction -> [*]."""
    pred_ca = outputs["final_atom_positions"][..., 1, :].detach().float()
    true_ca, mask = truth["atom37"][..., 1, :].float(), truth["atom37_mask"][..., 1].float()
    with torch.no_grad():
        lddt = lddt_ca_tensor(pred_ca, true_ca, mask, per_residue=True)       # [*, L]
    n_bins = logits.shape[-1]
    target = (lddt * n_bins).floor().clamp(max=n_bins - 1).long()
    loss = _masked_mean(_nll(logits, target), mask, -1)
    return loss * _resolution_keep(batch, lc, loss)


def pae_loss(logits: torch.Tensor, outputs: dict, truth: dict, batch: dict,
             cfg: ModelConfig) -> torch.Tensor:
    """§1.9.7: CE against binned aligned Cα errors under each true/pred frame pair -> [*]."""
    true_frames = truth["frames"].index((..., 0))
    frames_mask = truth["backbone_mask"]
    pred_frames = Rigid.from_tensor_4x4(outputs["sm"]["frames"][-1].detach().to(true_frames.trans.dtype))
    with torch.no_grad():
        lp = pred_frames.unsqueeze(-1).invert_apply(pred_frames.trans[..., None, :, :])
        lt = true_frames.unsqueeze(-1).invert_apply(true_frames.trans[..., None, :, :])
        err2 = ((lp - lt) ** 2).sum(-1, keepdim=True)                         # [*, L, L, 1]
        target = (err2 > pae_edges(cfg).to(err2.device, err2.dtype) ** 2).sum(-1)
    pair_mask = frames_mask[..., :, None] * frames_mask[..., None, :]
    loss = _masked_mean(_nll(logits, target), pair_mask, (-1, -2))
    return loss * _resolution_keep(batch, cfg.loss, loss)


def experimentally_resolved_loss(logits: torch.Tensor, truth: dict, batch: dict,
                                 lc: LossConfig) -> torch.Tensor:
    """§1.9.10: sigmoid CE of the atom37 logits against "atom observed", over the residue
    type's atoms -> [*]."""
    exists = atom37_exists(batch["aatype"], torch.float32) * batch["seq_mask"].float()[..., None]
    xent = torch.nn.functional.binary_cross_entropy_with_logits(
        logits.float(), (truth["atom37_mask"] > 0).float(), reduction="none")
    loss = (xent * exists).sum((-1, -2)) / (exists.sum((-1, -2)) + 1e-8)
    return loss * _resolution_keep(batch, lc, loss)


def compute_loss(outputs: dict, batch: dict,
                 config: ModelConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total AF2 loss (scalar, mean over the batch) and the unweighted terms (each a scalar)."""
    lc = config.loss
    batch = select_pass(batch, outputs.get("msa_sample", 0))   # the MSA the last pass saw
    _check_finite({k: batch[k] for k in FLOAT_BATCH_KEYS if k in batch}, "batch")
    used = {k: outputs[k] for k in ("final_atom_positions", "distogram_logits", "masked_msa_logits",
                                    "plddt_logits", "pae_logits", "experimentally_resolved_logits")
            if k in outputs}
    used.update({f"sm.{k}": outputs["sm"][k] for k in ("frames", "angles")})
    _check_finite(used, "model outputs")

    truth = structure_truth(batch)
    terms = structure_losses(outputs, batch, lc, truth)
    terms["distogram"] = distogram_loss(outputs["distogram_logits"], truth, config)
    terms["masked_msa"] = masked_msa_loss(outputs["masked_msa_logits"], batch)
    terms["plddt"] = plddt_loss(outputs["plddt_logits"], outputs, truth, batch, lc)
    if "pae_logits" in outputs:
        terms["pae"] = pae_loss(outputs["pae_logits"], outputs, truth, batch, config)
    if "experimentally_resolved_logits" in outputs:   # always: its head gets a gradient on every rank
        terms["experimentally_resolved"] = experimentally_resolved_loss(
            outputs["experimentally_resolved_logits"], truth, batch, lc)
    if lc.violation_weight > 0:
        terms["violation"] = violation_loss(outputs["sm"]["atom14_positions"], batch["aatype"],
                                            batch["residue_index"], batch["seq_mask"],
                                            lc.violation_tolerance_factor, lc.clash_overlap_tolerance)
    terms = {k: v.mean() for k, v in terms.items()}
    terms["aux"] = terms["backbone_fape"] + terms["torsion"]
    weights = {"fape": lc.fape_weight, "aux": lc.aux_weight, "distogram": lc.distogram_weight,
               "masked_msa": lc.masked_msa_weight, "plddt": lc.plddt_weight, "pae": lc.pae_weight,
               "experimentally_resolved": lc.experimentally_resolved_weight,
               "violation": lc.violation_weight}
    total = sum(weights[k] * terms[k] for k in weights if k in terms)
    return total, terms
