"""AlphaFold-Multimer's in-model MSA processing (Evans et al. 2021; AlphaFold v2.3.2
`modules_multimer`: `make_msa_profile`, `sample_msa`, `make_masked_msa`,
`nearest_neighbor_clusters`, `create_msa_feat`, `create_extra_msa_feature`). Unlike AF2's
monomer pipeline (supplement §1.2.5-1.2.7), the multimer model samples, masks and clusters
its MSA inside the network, once per recycling iteration, from the merged features of
`protdp.complex.features`:

1. order all rows by Gumbel-perturbed logits: rows without any unmasked position last, rows
   flagged by `cluster_bias_mask` (each chain's query) first, the rest in random order;
   the first `num_msa` rows are the cluster centres, the others the extra MSA;
2. BERT-style masking of the centres (`replace_fraction` of the unpadded positions replaced
   by a draw from uniform / profile / same / [MASK]); the centres are then multiplied by
   their mask;
3. every extra row joins the centre it agrees with most (softmax over 1000 x agreement, gaps
   and masks not counted), giving each centre a cluster profile and mean deletion;
4. msa_feat [S, L, 49] = one-hot(23), has_deletion, arctan(d / 3) * 2 / pi, cluster profile
   (23), arctan(cluster mean deletion / 3) * 2 / pi; extra features [E, L, 25] for the first
   `num_extra_msa` extra rows.

The random draws use torch generators (the order can also be given, e.g. the one DeepMind's
run recorded, to reproduce it exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from protdp.data.residues import GAP_ID, MASK_ID, NUM_MSA_TOKENS

NUM_MSA = 508                  # model_config(multimer): embeddings_and_evoformer.num_msa
NUM_EXTRA_MSA = 2048           # embeddings_and_evoformer.num_extra_msa
CLUSTER_SHARPNESS = 1e3        # nearest_neighbor_clusters: softmax(1e3 * agreement)
GUMBEL_EPS = 1e-6              # gumbel_noise epsilon
PROFILE_CLASSES = 22           # make_msa_profile: 20 aa + X + gap


@dataclass(frozen=True)
class MaskedMsaConfig:
    """BERT masking (model_config: embeddings_and_evoformer.masked_msa; stock values)."""
    uniform_prob: float = 0.1
    profile_prob: float = 0.1
    same_prob: float = 0.1
    replace_fraction: float = 0.15


def msa_profile(msa: torch.Tensor, msa_mask: torch.Tensor) -> torch.Tensor:
    """Masked mean of the one-hot rows: msa [N, L] long, msa_mask [N, L] -> [L, 22]."""
    one_hot = F.one_hot(msa.long(), PROFILE_CLASSES).to(msa_mask.dtype)
    return (msa_mask[..., None] * one_hot).sum(0) / (msa_mask.sum(0)[..., None] + 1e-10)


def gumbel_order(msa_mask: torch.Tensor, cluster_bias_mask: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Step 1: a random row order [N] (long), as `gumbel_argsort_sample_idx` draws it."""
    logits = (msa_mask.sum(-1).clamp(0.0, 1.0) - 1.0) * 1e6 + cluster_bias_mask * 1e6
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float32,
                   device=logits.device)
    gumbel = -torch.log(-torch.log(u + GUMBEL_EPS) + GUMBEL_EPS)
    return torch.argsort(logits.float() + gumbel, descending=True)


def masked_msa(msa: torch.Tensor, msa_mask: torch.Tensor, profile: torch.Tensor,
               cfg: MaskedMsaConfig, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2 (`make_masked_msa`): -> (masked msa [S, L] long, positions replaced [S, L])."""
    random_aa = torch.tensor([0.05] * 20 + [0.0, 0.0], dtype=torch.float32, device=msa.device)
    probs = (cfg.uniform_prob * random_aa + cfg.profile_prob * profile.float() +
             cfg.same_prob * F.one_hot(msa.long(), PROFILE_CLASSES).float())   # [S, L, 22]
    mask_prob = 1.0 - cfg.profile_prob - cfg.same_prob - cfg.uniform_prob
    probs = F.pad(probs, (0, 1), value=mask_prob)                                # [S, L, 23]
    replaced = (torch.rand(msa.shape, generator=generator, device=msa.device)
                < cfg.replace_fraction)
    replaced = replaced & (msa_mask > 0)
    if cfg.replace_fraction > 0:
        u = torch.rand(probs.shape, generator=generator, device=probs.device)
        draw = torch.argmax(torch.log(probs + 1e-6) -
                            torch.log(-torch.log(u + GUMBEL_EPS) + GUMBEL_EPS), dim=-1)
        out = torch.where(replaced, draw, msa.long())
    else:
        out = msa.long()
    return out * (msa_mask > 0).long(), replaced


def nearest_neighbor_clusters(msa, msa_mask, deletion, extra_msa, extra_mask, extra_deletion,
                              gap_agreement_weight: float = 0.0):
    """Step 3: centres msa [S, L], extra rows [E, L] -> (cluster profile [S, L, 23],
    cluster mean deletion [S, L]); a centre always counts itself."""
    weights = torch.ones(NUM_MSA_TOKENS, dtype=msa_mask.dtype, device=msa_mask.device)
    weights[GAP_ID], weights[MASK_ID] = gap_agreement_weight, 0.0
    m1h = msa_mask[..., None] * F.one_hot(msa.long(), NUM_MSA_TOKENS).to(msa_mask)  # [S, L, 23]
    e1h = extra_mask[..., None] * F.one_hot(extra_msa.long(), NUM_MSA_TOKENS).to(msa_mask)
    agreement = torch.einsum("mrc,nrc->nm", e1h, weights * m1h)                  # [S, E]
    assign = torch.softmax(CLUSTER_SHARPNESS * agreement, dim=0)
    assign = assign * torch.einsum("mr,nr->mn", msa_mask, extra_mask)           # [S, E]
    count = assign.sum(-1) + 1.0                                                 # [S]
    profile = (torch.einsum("nm,mrc->nrc", assign, e1h) + m1h) / count[:, None, None]
    dels = torch.einsum("nm,mc->nc", assign, extra_mask * extra_deletion) + deletion
    return profile, dels / count[:, None]


def _deletion_value(d: torch.Tensor) -> torch.Tensor:
    return torch.atan(d / 3.0) * (2.0 / math.pi)


def msa_feat(msa, deletion, cluster_profile, cluster_deletion_mean) -> torch.Tensor:
    """Step 4: [S, L] -> [S, L, 49] (`create_msa_feat`)."""
    return torch.cat([F.one_hot(msa.long(), NUM_MSA_TOKENS).to(deletion),
                      deletion.clamp(0.0, 1.0)[..., None], _deletion_value(deletion)[..., None],
                      cluster_profile, _deletion_value(cluster_deletion_mean)[..., None]], -1)


def extra_msa_feat(extra_msa, extra_deletion, extra_mask, num_extra_msa: int):
    """Step 4, extra rows (`create_extra_msa_feature`): -> ([E', L, 25], mask [E', L])."""
    e, d = extra_msa[:num_extra_msa], extra_deletion[:num_extra_msa]
    feat = torch.cat([F.one_hot(e.long(), NUM_MSA_TOKENS).to(d), d.clamp(0.0, 1.0)[..., None],
                      _deletion_value(d)[..., None]], -1)
    return feat, extra_mask[:num_extra_msa]


def sample_msa_features(msa, deletion_matrix, msa_mask, cluster_bias_mask, bert_mask=None, *,
                        num_msa: int = NUM_MSA, num_extra_msa: int = NUM_EXTRA_MSA,
                        masking: MaskedMsaConfig = MaskedMsaConfig(),
                        order: torch.Tensor | None = None,
                        generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Steps 1-4 for one recycling iteration of one complex (merged features [N, L]).
    Returns msa_feat [S, L, 49], msa_mask [S, L], extra_msa_feat [E', L, 25], extra_msa_mask
    [E', L], true_msa / bert_mask [S, L] (targets of the masked-MSA head: the features'
    bert_mask, if given, times the positions replaced) and the order."""
    profile = msa_profile(msa, msa_mask)
    if order is None:
        order = gumbel_order(msa_mask, cluster_bias_mask, generator)
    sel, extra = order[:num_msa], order[num_msa:]
    centres, replaced = masked_msa(msa[sel], msa_mask[sel], profile[None].expand(
        len(sel), -1, -1), masking, generator)
    prof, del_mean = nearest_neighbor_clusters(centres, msa_mask[sel], deletion_matrix[sel],
                                               msa[extra], msa_mask[extra],
                                               deletion_matrix[extra])
    e_feat, e_mask = extra_msa_feat(msa[extra], deletion_matrix[extra], msa_mask[extra],
                                    num_extra_msa)
    return {"msa_feat": msa_feat(centres, deletion_matrix[sel], prof, del_mean),
            "msa_mask": msa_mask[sel], "extra_msa_feat": e_feat, "extra_msa_mask": e_mask,
            "true_msa": msa[sel].long(),
            "bert_mask": replaced.to(msa_mask.dtype) * (1.0 if bert_mask is None else
                                                        bert_mask[sel]),
            "order": order}
