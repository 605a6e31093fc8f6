"""Complex confidence from the predicted-aligned-error logits (AlphaFold-Multimer, Evans et al.
2021, §"Interface pTM"; AF2 supplement §1.9.7 Eq. 40 for pTM; AlphaFold v2.3.2
`confidence.predicted_tm_score` and `model.get_confidence_metrics(multimer_mode=True)`):

* pTM   = max over alignment frames i of  sum_j w_ij E[f(e_ij)] / sum_j w_ij, with the
          TM-score term f(e) = 1 / (1 + (e / d0)^2), d0 = 1.24 (max(N, 19) - 15)^(1/3) - 1.8,
          N = number of residues weighted, w_ij = w_i w_j (all ones for the whole complex);
* ipTM  = the same with w_ij = 0 for i, j in the same chain (interface pairs only);
* ranking confidence = 0.8 ipTM + 0.2 pTM (`RANKING_IPTM_WEIGHT`);
* interface PAE: the mean expected aligned error over residue pairs in different chains (the
  off-diagonal blocks of the PAE matrix), and per chain pair [C, C] (diagonal: within a chain);
* chain-pair ipTM matrix [C, C]: entry (a, b), a != b, is the ipTM of the complex restricted to
  chains a and b (w = 1 on their residues, so d0 counts both); the diagonal is the pTM of chain
  a alone. AlphaFold v2.3.2 has no such matrix (ColabFold and AlphaFold 3 report one with this
  definition); for a dimer entry (0, 1) equals the complex ipTM.

The expectation is over bins with centres `pae_bin_centres` (AF2 `_calculate_bin_centers`).
Everything is computed in float32 or wider whatever the logits' dtype (bf16 trunk).
"""

from __future__ import annotations

import torch

RANKING_IPTM_WEIGHT = 0.8          # model.get_confidence_metrics: 0.8 * ipTM + 0.2 * pTM
MIN_TM_RESIDUES = 19               # confidence.predicted_tm_score: clipped_num_res = max(N, 19)


def tm_term(logits: torch.Tensor, centres: torch.Tensor, num_res: torch.Tensor) -> torch.Tensor:
    """E[f(e_ij)] under the predicted error distribution: logits [*, L, L, bins], centres
    [bins], num_res [*] (residues weighted) -> [*, L, L]."""
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    n = num_res.to(probs.dtype).clamp(min=MIN_TM_RESIDUES)
    d0 = 1.24 * (n - 15.0) ** (1.0 / 3.0) - 1.8                                # [*]
    f = 1.0 / (1.0 + (centres.to(probs) / d0[..., None]) ** 2)                  # [*, bins]
    return (probs * f[..., None, None, :]).sum(-1)


def predicted_tm(logits: torch.Tensor, centres: torch.Tensor,
                 residue_weights: torch.Tensor | None = None,
                 asym_id: torch.Tensor | None = None) -> torch.Tensor:
    """pTM (asym_id None) or ipTM (asym_id [*, L]: only pairs across chains count).
    logits [*, L, L, bins], residue_weights [*, L] (default all ones) -> [*]."""
    if residue_weights is None:
        residue_weights = logits.new_ones(logits.shape[:-2])
    w = residue_weights.to(torch.promote_types(logits.dtype, torch.float32))   # [*, L]
    num_res = torch.floor(w.sum(-1))                     # AF: int(sum(residue_weights))
    term = tm_term(logits, centres, num_res)                                    # [*, L, L]
    pair_w = w[..., :, None] * w[..., None, :]                                  # [*, L, L]
    if asym_id is not None:
        pair_w = pair_w * (asym_id[..., :, None] != asym_id[..., None, :]).to(w)
    normed = pair_w / (1e-8 + pair_w.sum(-1, keepdim=True))
    per_frame = (term * normed).sum(-1)                                         # [*, L]
    best = (per_frame * w).argmax(-1, keepdim=True)       # first maximum, as numpy's argmax
    return per_frame.gather(-1, best)[..., 0]


def expected_aligned_error(logits: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """PAE (confidence.compute_predicted_aligned_error): [*, L, L, bins] -> [*, L, L] (Å)."""
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return (probs * centres.to(probs)).sum(-1)


def interface_pae(pae: torch.Tensor, asym_id: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """pae [L, L], asym_id [L] -> (mean PAE over cross-chain pairs (NaN for one chain),
    per chain pair mean [C, C] in ascending asym id order)."""
    chains = torch.unique(asym_id)
    member = (asym_id[None, :] == chains[:, None]).to(pae.dtype)                # [C, L]
    sums = member @ pae @ member.T                                              # [C, C]
    counts = member.sum(-1)
    per_pair = sums / (counts[:, None] * counts[None, :])
    cross = asym_id[:, None] != asym_id[None, :]
    return pae[cross].mean(), per_pair


def ranking_confidence(iptm: torch.Tensor, ptm: torch.Tensor) -> torch.Tensor:
    return RANKING_IPTM_WEIGHT * iptm + (1.0 - RANKING_IPTM_WEIGHT) * ptm


def chain_pair_iptm(logits: torch.Tensor, centres: torch.Tensor, asym_id: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per chain pair ipTM (see the module docstring) for one complex: logits [L, L, bins],
    asym_id [L] -> (matrix [C, C] symmetric, the chains' asym ids [C] in ascending order)."""
    chains = torch.unique(asym_id)                                              # [C]
    member = (asym_id[None, :] == chains[:, None])                              # [C, L]
    C = len(chains)
    out = logits.new_zeros((C, C), dtype=torch.promote_types(logits.dtype, torch.float32))
    for a in range(C):
        out[a, a] = predicted_tm(logits, centres, member[a].to(out.dtype))
        for b in range(a + 1, C):
            w = (member[a] | member[b]).to(out.dtype)
            out[a, b] = out[b, a] = predicted_tm(logits, centres, w, asym_id)
    return out, chains


def complex_confidence(logits: torch.Tensor, centres: torch.Tensor, asym_id: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
    """pTM, ipTM, ranking confidence, the chain-pair ipTM matrix and the interface PAE of one
    complex."""
    ptm = predicted_tm(logits, centres)
    pae = expected_aligned_error(logits, centres)
    iface, iface_pairs = interface_pae(pae, asym_id)
    iptm = predicted_tm(logits, centres, asym_id=asym_id)
    matrix, chains = chain_pair_iptm(logits, centres, asym_id)
    return {"ptm": ptm, "iptm": iptm, "ranking_confidence": ranking_confidence(iptm, ptm),
            "chain_pair_iptm": matrix, "chain_asym_ids": chains, "pae": pae,
            "interface_pae": iface, "chain_pair_pae": iface_pairs}


ACTIFPTM_CONTACT = 8.0             # Å: ColabFold extra_ptm.get_contact_map(result, 8)


def contact_probability(distogram_logits: torch.Tensor, inner_edges: torch.Tensor,
                        cutoff: float = ACTIFPTM_CONTACT) -> torch.Tensor:
    """P(Cβ–Cβ < cutoff) from the distogram: the softmax mass of the bins whose lower edge
    (0, then the inner edges) is below `cutoff` (ColabFold `extra_ptm.get_contact_map`).
    logits [L, L, bins], inner_edges [bins - 1] -> [L, L]."""
    probs = torch.softmax(distogram_logits.to(torch.promote_types(distogram_logits.dtype,
                                                                  torch.float32)), dim=-1)
    lower = torch.cat([inner_edges.new_zeros(1), inner_edges]).to(probs)        # [bins]
    return (probs * (lower < cutoff).to(probs)).sum(-1)


def chain_pair_actifptm(logits: torch.Tensor, centres: torch.Tensor, contact: torch.Tensor,
                        asym_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """actifpTM per chain pair (Varga, Ovchinnikov & Schueler-Furman 2025, "actifpTM: a refined
    confidence metric of AlphaFold2 predictions involving flexible regions", Bioinformatics
    41:btaf107; ColabFold `alphafold/extra_ptm.get_actifptm_probs`, the contact-probability
    variant): ipTM of chains a and b where the pair weights are the predicted contact
    probabilities c_ij (`contact_probability`) between a and b instead of all ones,

        actifpTM(a, b) = max_{i in a ∪ b}  sum_j c_ij E[f(e_ij)] / (1e-8 + sum_j c_ij),

    j over the other chain, f the TM term with d0 from the whole complex length (ColabFold's
    `num_res = residue_weights.shape[0]`, clipped to 19). logits [L, L, bins], centres [bins],
    contact [L, L], asym_id [L] -> (matrix [C, C] symmetric, NaN diagonal; chain asym ids [C]).
    """
    L = logits.shape[0]
    term = tm_term(logits, centres, logits.new_tensor(float(L)))               # [L, L]
    cross = (asym_id[:, None] != asym_id[None, :]).to(term)
    term = term * cross
    chains = torch.unique(asym_id)
    member = (asym_id[None, :] == chains[:, None]).to(term)                     # [C, L]
    C = len(chains)
    out = torch.full((C, C), float("nan"), dtype=term.dtype, device=term.device)
    contact = contact.to(term)
    for a in range(C):
        for b in range(a + 1, C):
            block = member[a][:, None] * member[b][None, :]                     # [L, L]
            w = contact * (block + block.T)
            per_frame = (term * w / (1e-8 + w.sum(-1, keepdim=True))).sum(-1)  # [L]
            out[a, b] = out[b, a] = (per_frame * (member[a] + member[b])).max()
    return out, chains
