"""AlphaFold-Multimer template embedding (Evans et al. 2021; AlphaFold v2.3.2
`modules_multimer.TemplateEmbedding`, `SingleTemplateEmbedding`, `TemplateEmbeddingIteration`,
`template_embedding_1d`). It differs from AF2's Alg. 16-17 (`protdp.model.template`):

- per template, 9 separate linear embeddings are summed (`template_pair_embedding_0..8`): the
  39-bin pseudo-beta distogram, the pseudo-beta pair mask, the template aatype one-hot of
  residue j and of residue i (22 each), the x, y, z components of the backbone unit vectors
  (frame of i: x along C - CA, N in the xy plane, origin CA), the backbone pair mask and the
  LayerNorm of the query pair representation; distance features are masked to intra-chain
  pairs (templates are per chain);
- the pair stack runs triangle multiplication (outgoing, incoming) before triangle attention
  (start, end), then the transition; a final LayerNorm;
- no pointwise attention: the templates are averaged (divided by the number of template slots,
  padded ones included), ReLU, `output_linear` to C_z;
- the MSA rows: aatype one-hot (22), sin / cos of the 4 chi angles and the chi mask (34
  channels) -> Linear -> ReLU -> Linear, appended to the MSA with the chi1 mask as MSA mask.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from protdp.data import residue_constants as rc
from protdp.data.residues import UNK_ID
from protdp.model.all_atom import _torsion_atoms, pseudo_beta
from protdp.model.evoformer import TriangleAttention, TriangleMultiplication
from protdp.model.primitives import LayerNorm, Linear, Transition

TEMPLATE_AATYPE_CLASSES = 22                    # 20 amino acids + X + gap
TEMPLATE_SINGLE_FEAT_DIM = TEMPLATE_AATYPE_CLASSES + 3 * 4          # 34
DGRAM_MIN, DGRAM_MAX, DGRAM_BINS = 3.25, 50.75, 39                 # template.dgram_features
UNIT_EPS = 1e-6                                 # geometry.Vec3Array.normalized epsilon
PAIR_FEATURES = ("dgram", "pseudo_beta_mask", "aatype_j", "aatype_i", "unit_x", "unit_y",
                 "unit_z", "backbone_mask", "query")      # template_pair_embedding_0..8
_N, _CA, _C = (rc.ATOM_ORDER[a] for a in ("N", "CA", "C"))


def distogram(positions: torch.Tensor, min_bin: float = DGRAM_MIN, max_bin: float = DGRAM_MAX,
              bins: int = DGRAM_BINS) -> torch.Tensor:
    """AF2 `dgram_from_positions`: [*, L, 3] -> one-hot [*, L, L, bins] (squared edges)."""
    d2 = ((positions[..., :, None, :] - positions[..., None, :, :]) ** 2).sum(-1, keepdim=True)
    lower = torch.linspace(min_bin, max_bin, bins, device=d2.device).to(d2.dtype) ** 2
    upper = torch.cat([lower[1:], lower.new_tensor([1e8])])
    return ((d2 > lower) & (d2 < upper)).to(positions.dtype)


def _normalized(v: torch.Tensor) -> torch.Tensor:
    return v / torch.sqrt(torch.clamp((v * v).sum(-1, keepdim=True), min=UNIT_EPS ** 2))


def backbone_unit_vectors(pos: torch.Tensor) -> torch.Tensor:
    """[*, L, 37, 3] -> unit vectors [*, L, L, 3]: CA_j in the backbone frame of residue i
    (`make_transform_from_reference(N, CA, C)`, `Rot3Array.from_two_vectors`), in at least
    float32 (AlphaFold casts the template atoms to float32 under bfloat16).

    The diagonal (i = j) is exactly 0 here. AlphaFold computes `rigid_i.inverse()
    .apply_to_point(CA_j)` = R_i^T CA_j + R_i^T (-CA_i), where XLA's fused float32 kernels leave
    a ~1e-6 Å residue on the diagonal that `normalized` (epsilon 1e-6) turns into a vector of
    norm up to 1: compile-dependent rounding noise (a standalone jit of the same code gives
    other values, eager mode gives 0), not reproducible by a port. It is what separates protdp
    from the fixture end to end (tests/test_multimer_model.py)."""
    pos = pos.to(torch.promote_types(pos.dtype, torch.float32))
    ca = pos[..., _CA, :]
    e0 = _normalized(pos[..., _C, :] - ca)
    e1 = pos[..., _N, :] - ca
    e1 = _normalized(e1 - (e1 * e0).sum(-1, keepdim=True) * e0)
    e2 = torch.cross(e0, e1, dim=-1)
    rot_t = torch.stack([e0, e1, e2], dim=-2)                     # [*, L, 3, 3] rows = axes
    rel = ca[..., None, :, :] - ca[..., :, None, :]               # [*, i, j, 3] CA_j - CA_i
    return _normalized(torch.einsum("...iab,...ijb->...ija", rot_t, rel))


def template_pair_inputs(aatype, pos, atom_mask, multichain_mask):
    """The 8 non-query inputs of one template: aatype [*, L], pos [*, L, 37, 3], atom_mask
    [*, L, 37], multichain_mask [*, L, L] -> list in `PAIR_FEATURES` order (without the
    query), scalar features as [*, L, L, 1]."""
    dtype = pos.dtype
    pb, pb_mask = pseudo_beta(aatype, pos, atom_mask)
    pb_mask_2d = pb_mask[..., :, None] * pb_mask[..., None, :] * multichain_mask
    dgram = distogram(pb) * pb_mask_2d[..., None]
    one_hot = F.one_hot(aatype.long(), TEMPLATE_AATYPE_CLASSES).to(dtype)      # [*, T, L, 22]
    L = aatype.shape[-1]
    aatype_j = one_hot[..., None, :, :].expand(*one_hot.shape[:-2], L, L, -1)
    aatype_i = one_hot[..., :, None, :].expand(*one_hot.shape[:-2], L, L, -1)
    bb = atom_mask[..., _N] * atom_mask[..., _CA] * atom_mask[..., _C]
    bb_2d = bb[..., :, None] * bb[..., None, :] * multichain_mask
    unit = backbone_unit_vectors(pos).to(dtype) * bb_2d[..., None]
    return [dgram, pb_mask_2d[..., None], aatype_j, aatype_i, unit[..., 0:1], unit[..., 1:2],
            unit[..., 2:3], bb_2d[..., None]]


def chi_angle_features(aatype, pos, atom_mask):
    """`template_embedding_1d` inputs: [*, T, L] -> features [*, T, L, 34] and the chi1 mask
    [*, T, L]. Chi angles as `geometry.dihedral_angle` (atan2 form), computed in float64."""
    aatype = aatype.long()
    atoms, tmask = _torsion_atoms(aatype.clamp(max=UNK_ID), pos.double(), atom_mask.double())
    a, b, c, d = atoms[..., 3:, :, :].unbind(-2)                  # chi1-4: [*, T, L, 4, 3]
    v1, v2, v3 = a - b, b - c, d - c
    c1, c2 = torch.cross(v1, v2, dim=-1), torch.cross(v3, v2, dim=-1)
    c3 = torch.cross(c2, c1, dim=-1)
    v2_mag = torch.sqrt(torch.clamp((v2 * v2).sum(-1), min=1e-12))
    angle = torch.atan2((c3 * v2).sum(-1), v2_mag * (c1 * c2).sum(-1))
    mask = tmask[..., 3:]
    feats = torch.cat([F.one_hot(aatype, TEMPLATE_AATYPE_CLASSES).double(),
                       torch.sin(angle) * mask, torch.cos(angle) * mask, mask], dim=-1)
    return feats.to(pos.dtype), mask[..., 0].to(pos.dtype)


class MultimerTemplatePairBlock(nn.Module):
    """`TemplateEmbeddingIteration`: triangle multiplications first, then triangle attention."""

    def __init__(self, c_t: int, c_hidden_mul: int, c_hidden_att: int, heads: int,
                 transition_n: int):
        super().__init__()
        self.tri_mul_out = TriangleMultiplication(c_t, c_hidden_mul, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(c_t, c_hidden_mul, outgoing=False)
        self.tri_att_start = TriangleAttention(c_t, c_hidden_att, heads, True)
        self.tri_att_end = TriangleAttention(c_t, c_hidden_att, heads, False)
        self.pair_transition = Transition(c_t, transition_n)

    def forward(self, t, pair_mask):
        t = t + self.tri_mul_out(t, pair_mask)
        t = t + self.tri_mul_in(t, pair_mask)
        t = t + self.tri_att_start(t, pair_mask)
        t = t + self.tri_att_end(t, pair_mask)
        return t + self.pair_transition(t, pair_mask)


class MultimerTemplateEmbedder(nn.Module):
    """Pair update (`TemplateEmbedding`) and MSA rows (`template_embedding_1d`)."""

    def __init__(self, c_m: int, c_z: int, c_t: int, n_blocks: int, c_hidden_mul: int,
                 c_hidden_att: int, heads: int, transition_n: int = 2):
        super().__init__()
        dims = [DGRAM_BINS, 1, TEMPLATE_AATYPE_CLASSES, TEMPLATE_AATYPE_CLASSES, 1, 1, 1, 1, c_z]
        self.pair_embeddings = nn.ModuleList(Linear(d, c_t, init="relu") for d in dims)
        self.query_norm = LayerNorm(c_z)                          # query_embedding_norm
        self.blocks = nn.ModuleList(
            MultimerTemplatePairBlock(c_t, c_hidden_mul, c_hidden_att, heads, transition_n)
            for _ in range(n_blocks))
        self.norm = LayerNorm(c_t)                                # output_layer_norm
        self.output_linear = Linear(c_t, c_z, init="relu")
        self.single_embedding = Linear(TEMPLATE_SINGLE_FEAT_DIM, c_m, init="relu")
        self.single_projection = Linear(c_m, c_m, init="relu")   # template_projection

    def pair(self, z, batch, pair_mask, asym_id):
        """z [L, L, C_z] (query) -> template update [L, L, C_z]; one template at a time."""
        dtype = z.dtype
        aatype = batch["template_aatype"].long()                  # [T, L]
        pos = batch["template_all_atom_positions"].to(dtype)
        atom_mask = batch["template_all_atom_mask"].to(dtype)
        multichain = (asym_id[..., :, None] == asym_id[..., None, :]).to(dtype)
        query = self.pair_embeddings[-1](self.query_norm(z))      # [L, L, C_t]
        total = 0.0
        num_templates = aatype.shape[-2]
        for k in range(num_templates):
            inputs = template_pair_inputs(aatype[k], pos[k], atom_mask[k], multichain)
            t = 0.0
            for lin, x in zip(self.pair_embeddings[:-1], inputs):
                t = t + lin(x)
            t = t + query
            for block in self.blocks:
                t = block(t, pair_mask)
            total = total + self.norm(t)
        return self.output_linear(F.relu(total / num_templates))

    def msa_rows(self, batch, dtype):
        """-> template rows [T, L, C_m] and their mask [T, L]."""
        feats, mask = chi_angle_features(batch["template_aatype"],
                                         batch["template_all_atom_positions"].to(dtype),
                                         batch["template_all_atom_mask"].to(dtype))
        rows = self.single_projection(F.relu(self.single_embedding(feats)))
        return rows, mask
