"""Relative position and chain encoding of AlphaFold-Multimer (Evans et al. 2021, §"Relative
chain encoding"; AlphaFold v2.3.2 `modules_multimer.EmbeddingsAndEvoformer._relative_encoding`,
parameters `~_relative_encoding/position_activations`), replacing AF2's Algorithm 4.

Per residue pair (i, j), from residue_index r, asym_id (chain), entity_id (distinct sequence)
and sym_id (copy number within the entity), all [*, L]:
  * position: one-hot over 2k + 2 bins of clip(r_i - r_j, -k, k) + k within a chain, and the
    extra bin 2k + 1 for a pair in different chains (k = `max_relative_idx` = 32);
  * same entity: 1 when i and j belong to copies of the same sequence;
  * chain: one-hot over 2c + 2 bins of clip(sym_i - sym_j, -c, c) + c within an entity, and the
    bin 2c + 1 across entities (c = `max_relative_chain` = 2).
Concatenated (2k + 2 + 1 + 2c + 2 = 73 features) and projected by one linear layer to C_z.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from protdp.model.primitives import Linear

MAX_RELATIVE_IDX = 32              # model_config: embeddings_and_evoformer.max_relative_idx
MAX_RELATIVE_CHAIN = 2             # model_config: embeddings_and_evoformer.max_relative_chain


def relative_chain_features(residue_index: torch.Tensor, asym_id: torch.Tensor,
                            entity_id: torch.Tensor, sym_id: torch.Tensor,
                            max_relative_idx: int = MAX_RELATIVE_IDX,
                            max_relative_chain: int = MAX_RELATIVE_CHAIN,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The one-hot features above: [*, L] ids -> [*, L, L, 2k + 2 + 1 + 2c + 2]."""
    k, c = max_relative_idx, max_relative_chain
    same_chain = asym_id[..., :, None] == asym_id[..., None, :]                 # [*, L, L]
    offset = residue_index[..., :, None].long() - residue_index[..., None, :].long()
    pos = torch.where(same_chain, (offset + k).clamp(0, 2 * k), 2 * k + 1)
    same_entity = entity_id[..., :, None] == entity_id[..., None, :]
    rel_sym = sym_id[..., :, None].long() - sym_id[..., None, :].long()
    chain = torch.where(same_entity, (rel_sym + c).clamp(0, 2 * c), 2 * c + 1)
    return torch.cat([F.one_hot(pos, 2 * k + 2).to(dtype), same_entity[..., None].to(dtype),
                      F.one_hot(chain, 2 * c + 2).to(dtype)], dim=-1)


def relative_chain_dim(max_relative_idx: int = MAX_RELATIVE_IDX,
                       max_relative_chain: int = MAX_RELATIVE_CHAIN) -> int:
    return 2 * max_relative_idx + 2 + 1 + 2 * max_relative_chain + 2


class RelativeChainEncoding(nn.Module):
    """The multimer pair embedding of relative positions and chains -> [*, L, L, C_z]."""

    def __init__(self, c_z: int, max_relative_idx: int = MAX_RELATIVE_IDX,
                 max_relative_chain: int = MAX_RELATIVE_CHAIN):
        super().__init__()
        self.max_relative_idx, self.max_relative_chain = max_relative_idx, max_relative_chain
        self.linear = Linear(relative_chain_dim(max_relative_idx, max_relative_chain), c_z)

    def forward(self, residue_index, asym_id, entity_id, sym_id):
        feats = relative_chain_features(residue_index, asym_id, entity_id, sym_id,
                                        self.max_relative_idx, self.max_relative_chain,
                                        dtype=self.linear.weight.dtype)
        return self.linear(feats)


TARGET_FEAT_DIM_MULTIMER = 21      # one_hot(aatype, 21): no between-segment bit (AF2 has 22)
MSA_FEAT_DIM = 49                  # create_msa_feat: 23 + 1 + 1 + 23 + 1
EXTRA_MSA_FEAT_DIM = 25            # create_extra_msa_feature: 23 + 1 + 1


class MultimerInputEmbedder(nn.Module):
    """AlphaFold-Multimer's input embedding (`EmbeddingsAndEvoformer.__call__` up to the
    recycling terms): target_feat = one_hot(aatype, 21);
    m = preprocess_1d(target_feat) + preprocess_msa(msa_feat)            [*, S, L, C_m]
    z = left_single(target_feat)_i + right_single(target_feat)_j + relative encoding
                                                                        [*, L, L, C_z]
    and the extra-MSA activations extra_msa_activations(extra_msa_feat) [*, E, L, C_e].
    `ALPHAFOLD_NAMES` maps each parameter to its AlphaFold array (under
    `alphafold/alphafold_iteration/evoformer/`; AlphaFold stores weights [in, out])."""

    ALPHAFOLD_NAMES = {
        "preprocess_1d": "preprocess_1d", "preprocess_msa": "preprocess_msa",
        "left_single": "left_single", "right_single": "right_single",
        "extra_msa_activations": "extra_msa_activations",
        "relative.linear": "~_relative_encoding/position_activations",
    }

    def __init__(self, c_m: int, c_z: int, c_e: int):
        super().__init__()
        self.preprocess_1d = Linear(TARGET_FEAT_DIM_MULTIMER, c_m)
        self.preprocess_msa = Linear(MSA_FEAT_DIM, c_m)
        self.left_single = Linear(TARGET_FEAT_DIM_MULTIMER, c_z)
        self.right_single = Linear(TARGET_FEAT_DIM_MULTIMER, c_z)
        self.extra_msa_activations = Linear(EXTRA_MSA_FEAT_DIM, c_e)
        self.relative = RelativeChainEncoding(c_z)

    def forward(self, aatype, residue_index, asym_id, entity_id, sym_id, msa_feat,
                extra_msa_feat):
        dtype = self.preprocess_1d.weight.dtype
        tf = F.one_hot(aatype.long(), TARGET_FEAT_DIM_MULTIMER).to(dtype)      # [*, L, 21]
        m = self.preprocess_1d(tf)[..., None, :, :] + self.preprocess_msa(msa_feat.to(dtype))
        z = self.left_single(tf)[..., :, None, :] + self.right_single(tf)[..., None, :, :]
        z = z + self.relative(residue_index, asym_id, entity_id, sym_id)
        return m, z, self.extra_msa_activations(extra_msa_feat.to(dtype))

    def load_alphafold(self, arrays, prefix: str = "alphafold/alphafold_iteration/evoformer/"):
        """Copy AlphaFold's arrays {flat name: array} into this module (shapes checked)."""
        with torch.no_grad():
            for mod, af in self.ALPHAFOLD_NAMES.items():
                lin = self.get_submodule(mod)
                w, b = arrays[f"{prefix}{af}//weights"], arrays[f"{prefix}{af}//bias"]
                if tuple(w.shape) != tuple(lin.weight.shape[::-1]):
                    raise ValueError(f"{prefix}{af}: shape {tuple(w.shape)}, expected "
                                     f"{tuple(lin.weight.shape[::-1])}")
                lin.weight.copy_(torch.as_tensor(w).T)
                lin.bias.copy_(torch.as_tensor(b))
