"""Input embedding (AF2 supplement Alg. 3), relative positions (Alg. 4), recycling (Alg. 32)
and the extra-MSA embedding (§1.7.2), on AF2's input features (`protdp.model.inputs`):
`target_feat` [*, L, 22], `msa_feat` [*, N, L, 49], extra-MSA features [*, E, L, 25].

Every tensor is built in the dtype of the module's weights, so the model runs end to end in
float64 as well as float32 (and under bf16 autocast).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from protdp.model.all_atom import pseudo_beta
from protdp.model.config import ModelConfig
from protdp.model.inputs import MSA_FEAT_DIM, TARGET_FEAT_DIM
from protdp.model.primitives import LayerNorm, Linear

__all__ = ["InputEmbedder", "RecyclingEmbedder", "pseudo_beta"]


class InputEmbedder(nn.Module):
    """Algorithms 3 and 4: initial MSA and pair representations."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.relpos_k = cfg.relpos_k
        self.linear_tf_z_i = Linear(TARGET_FEAT_DIM, cfg.c_z)          # left_single
        self.linear_tf_z_j = Linear(TARGET_FEAT_DIM, cfg.c_z)          # right_single
        self.linear_tf_m = Linear(TARGET_FEAT_DIM, cfg.c_m)            # preprocess_1d
        self.linear_msa_m = Linear(MSA_FEAT_DIM, cfg.c_m)              # preprocess_msa
        self.linear_relpos = Linear(2 * cfg.relpos_k + 1, cfg.c_z)     # pair_activiations (sic)

    def relpos(self, residue_index: torch.Tensor) -> torch.Tensor:
        """Algorithm 4: one-hot of clip(i - j, -k, k) -> [*, L, L, C_z]."""
        d = residue_index[..., :, None].long() - residue_index[..., None, :].long()
        d = torch.clamp(d, -self.relpos_k, self.relpos_k) + self.relpos_k
        dtype = self.linear_relpos.weight.dtype
        return self.linear_relpos(F.one_hot(d, 2 * self.relpos_k + 1).to(dtype))

    def forward(self, target_feat, residue_index, msa_feat):
        # target_feat [*, L, 22], residue_index [*, L], msa_feat [*, N, L, 49]
        z_i, z_j = self.linear_tf_z_i(target_feat), self.linear_tf_z_j(target_feat)   # [*, L, C_z]
        z = z_i[..., :, None, :] + z_j[..., None, :, :]
        z = z + self.relpos(residue_index)                                   # [*, L, L, C_z]
        m = self.linear_msa_m(msa_feat) + self.linear_tf_m(target_feat)[..., None, :, :]  # [*, N, L, C_m]
        return m, z


class RecyclingEmbedder(nn.Module):
    """Algorithm 32: embed the previous iteration's first MSA row, pair rep and CB distances."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_m = LayerNorm(cfg.c_m)                                 # prev_msa_first_row_norm
        self.norm_z = LayerNorm(cfg.c_z)                                 # prev_pair_norm
        self.linear_d = Linear(cfg.recycle_bins, cfg.c_z)               # prev_pos_linear
        self.bins = (cfg.recycle_min_bin, cfg.recycle_max_bin, cfg.recycle_bins)

    def forward(self, m_row0_prev, z_prev, x_prev):
        # m_row0_prev [*, L, C_m], z_prev [*, L, L, C_z], x_prev [*, L, 3] pseudo-beta (Å)
        d2 = ((x_prev[..., :, None, :] - x_prev[..., None, :, :]) ** 2).sum(-1, keepdim=True)
        lower = torch.linspace(*self.bins, device=d2.device).to(d2.dtype) ** 2  # squared, as AF2
        upper = torch.cat([lower[1:], lower.new_tensor([1e8])])
        d_one_hot = ((d2 > lower) & (d2 < upper)).to(z_prev.dtype)       # [*, L, L, bins]
        return self.norm_m(m_row0_prev), self.norm_z(z_prev) + self.linear_d(d_one_hot)
