"""Template embedding (AF2 supplement §1.7.1, Alg. 2 lines 7-13, Alg. 16-17), as AlphaFold v2.3
`modules.TemplateEmbedding` / `SingleTemplateEmbedding` / `TemplatePairStack` and the torsion
rows of `EmbeddingsAndEvoformer` compute them.

Template features (AlphaFold's key names, [*] = free leading dims, T templates, L residues):
`template_aatype` [*, T, L] (AF order, 20 = X, 21 = gap), `template_all_atom_positions`
[*, T, L, 37, 3] Å, `template_all_atom_masks` [*, T, L, 37], `template_mask` [*, T]; optional
`template_pseudo_beta` [*, T, L, 3] and `template_pseudo_beta_mask` [*, T, L] (computed from the
atoms when absent).

- Pair features (Alg. 2 line 9): distogram of pseudo-beta distances (39 bins), pseudo-beta pair
  mask, the template aatype one-hot of i and of j (22 each), backbone unit vectors (zeros unless
  `template_unit_vector`) and the backbone pair mask -> 88 channels, masked by the pseudo-beta
  pair mask, then `embedding2d` to c_t.
- Alg. 16 template pair stack: triangle attention (start, end), triangle multiplication
  (outgoing, incoming), pair transition, on each template separately; final LayerNorm.
- Alg. 17 template pointwise attention: the query pair representation attends over the T
  templates (no gating; templates with `template_mask` 0 are masked); zero when no template
  has mask 1 ("no gradients if no templates").
- §1.7.1 torsion rows: aatype one-hot (22), sin/cos of the 7 torsions and of their
  pi-shifted alternatives (14 + 14) and the torsion mask (7) -> 57 channels -> Linear(relu) ->
  ReLU -> Linear, appended to the MSA representation with the psi mask as MSA mask.

When the config has templates on and a batch carries no template keys, `placeholder_templates`
gives AlphaFold's own empty-search placeholder (one all-zero template with template_mask 1:
`templates.TemplateSearchResult` defaults + `make_template_mask`), so the model sees exactly
what AlphaFold feeds it when no template is found.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from protdp.data import residue_constants as rc
from protdp.data.residues import UNK_ID
from protdp.model.all_atom import PSI, _torsion_atoms, pseudo_beta, residue_table
from protdp.model.config import ModelConfig
from protdp.model.evoformer import TriangleAttention, TriangleMultiplication
from protdp.model.primitives import LayerNorm, Linear, SharedDropout, Transition
from protdp.model.rigid import Rigid

TEMPLATE_AATYPE_CLASSES = 22                     # 20 amino acids + X + gap
TEMPLATE_TORSION_FEAT_DIM = TEMPLATE_AATYPE_CLASSES + 14 + 14 + 7        # 57
TEMPLATE_KEYS = ("template_aatype", "template_all_atom_positions", "template_all_atom_masks",
                 "template_mask", "template_pseudo_beta", "template_pseudo_beta_mask")
_N, _CA, _C = (rc.ATOM_ORDER[a] for a in ("N", "CA", "C"))


def template_pair_feat_dim(cfg: ModelConfig) -> int:
    """dgram bins + pseudo-beta mask + 2 x aatype one-hot + 3 unit-vector + backbone mask (88)."""
    return cfg.template_dgram_bins + 1 + 2 * TEMPLATE_AATYPE_CLASSES + 3 + 1


def placeholder_templates(aatype: torch.Tensor, dtype: torch.dtype) -> dict:
    """AlphaFold's no-template input: one all-zero template, template_mask 1 (aatype [*, L])."""
    lead, L = aatype.shape[:-1], aatype.shape[-1]
    z = dict(device=aatype.device, dtype=dtype)
    return {"template_aatype": torch.zeros(lead + (1, L), dtype=torch.long, device=aatype.device),
            "template_all_atom_positions": torch.zeros(lead + (1, L, 37, 3), **z),
            "template_all_atom_masks": torch.zeros(lead + (1, L, 37), **z),
            "template_mask": torch.ones(lead + (1,), **z)}


def template_pseudo_beta(batch: Mapping, dtype: torch.dtype):
    """[*, T, L, 3] and mask [*, T, L]: the batch's, else CB (CA for Gly) of the atoms."""
    if "template_pseudo_beta" in batch:
        return batch["template_pseudo_beta"].to(dtype), batch["template_pseudo_beta_mask"].to(dtype)
    return pseudo_beta(batch["template_aatype"].long(),
                       batch["template_all_atom_positions"].to(dtype),
                       batch["template_all_atom_masks"].to(dtype))


def distogram(positions: torch.Tensor, min_bin: float, max_bin: float, bins: int) -> torch.Tensor:
    """AF2 `dgram_from_positions`: [*, L, 3] -> one-hot [*, L, L, bins] of squared distances
    between squared bin edges (the last bin open-ended)."""
    d2 = ((positions[..., :, None, :] - positions[..., None, :, :]) ** 2).sum(-1, keepdim=True)
    lower = torch.linspace(min_bin, max_bin, bins, device=d2.device).to(d2.dtype) ** 2
    upper = torch.cat([lower[1:], lower.new_tensor([1e8])])
    return ((d2 > lower) & (d2 < upper)).to(positions.dtype)


def template_pair_features(batch: Mapping, cfg: ModelConfig, dtype: torch.dtype) -> torch.Tensor:
    """Alg. 2 line 9 inputs [*, T, L, L, 88] (see the module docstring for the channels)."""
    aatype = batch["template_aatype"].long()                                 # [*, T, L]
    pos = batch["template_all_atom_positions"].to(dtype)                     # [*, T, L, 37, 3]
    atom_mask = batch["template_all_atom_masks"].to(dtype)
    L = aatype.shape[-1]
    pb, pb_mask = template_pseudo_beta(batch, dtype)
    pb_mask_2d = pb_mask[..., :, None] * pb_mask[..., None, :]               # [*, T, L, L]
    dgram = distogram(pb, cfg.template_dgram_min, cfg.template_dgram_max, cfg.template_dgram_bins)
    one_hot = F.one_hot(aatype, TEMPLATE_AATYPE_CLASSES).to(dtype)           # [*, T, L, 22]
    bb_mask = atom_mask[..., _N] * atom_mask[..., _CA] * atom_mask[..., _C]   # [*, T, L]
    bb_mask_2d = bb_mask[..., :, None] * bb_mask[..., None, :]
    if cfg.template_unit_vector:
        frames = Rigid.from_3_points(pos[..., _N, :], pos[..., _CA, :], pos[..., _C, :])
        vec = frames.unsqueeze(-1).invert_apply(pos[..., None, :, _CA, :])   # [*, T, L, L, 3]
        inv = torch.rsqrt(1e-6 + (vec ** 2).sum(-1, keepdim=True)) * bb_mask_2d[..., None]
        unit = vec * inv
    else:
        unit = pb_mask_2d.new_zeros(pb_mask_2d.shape + (3,))
    act = torch.cat([dgram, pb_mask_2d[..., None],
                     one_hot[..., None, :, :].expand(*one_hot.shape[:-2], L, L, -1),
                     one_hot[..., :, None, :].expand(*one_hot.shape[:-2], L, L, -1),
                     unit, bb_mask_2d[..., None]], dim=-1)
    return act * pb_mask_2d[..., None]


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c rounded once (fused multiply-add), exact for float32 inputs via float64."""
    if a.dtype != torch.float32:
        return a * b + c
    return (a.double() * b.double() + c.double()).float()


def _dot(a, b):
    """a·b as XLA's CPU backend contracts it: fma(a2, b2, fma(a0, b0, a1 * b1))."""
    return _fma(a[2], b[2], _fma(a[0], b[0], a[1] * b[1]))


def _r3_torsion_sin_cos(atoms: torch.Tensor) -> torch.Tensor:
    """sin/cos [*, 2] of the torsion defined by atoms [*, 4, 3], with AlphaFold's `r3` operation
    order component by component (`rigids_from_3_points`, `invert_rigids`, `rigids_mul_vecs`:
    R^T p + (-R^T t), norms sqrt(x² + y² + z² + 1e-8)) and the fused multiply-adds of its
    compiled float32 code. The rounding matters where a torsion is degenerate: after a gap
    the previous residue's atoms are zeros, the frame's e1 is rounding noise, and AlphaFold's
    (unmasked) torsion features carry that noise's direction."""
    x = atoms.unbind(-1)
    neg_x, origin, xy, fourth = ([c[..., i] for c in x] for i in (1, 2, 0, 3))

    def normalize(v):
        norm = torch.sqrt(_dot(v, v) + 1e-8)
        return [c / norm for c in v]

    e0 = normalize([o - n for o, n in zip(origin, neg_x)])
    e1 = [p - o for p, o in zip(xy, origin)]
    c = _dot(e1, e0)
    e1 = normalize([_fma(-c, e0[k], e1[k]) for k in range(3)])
    e2 = [_fma(e0[1], e1[2], -(e0[2] * e1[1])), _fma(e0[2], e1[0], -(e0[0] * e1[2])),
          _fma(e0[0], e1[1], -(e0[1] * e1[0]))]
    rows = (e0, e1, e2)                        # rows of R^T
    rel = [_dot(r, fourth) + -_dot(r, origin) for r in rows]
    sin_cos = torch.stack([rel[2], rel[1]], dim=-1)
    return sin_cos / torch.sqrt(_fma(rel[1], rel[1], rel[2] * rel[2]) + 1e-8)[..., None]


def template_torsion_angles(aatype: torch.Tensor, positions37: torch.Tensor,
                            mask37: torch.Tensor) -> dict:
    """AF2 `atom37_to_torsion_angles` for template features (aatype [*, T, L] with gap 21 read
    as X): sin_cos / alt_sin_cos [*, T, L, 7, 2] and mask [*, T, L, 7], in `_r3_torsion_sin_cos`'s
    operation order (see there)."""
    aatype = aatype.clamp(max=UNK_ID)
    atoms, mask = _torsion_atoms(aatype, positions37, mask37)      # [*, L, 7, 4, 3], [*, L, 7]
    sin_cos = _r3_torsion_sin_cos(atoms)
    flip = torch.ones(7, dtype=sin_cos.dtype, device=sin_cos.device)
    flip[PSI] = -1.0
    sin_cos = sin_cos * flip[:, None]
    periodic = residue_table(rc.CHI_PI_PERIODIC, aatype, sin_cos.dtype)     # [*, L, 4]
    mirror = torch.cat([torch.ones_like(periodic[..., :3]), 1.0 - 2.0 * periodic], dim=-1)
    return {"sin_cos": sin_cos, "alt_sin_cos": sin_cos * mirror[..., None], "mask": mask}


class TemplatePairBlock(nn.Module):
    """One block of Algorithm 16 (AF2 order: triangle attention start/end, triangle
    multiplication outgoing/incoming, pair transition)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        c_t = cfg.c_t
        self.tri_att_start = TriangleAttention(c_t, cfg.c_hidden_template_tri_att,
                                               cfg.template_tri_heads, True)
        self.tri_att_end = TriangleAttention(c_t, cfg.c_hidden_template_tri_att,
                                             cfg.template_tri_heads, False)
        self.tri_mul_out = TriangleMultiplication(c_t, cfg.c_hidden_template_tri_mul, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(c_t, cfg.c_hidden_template_tri_mul, outgoing=False)
        self.pair_transition = Transition(c_t, cfg.template_transition_n)
        self.row_dropout = SharedDropout(cfg.template_dropout, shared_dim=-3)
        self.col_dropout = SharedDropout(cfg.template_dropout, shared_dim=-2)
        self.chunk_size = cfg.chunk_size

    def forward(self, t, pair_mask):
        # t [*, L, L, C_t], pair_mask [*, L, L]
        cs = self.chunk_size
        t = t + self.row_dropout(self.tri_att_start(t, pair_mask, cs))
        t = t + self.col_dropout(self.tri_att_end(t, pair_mask, cs))
        t = t + self.row_dropout(self.tri_mul_out(t, pair_mask))
        t = t + self.row_dropout(self.tri_mul_in(t, pair_mask))
        return t + self.pair_transition(t, pair_mask, cs)


class TemplatePointwiseAttention(nn.Module):
    """Algorithm 17: per pair (i, j) the query z_ij attends over the T template embeddings
    (AF2 `Attention` without gating; q/k/v without bias, output with bias)."""

    def __init__(self, c_z: int, c_t: int, c_hidden: int, n_heads: int):
        super().__init__()
        self.c_hidden, self.n_heads = c_hidden, n_heads
        self.linear_q = Linear(c_z, c_hidden * n_heads, bias=False, init="glorot")
        self.linear_k = Linear(c_t, c_hidden * n_heads, bias=False, init="glorot")
        self.linear_v = Linear(c_t, c_hidden * n_heads, bias=False, init="glorot")
        self.linear_o = Linear(c_hidden * n_heads, c_z, init="final")

    def forward(self, z, t, template_mask):
        # z [*, L, L, C_z], t [*, T, L, L, C_t], template_mask [*, T] -> [*, L, L, C_z]
        t = t.movedim(-4, -2)                                                # [*, L, L, T, C_t]
        h = self.n_heads
        q = rearrange(self.linear_q(z), "... (h c) -> ... h c", h=h) / math.sqrt(self.c_hidden)
        k = rearrange(self.linear_k(t), "... t (h c) -> ... h t c", h=h)     # [*, L, L, H, T, c]
        v = rearrange(self.linear_v(t), "... t (h c) -> ... h t c", h=h)
        logits = torch.einsum("...hc,...htc->...ht", q, k)                   # [*, L, L, H, T]
        bias = 1e9 * (template_mask.to(logits.dtype) - 1.0)                  # AF2's mask bias
        logits = logits + bias[..., None, None, None, :]
        w = torch.softmax(logits, dim=-1)
        o = torch.einsum("...ht,...htc->...hc", w, v)
        return self.linear_o(rearrange(o, "... h c -> ... (h c)"))


class TemplateEmbedder(nn.Module):
    """Alg. 2 lines 7-13: the pair embedding of the templates (`pair`) and the torsion rows
    appended to the MSA (`msa_rows`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding2d = Linear(template_pair_feat_dim(cfg), cfg.c_t, init="relu")
        self.blocks = nn.ModuleList(TemplatePairBlock(cfg) for _ in range(cfg.template_pair_blocks))
        self.norm = LayerNorm(cfg.c_t)                                       # output_layer_norm
        self.pointwise = TemplatePointwiseAttention(cfg.c_z, cfg.c_t, cfg.c_hidden_template_att,
                                                    cfg.template_att_heads)
        if cfg.template_torsion_angles:
            self.linear_single = Linear(TEMPLATE_TORSION_FEAT_DIM, cfg.c_m, init="relu")
            self.linear_projection = Linear(cfg.c_m, cfg.c_m, init="relu")

    def pair(self, batch: Mapping, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """Alg. 2 lines 9-13: z [*, L, L, C_z] -> the template update of z [*, L, L, C_z]."""
        dtype = z.dtype
        t = self.embedding2d(template_pair_features(batch, self.cfg, dtype))  # [*, T, L, L, C_t]
        mask = pair_mask[..., None, :, :].expand(t.shape[:-1])
        for block in self.blocks:
            t = block(t, mask)
        t = self.norm(t)
        template_mask = batch["template_mask"].to(dtype)                     # [*, T]
        out = self.pointwise(z, t, template_mask)
        any_template = (template_mask.sum(-1) > 0).to(dtype)[..., None, None, None]
        return out * any_template

    def msa_rows(self, batch: Mapping, dtype: torch.dtype):
        """§1.7.1: torsion-angle rows [*, T, L, C_m] and their MSA mask [*, T, L] (psi mask)."""
        aatype = batch["template_aatype"].long()
        # float32 in every model dtype: the features are AlphaFold's float32 arithmetic
        tors = template_torsion_angles(aatype, batch["template_all_atom_positions"].float(),
                                       batch["template_all_atom_masks"].float())
        tors = {k: v.to(dtype) for k, v in tors.items()}
        feat = torch.cat([F.one_hot(aatype, TEMPLATE_AATYPE_CLASSES).to(dtype),
                          tors["sin_cos"].flatten(-2), tors["alt_sin_cos"].flatten(-2),
                          tors["mask"]], dim=-1)                             # [*, T, L, 57]
        rows = self.linear_projection(F.relu(self.linear_single(feat)))
        return rows, tors["mask"][..., 2]

