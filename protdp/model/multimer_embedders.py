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
