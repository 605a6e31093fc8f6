"""Training losses (AF2 supplement §1.9, Eq. 7 weights):

    L = 0.5 L_FAPE + 0.5 L_aux + 0.3 L_dist + 2.0 L_msa + 0.01 L_conf (+ 0.01 L_PAE)

- L_FAPE: Algorithm 28 on the final layer, backbone frames vs all 5 backbone atoms.
- L_aux: mean over structure-module layers of the backbone (Cα) FAPE + the psi torsion loss
  with the angle-norm penalty (Alg. 27).
- L_dist: distogram cross-entropy on pseudo-beta distances (§1.9.8).
- L_msa: masked-MSA cross-entropy over BERT-masked positions (§1.9.9).
- L_conf: pLDDT cross-entropy against the lDDT-Cα of the detached prediction (Alg. 29),
  only for structures with resolution in [0.1, 3] Å (unknown resolution counts).
Masked residues/atoms never contribute. Non-finite inputs raise `NonFiniteError`.
"""

from __future__ import annotations

import torch

from protdp.errors import InputError
from protdp.metrics import lddt_ca_tensor
from protdp.model.config import LossConfig, ModelConfig
from protdp.model.embedders import GLY_ID, pseudo_beta
from protdp.model.heads import distogram_edges, pae_edges
from protdp.model.rigid import Rigid
from protdp.model.structure import psi_from_atoms

FLOAT_BATCH_KEYS = ("backbone_positions", "backbone_mask", "seq_mask", "msa_mask", "bert_mask")


class NonFiniteError(InputError):
    """A loss input (model output or batch tensor) holds NaN or Inf."""


def _check_finite(tensors: dict, what: str) -> None:
    for key, value in tensors.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
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


def structure_losses(outputs: dict, batch: dict, lc: LossConfig) -> dict[str, torch.Tensor]:
    """Final FAPE, per-layer backbone FAPE and psi torsion loss; each [*]."""
    pos = batch["backbone_positions"].float()                                 # [*, L, 5, 3]
    atom_mask = batch["backbone_mask"].float() * batch["seq_mask"].float()[..., None]
    true_frames = Rigid.from_3_points(pos[..., 0, :], pos[..., 1, :], pos[..., 2, :])
    frames_mask = atom_mask[..., 0] * atom_mask[..., 1] * atom_mask[..., 2]     # [*, L]
    traj = outputs["sm"]["frames"].float()                                    # [n_layers, *, L, 4, 4]
    kw = dict(clamp=lc.fape_clamp, length_scale=lc.fape_length_scale, eps=lc.fape_eps)

    per_layer = []
    for layer in range(traj.shape[0]):
        frames = Rigid.from_tensor_4x4(traj[layer])
        per_layer.append(fape(frames, true_frames, frames_mask, frames.trans, true_frames.trans,
                              frames_mask, **kw))
    backbone_fape = torch.stack(per_layer).mean(0)

    final = Rigid.from_tensor_4x4(traj[-1])
    flat = lambda x: x.reshape(x.shape[:-3] + (-1, 3))                          # noqa: E731
    final_fape = fape(final, true_frames, frames_mask, flat(outputs["final_atom_positions"].float()),
                      flat(pos), atom_mask.reshape(atom_mask.shape[:-2] + (-1,)), **kw)

    psi_true = psi_from_atoms(pos)                                            # [*, L, 2]
    psi_mask = frames_mask * atom_mask[..., 3]
    angles = outputs["sm"]["angles"].float()                                  # [n_layers, *, L, 2]
    norms = torch.sqrt((angles ** 2).sum(-1) + 1e-8)
    torsion = ((angles / norms[..., None] - psi_true) ** 2).sum(-1)
    torsion = _masked_mean(torsion, psi_mask, -1).mean(0)
    angle_norm = _masked_mean((norms - 1.0).abs(), psi_mask, -1).mean(0)
    return {"fape": final_fape, "backbone_fape": backbone_fape,
            "torsion": torsion + lc.angle_norm_weight * angle_norm}


def distogram_loss(logits: torch.Tensor, batch: dict, cfg: ModelConfig) -> torch.Tensor:
    """Cross-entropy over pseudo-beta distance bins; logits [*, L, L, bins] -> [*]."""
    pos = batch["backbone_positions"].float()
    cb = pseudo_beta(batch["aatype"], pos)                                    # [*, L, 3]
    gly = batch["aatype"] == GLY_ID
    mask = torch.where(gly, batch["backbone_mask"][..., 1], batch["backbone_mask"][..., 4]).float()
    mask = mask * batch["seq_mask"].float()
    d2 = ((cb[..., :, None, :] - cb[..., None, :, :]) ** 2).sum(-1, keepdim=True)
    edges = distogram_edges(cfg).to(pos.device)
    target = (d2 > edges ** 2).sum(-1)                                        # [*, L, L]
    ce = _nll(logits, target)                                                  # [*, L, L]
    pair_mask = mask[..., :, None] * mask[..., None, :]
    return _masked_mean(ce, pair_mask, (-1, -2))


def masked_msa_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Cross-entropy at BERT-masked MSA positions; logits [*, S, L, 23] -> [*]."""
    n_rows = logits.shape[-3]
    target = batch["true_msa"][..., :n_rows, :].long()
    mask = batch["bert_mask"][..., :n_rows, :].float()
    nll = _nll(logits, target)                                                 # [*, S, L]
    return _masked_mean(nll, mask, (-1, -2))


def plddt_loss(logits: torch.Tensor, outputs: dict, batch: dict, lc: LossConfig) -> torch.Tensor:
    """Alg. 29: CE against binned per-residue lDDT-Cα of the detached prediction -> [*]."""
    pred_ca = outputs["final_atom_positions"][..., 1, :].detach().float()
    true_ca = batch["backbone_positions"][..., 1, :].float()
    mask = batch["backbone_mask"][..., 1].float() * batch["seq_mask"].float()
    with torch.no_grad():
        lddt = lddt_ca_tensor(pred_ca, true_ca, mask, per_residue=True)       # [*, L]
    n_bins = logits.shape[-1]
    target = (lddt * n_bins).floor().clamp(max=n_bins - 1).long()
    nll = _nll(logits, target)
    loss = _masked_mean(nll, mask, -1)
    if "resolution" in batch:
        res = torch.as_tensor(batch["resolution"], dtype=torch.float32, device=loss.device)
        keep = torch.isnan(res) | ((res >= lc.plddt_min_resolution) & (res <= lc.plddt_max_resolution))
        loss = loss * keep.to(loss.dtype)
    return loss


def pae_loss(logits: torch.Tensor, outputs: dict, batch: dict, cfg: ModelConfig) -> torch.Tensor:
    """§1.9.7: CE against binned aligned Cα errors under each true/pred frame pair -> [*]."""
    pos = batch["backbone_positions"].float()
    mask = batch["backbone_mask"].float() * batch["seq_mask"].float()[..., None]
    frames_mask = mask[..., 0] * mask[..., 1] * mask[..., 2]
    true_frames = Rigid.from_3_points(pos[..., 0, :], pos[..., 1, :], pos[..., 2, :])
    pred_frames = Rigid.from_tensor_4x4(outputs["sm"]["frames"][-1].detach().float())
    with torch.no_grad():
        lp = pred_frames.unsqueeze(-1).invert_apply(pred_frames.trans[..., None, :, :])
        lt = true_frames.unsqueeze(-1).invert_apply(true_frames.trans[..., None, :, :])
        err2 = ((lp - lt) ** 2).sum(-1, keepdim=True)                         # [*, L, L, 1]
        target = (err2 > pae_edges(cfg).to(pos.device) ** 2).sum(-1)
    nll = _nll(logits, target)
    return _masked_mean(nll, frames_mask[..., :, None] * frames_mask[..., None, :], (-1, -2))


def compute_loss(outputs: dict, batch: dict, config: ModelConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total AF2 loss (scalar, mean over the batch) and the unweighted terms (each a scalar)."""
    lc = config.loss
    _check_finite({k: batch[k] for k in FLOAT_BATCH_KEYS if k in batch}, "batch")
    used = {k: outputs[k] for k in ("final_atom_positions", "distogram_logits", "masked_msa_logits",
                                    "plddt_logits", "pae_logits") if k in outputs}
    used.update({f"sm.{k}": outputs["sm"][k] for k in ("frames", "angles")})
    _check_finite(used, "model outputs")

    terms = structure_losses(outputs, batch, lc)
    terms["distogram"] = distogram_loss(outputs["distogram_logits"], batch, config)
    terms["masked_msa"] = masked_msa_loss(outputs["masked_msa_logits"], batch)
    terms["plddt"] = plddt_loss(outputs["plddt_logits"], outputs, batch, lc)
    if "pae_logits" in outputs:
        terms["pae"] = pae_loss(outputs["pae_logits"], outputs, batch, config)
    terms = {k: v.mean() for k, v in terms.items()}
    terms["aux"] = terms["backbone_fape"] + terms["torsion"]
    total = (lc.fape_weight * terms["fape"] + lc.aux_weight * terms["aux"]
             + lc.distogram_weight * terms["distogram"] + lc.masked_msa_weight * terms["masked_msa"]
             + lc.plddt_weight * terms["plddt"])
    if "pae" in terms:
        total = total + lc.pae_weight * terms["pae"]
    return total, terms
