"""Input embedding (AF2 supplement Alg. 3), relative positions (Alg. 4), recycling (Alg. 32)
and the extra-MSA embedding (§1.7.2).

Input features follow `docs/batch_format.md`: `target_feat` is the one-hot query `aatype`
(21 classes), `msa_feat` the one-hot MSA tokens (23 classes) + has_deletion + deletion_value.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from protdp.data.residues import NUM_AATYPE, NUM_MSA_TOKENS, RESTYPES
from protdp.model.config import ModelConfig
from protdp.model.primitives import LayerNorm, Linear

MSA_FEAT_DIM = NUM_MSA_TOKENS + 2
GLY_ID = RESTYPES.index("G")


def make_msa_feat(msa: torch.Tensor, has_deletion: torch.Tensor, deletion_value: torch.Tensor) -> torch.Tensor:
    """msa [*, S, L] int, has_deletion / deletion_value [*, S, L] -> msa_feat [*, S, L, 25]."""
    one_hot = F.one_hot(msa.long(), NUM_MSA_TOKENS).to(deletion_value.dtype)
    return torch.cat([one_hot, has_deletion[..., None], deletion_value[..., None]], dim=-1)


def pseudo_beta(aatype: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """CB position ([*, L, 5, 3] backbone atoms N, CA, C, O, CB), CA for glycine -> [*, L, 3]."""
    is_gly = (aatype == GLY_ID)[..., None]
    return torch.where(is_gly, positions[..., 1, :], positions[..., 4, :])


class InputEmbedder(nn.Module):
    """Algorithms 3 and 4: initial MSA and pair representations."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.relpos_k = cfg.relpos_k
        self.linear_tf_z_i = Linear(NUM_AATYPE, cfg.c_z)
        self.linear_tf_z_j = Linear(NUM_AATYPE, cfg.c_z)
        self.linear_tf_m = Linear(NUM_AATYPE, cfg.c_m)
        self.linear_msa_m = Linear(MSA_FEAT_DIM, cfg.c_m)
        self.linear_relpos = Linear(2 * cfg.relpos_k + 1, cfg.c_z)

    def relpos(self, residue_index: torch.Tensor) -> torch.Tensor:
        """Algorithm 4: one-hot of clip(i - j, -k, k) -> [*, L, L, C_z]."""
        d = residue_index[..., :, None] - residue_index[..., None, :]
        d = torch.clamp(d, -self.relpos_k, self.relpos_k) + self.relpos_k
        return self.linear_relpos(F.one_hot(d.long(), 2 * self.relpos_k + 1).float())

    def forward(self, aatype, residue_index, msa_feat):
        target_feat = F.one_hot(aatype.long().clamp(max=NUM_AATYPE - 1), NUM_AATYPE).float()
        z = self.linear_tf_z_i(target_feat)[..., :, None, :] + self.linear_tf_z_j(target_feat)[..., None, :, :]
        z = z + self.relpos(residue_index)                                   # [*, L, L, C_z]
        m = self.linear_msa_m(msa_feat) + self.linear_tf_m(target_feat)[..., None, :, :]  # [*, S, L, C_m]
        return m, z


class RecyclingEmbedder(nn.Module):
    """Algorithm 32: embed the previous iteration's first MSA row, pair rep and CB distances."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_m = LayerNorm(cfg.c_m)
        self.norm_z = LayerNorm(cfg.c_z)
        self.linear_d = Linear(cfg.recycle_bins, cfg.c_z)
        self.register_buffer("lower", torch.linspace(cfg.recycle_min_bin, cfg.recycle_max_bin,
                                                     cfg.recycle_bins), persistent=False)

    def forward(self, m_row0_prev, z_prev, x_prev):
        # m_row0_prev [*, L, C_m], z_prev [*, L, L, C_z], x_prev [*, L, 3] pseudo-beta (Å)
        d = torch.linalg.norm(x_prev[..., :, None, :] - x_prev[..., None, :, :], dim=-1)
        upper = torch.cat([self.lower[1:], self.lower.new_tensor([1e8])])
        d_one_hot = ((d[..., None] > self.lower) & (d[..., None] < upper)).to(z_prev.dtype)
        return self.norm_m(m_row0_prev), self.norm_z(z_prev) + self.linear_d(d_one_hot)
