"""Training losses of AlphaFold-Multimer (Evans et al. 2021, §2.5 and §7.3; AlphaFold v2.3.2
`folding_multimer` / OpenFold's multimer loss config) on one complex (no batch dimension):

- chain permutation first (`protdp.model.multimer.crop_permutation`): the ground truth's copies of an
  entity are reassigned to the predicted chains, on the crop, against the full complex;
- backbone FAPE split by the pair of chains (§2.5): frame and point of the SAME chain clamped at
  10 Å with length scale 10 Å (`INTRA_CHAIN_FAPE`), of DIFFERENT chains clamped at 30 Å with
  length scale 20 Å (`INTERFACE_FAPE`); each a masked mean over its own pairs, averaged over
  structure-module layers; `backbone_fape` = intra + interface, so the AF2 aux weight 0.5 gives
  AlphaFold-Multimer's 0.5 / 0.5;
- all-atom (side-chain) FAPE, torsion, distogram, masked MSA, pLDDT, PAE, experimentally
  resolved: the monomer terms of `protdp.model.losses` on the permuted truth;
- structural violations across chains: the monomer terms (`protdp.model.violations`) with every
  chain's residue index moved by `CHAIN_INDEX_OFFSET` x asym id, so no peptide bond is assumed
  between chains and atoms of different chains clash like atoms of different residues (the
  inter-chain clash), residues of different chains never share an index;
- the chain centre-of-mass term (§2.5 Eq. 1, OpenFold `chain_center_of_mass_loss`): for every
  pair of chains, (min(0, (d_pred - d_true + 4 Å) / 20 Å))^2 of the distances between their
  resolved-Cα centroids, averaged over chain pairs: chains predicted closer than in the truth
  by more than 4 Å are pulled apart; weight `CHAIN_CENTRE_WEIGHT`.
"""

from __future__ import annotations

import torch

from protdp.data.residue_constants import ATOM_ORDER
from protdp.model.multimer.crop_permutation import align_cropped_chains
from protdp.model.ground_truth import structure_truth
from protdp.model.losses import (_check_finite, distogram_loss, experimentally_resolved_loss,
                                 masked_msa_loss, pae_loss, plddt_loss, structure_losses)
from protdp.model.rigid import Rigid
from protdp.model.violations import violation_loss

INTRA_CHAIN_FAPE = (10.0, 10.0)      # (clamp, length scale) Å: intra_chain_fape
INTERFACE_FAPE = (30.0, 20.0)        # (clamp, length scale) Å: interface_fape
CHAIN_INDEX_OFFSET = 100_000         # > any chain length: chains never look bonded
CHAIN_CENTRE_CLAMP = -4.0            # Å (OpenFold chain_center_of_mass.clamp_distance)
CHAIN_CENTRE_SCALE = 1.0 / 20.0      # 1/Å
CHAIN_CENTRE_WEIGHT = 0.05           # OpenFold multimer loss.chain_center_of_mass.weight
CA = ATOM_ORDER["CA"]
TERM_KEYS = ("aux", "backbone_fape", "chain_centre", "distogram", "experimentally_resolved",
             "fape", "interface_fape", "intra_chain_fape", "masked_msa", "pae", "plddt",
             "torsion", "violation")
FULL_TRUTH_KEYS = ("true_all_atom_positions", "true_all_atom_mask", "true_asym_id",
                   "true_entity_id")


def pair_masked_fape(pred: Rigid, true: Rigid, frames_mask, pred_points, true_points,
                     points_mask, pair_mask, clamp: float | None, length_scale: float,
                     eps: float = 1e-4) -> torch.Tensor:
    """Algorithm 28 over the (frame, point) pairs of `pair_mask` [F, P]: frames [F], points
    [P, 3], masks [F] / [P] -> scalar."""
    local_pred = pred.unsqueeze(-1).invert_apply(pred_points[None])               # [F, P, 3]
    local_true = true.unsqueeze(-1).invert_apply(true_points[None])
    dist = torch.sqrt(((local_pred - local_true) ** 2).sum(-1) + eps)              # [F, P]
    if clamp is not None:
        dist = dist.clamp(max=clamp)
    w = frames_mask[:, None] * points_mask[None, :] * pair_mask
    return (dist / length_scale * w).sum() / (w.sum() + eps)


def complex_backbone_fape(traj: torch.Tensor, truth: dict, asym_id: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """traj [layers, L, 4, 4] backbone frames -> (intra-chain, interface) FAPE, layer means."""
    gt = truth["frames"].index((..., 0))                                           # [L]
    mask = truth["backbone_mask"]
    same = (asym_id[:, None] == asym_id[None, :]).to(mask.dtype)                   # [L, L]
    intra, inter = [], []
    for layer in range(traj.shape[0]):
        f = Rigid.from_tensor_4x4(traj[layer].to(gt.trans.dtype))
        intra.append(pair_masked_fape(f, gt, mask, f.trans, gt.trans, mask, same,
                                      *INTRA_CHAIN_FAPE))
        inter.append(pair_masked_fape(f, gt, mask, f.trans, gt.trans, mask, 1.0 - same,
                                      *INTERFACE_FAPE))
    return torch.stack(intra).mean(), torch.stack(inter).mean()


def chain_centre_loss(pred_ca, true_ca, mask, asym_id, eps: float = 1e-10) -> torch.Tensor:
    """pred_ca / true_ca [L, 3], mask [L], asym_id [L] -> scalar (module docstring)."""
    chains = torch.unique(asym_id)
    onehot = (asym_id[None, :] == chains[:, None]).to(mask.dtype) * mask[None]    # [C, L]
    exists = (onehot.sum(-1) > 0).to(mask.dtype)
    count = onehot.sum(-1, keepdim=True) + eps

    def centres(x):
        return onehot @ x.to(mask.dtype) / count                                    # [C, 3]

    def dists(c):
        return torch.sqrt(((c[:, None] - c[None]) ** 2).sum(-1) + eps)            # [C, C]

    d_pred, d_true = dists(centres(pred_ca)), dists(centres(true_ca))
    loss = torch.clamp(CHAIN_CENTRE_SCALE * (d_pred - d_true - CHAIN_CENTRE_CLAMP), max=0) ** 2
    pair = exists[:, None] * exists[None, :]
    return (loss * pair).sum() / (pair.sum() + eps)


def permuted_truth(outputs: dict, batch: dict) -> tuple[dict, dict]:
    """The batch with its truth (all_atom_positions / all_atom_mask) taken from the full
    complex under the chain permutation that best fits the prediction; without the full truth
    (FULL_TRUTH_KEYS) the batch's own truth, unpermuted. -> (batch, {pred asym: true asym})."""
    if not all(k in batch for k in FULL_TRUTH_KEYS):
        return batch, {}
    full_pos, full_mask = batch["true_all_atom_positions"], batch["true_all_atom_mask"]
    perm = align_cropped_chains(
        outputs["final_atom_positions"][:, CA].detach().double().cpu().numpy(),
        batch["asym_id"].cpu().numpy(), batch["entity_id"].cpu().numpy(),
        batch["residue_index"].cpu().numpy(), full_pos[:, CA].double().cpu().numpy(),
        full_mask[:, CA].double().cpu().numpy(), batch["true_asym_id"].cpu().numpy(),
        batch["true_entity_id"].cpu().numpy())
    index = torch.as_tensor(perm.index, device=full_pos.device)
    out = dict(batch)
    out["all_atom_positions"], out["all_atom_mask"] = full_pos[index], full_mask[index]
    return out, perm.mapping


def complex_loss(outputs: dict, batch: dict, config) -> tuple[torch.Tensor, dict]:
    """Total loss and the unweighted terms (scalars) of one complex; `config` a MultimerConfig
    (its trunk's LossConfig gives the AF2 weights)."""
    cfg = config.trunk
    lc = cfg.loss
    _check_finite({k: v for k, v in batch.items() if k in ("all_atom_positions", "msa_mask",
                                                           "seq_mask")}, "batch")
    _check_finite({"final_atom_positions": outputs["final_atom_positions"],
                   "sm.frames": outputs["sm"]["frames"]}, "model outputs")
    batch, _ = permuted_truth(outputs, batch)
    truth = structure_truth(batch)
    terms = structure_losses(outputs, batch, lc, truth)
    asym = batch["asym_id"]
    terms["intra_chain_fape"], terms["interface_fape"] = complex_backbone_fape(
        outputs["sm"]["frames"], truth, asym)
    terms["backbone_fape"] = terms["intra_chain_fape"] + terms["interface_fape"]
    terms["distogram"] = distogram_loss(outputs["distogram_logits"], truth, cfg)
    sample = outputs.get("msa_sample")
    if sample is not None:
        terms["masked_msa"] = masked_msa_loss(outputs["masked_msa_logits"], sample)
    terms["plddt"] = plddt_loss(outputs["plddt_logits"], outputs, truth, batch, lc)
    terms["pae"] = pae_loss(outputs["pae_logits"], outputs, truth, batch, cfg)
    terms["experimentally_resolved"] = experimentally_resolved_loss(
        outputs["experimentally_resolved_logits"], truth, batch, lc)
    chain_index = batch["residue_index"].long() + CHAIN_INDEX_OFFSET * asym.long()
    terms["violation"] = violation_loss(outputs["sm"]["atom14_positions"], batch["aatype"],
                                        chain_index, batch["seq_mask"],
                                        lc.violation_tolerance_factor, lc.clash_overlap_tolerance)
    ca_mask = truth["atom37_mask"][:, CA]
    terms["chain_centre"] = chain_centre_loss(outputs["final_atom_positions"][:, CA],
                                              truth["atom37"][:, CA], ca_mask, asym)
    terms = {k: v.mean() for k, v in terms.items()}
    terms["aux"] = terms["backbone_fape"] + terms["torsion"]
    weights = {"fape": lc.fape_weight, "aux": lc.aux_weight, "distogram": lc.distogram_weight,
               "masked_msa": lc.masked_msa_weight, "plddt": lc.plddt_weight, "pae": lc.pae_weight,
               "experimentally_resolved": lc.experimentally_resolved_weight,
               "violation": lc.violation_weight, "chain_centre": CHAIN_CENTRE_WEIGHT}
    total = sum(weights[k] * terms[k] for k in weights if k in terms)
    return total, terms
