"""Structure module (AF2 supplement §1.8, Algorithms 20-24), all-atom.

Invariant point attention (Alg. 22), backbone update (Alg. 23), transition, and the torsion
angle resnet (Alg. 20 lines 11-14) predicting the 7 torsions (omega, phi, psi, chi1-4) from
which every side chain is built (Alg. 24, `protdp.model.all_atom`). One set of weights is
applied `sm_layers` times; rotations are detached between layers (Alg. 20 line 20).

Backbone frames are kept as AF2 keeps them: a unit quaternion + a translation in nm, composed
with the update quaternion (1, b, c, d) each layer (AF2 `QuatAffine.pre_compose`), so the
rotation never drifts from orthonormal; translations are scaled by `position_scale` (10) to Å
for side chains and every output. IPA point projections are laid out (xyz, head, point) and its
output features concatenated in AF2's order, so AlphaFold's weights load by reshaping only.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from protdp.data.residue_constants import NUM_TORSIONS
from protdp.model.all_atom import (atom14_to_atom37, atom37_exists, frames_to_atom14,
                                   torsion_angles_to_frames)
from protdp.model.config import ModelConfig
from protdp.model.primitives import LayerNorm, Linear
from protdp.model.rigid import Rigid, quat_multiply, quat_to_rot

# IPA masks attention logits additively, as AF2 does (`attn_logits -= 1e5 * (1 - mask_2d)`)
IPA_MASK_PENALTY = 1e5


class InvariantPointAttention(nn.Module):
    """Algorithm 22 (AF2 `InvariantPointAttention`; separate scalar query/key and value widths)."""

    def __init__(self, c_s: int, c_z: int, c_hidden: int, n_heads: int, n_qk: int, n_v: int,
                 c_hidden_v: int | None = None, eps: float = 1e-8):
        super().__init__()
        self.c_hidden, self.n_heads, self.n_qk, self.n_v, self.eps = c_hidden, n_heads, n_qk, n_v, eps
        self.c_hidden_v = c_hidden if c_hidden_v is None else c_hidden_v
        h = n_heads
        self.linear_q = Linear(c_s, h * c_hidden)                          # q_scalar
        self.linear_kv = Linear(c_s, h * (c_hidden + self.c_hidden_v))     # kv_scalar: [k | v] per head
        self.linear_q_pts = Linear(c_s, 3 * h * n_qk)                      # q_point_local (xyz, h, p)
        self.linear_kv_pts = Linear(c_s, 3 * h * (n_qk + n_v))             # kv_point_local
        self.linear_b = Linear(c_z, h)                                     # attention_2d
        # softplus(head_weights) = 1 at init (trainable_point_weights)
        self.head_weights = nn.Parameter(torch.full((h,), math.log(math.e - 1.0)))
        concat = h * (self.c_hidden_v + 4 * n_v + c_z)
        self.linear_out = Linear(concat, c_s, init="final")                # output_projection

    def _points(self, x: torch.Tensor, frames: Rigid, n: int) -> torch.Tensor:
        """Local points [*, L, 3*H*n] laid out (xyz, head, point) -> global [*, L, H, n, 3]."""
        pts = rearrange(x, "... l (x h p) -> ... l h p x", x=3, h=self.n_heads, p=n)
        return frames.unsqueeze(-1).unsqueeze(-1).apply(pts)

    def forward(self, s: torch.Tensor, z: torch.Tensor, frames: Rigid, mask: torch.Tensor) -> torch.Tensor:
        # s [*, L, C_s], z [*, L, L, C_z], frames [*, L] (nm), mask [*, L]
        h, c = self.n_heads, self.c_hidden
        q = rearrange(self.linear_q(s), "... l (h c) -> ... h l c", h=h)          # [*, H, L, c]
        kv = rearrange(self.linear_kv(s), "... l (h c) -> ... h l c", h=h)
        k, v = kv.split([c, self.c_hidden_v], dim=-1)
        q_pts = self._points(self.linear_q_pts(s), frames, self.n_qk)             # [*, L, H, Pq, 3]
        kv_pts = self._points(self.linear_kv_pts(s), frames, self.n_qk + self.n_v)
        k_pts, v_pts = kv_pts.split([self.n_qk, self.n_v], dim=-2)

        # logit weights: scalar, point and pair terms share the variance equally (3 terms)
        scalar_w = math.sqrt(1.0 / (3.0 * c))
        point_w = math.sqrt(1.0 / (3.0 * 4.5 * self.n_qk)) * F.softplus(self.head_weights)  # [H]
        logits = torch.matmul(q * scalar_w, k.transpose(-1, -2))                 # [*, H, L, L]
        qp = rearrange(q_pts, "... i h p x -> ... h i p x")
        kp = rearrange(k_pts, "... j h p x -> ... h j p x")
        # squared distances summed over xyz one coordinate at a time, as AF2 does (the peak
        # is [*, H, L, L, P], not [.., P, 3]), then over the points
        d2 = sum((qp[..., :, None, :, x] - kp[..., None, :, :, x]) ** 2 for x in range(3)).sum(-1)
        logits = logits - 0.5 * point_w[:, None, None] * d2
        logits = logits + math.sqrt(1.0 / 3.0) * rearrange(self.linear_b(z), "... i j h -> ... h i j")
        pair_mask = mask[..., :, None] * mask[..., None, :]
        logits = logits - IPA_MASK_PENALTY * (1.0 - pair_mask[..., None, :, :])
        a = torch.softmax(logits, dim=-1)                                         # [*, H, L, L]

        o = rearrange(torch.matmul(a, v), "... h i c -> ... i (h c)")           # [*, L, H*c_v]
        o_pt = torch.einsum("...hij,...jhpx->...ihpx", a, v_pts)                # [*, L, H, Pv, 3]
        o_pt = frames.unsqueeze(-1).unsqueeze(-1).invert_apply(o_pt)
        o_pt_norm = torch.sqrt(self.eps + (o_pt ** 2).sum(-1))                   # [*, L, H, Pv]
        o_pair = torch.einsum("...hij,...ijc->...ihc", a, z)                      # [*, L, H, C_z]
        feats = [o, rearrange(o_pt, "... i h p x -> ... i (x h p)"),
                 rearrange(o_pt_norm, "... i h p -> ... i (h p)"),
                 rearrange(o_pair, "... i h c -> ... i (h c)")]
        return self.linear_out(torch.cat(feats, dim=-1))


class BackboneUpdate(nn.Module):
    """Algorithm 23: s -> (b, c, d, t) update of every frame (AF2 `affine_update`)."""

    def __init__(self, c_s: int):
        super().__init__()
        self.linear = Linear(c_s, 6, init="final")

    def forward(self, s: torch.Tensor, quat: torch.Tensor, frames: Rigid):
        """quat [*, L, 4] and frames [*, L] (nm) -> updated (quat, frames): the update is applied
        first, then the current frame (AF2 `QuatAffine.pre_compose`)."""
        bcd, t = self.linear(s).split(3, dim=-1)
        quat = quat_multiply(quat, torch.cat([torch.ones_like(bcd[..., :1]), bcd], dim=-1))
        quat = quat / torch.linalg.norm(quat, dim=-1, keepdim=True)
        trans = frames.trans + torch.einsum("...ij,...j->...i", frames.rot, t)
        return quat, Rigid(quat_to_rot(quat), trans)


class StructureTransition(nn.Module):
    """Alg. 20 lines 8-9: residual MLP (relu layers, final zero layer), dropout, LayerNorm."""

    def __init__(self, c_s: int, n_layers: int, dropout: float):
        super().__init__()
        layers = [Linear(c_s, c_s, init="relu") for _ in range(n_layers - 1)]
        self.layers = nn.ModuleList(layers + [Linear(c_s, c_s, init="final")])
        self.dropout = nn.Dropout(dropout)
        self.norm = LayerNorm(c_s)

    def forward(self, s):
        x = s
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.norm(self.dropout(s + self.layers[-1](x)))


class AngleResnet(nn.Module):
    """Alg. 20 lines 11-14 (AF2 `MultiRigidSidechain` head): the 7 torsions as unnormalised
    (sin, cos) [*, L, 7, 2] from the current and the initial single representation."""

    def __init__(self, c_s: int, c_hidden: int, n_blocks: int = 2, c_initial: int | None = None):
        super().__init__()
        self.linear_in = Linear(c_s, c_hidden)                   # input_projection
        self.linear_initial = Linear(c_initial or c_s, c_hidden)  # input_projection_1
        self.blocks = nn.ModuleList(
            nn.ModuleList([Linear(c_hidden, c_hidden, init="relu"),       # resblock1(_k)
                           Linear(c_hidden, c_hidden, init="final")])     # resblock2(_k)
            for _ in range(n_blocks))
        self.linear_out = Linear(c_hidden, 2 * NUM_TORSIONS)     # unnormalized_angles

    def forward(self, s, s_initial):
        a = self.linear_in(F.relu(s)) + self.linear_initial(F.relu(s_initial))
        for lin1, lin2 in self.blocks:
            a = a + lin2(F.relu(lin1(F.relu(a))))
        return self.linear_out(F.relu(a)).unflatten(-1, (NUM_TORSIONS, 2))


def normalize_angles(angles: torch.Tensor) -> torch.Tensor:
    """(sin, cos) pairs [*, 2] scaled to unit length (AF2 `l2_normalize`, epsilon 1e-12)."""
    return angles / torch.sqrt(torch.clamp((angles ** 2).sum(-1, keepdim=True), min=1e-12))


class StructureModule(nn.Module):
    """Algorithm 20 with shared weights across `sm_layers` layers."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_layers = cfg.sm_layers
        self.position_scale = cfg.position_scale
        c = cfg.sm_channels                                      # AF2 structure_module.num_channel
        self.norm_s = LayerNorm(cfg.c_s)                         # single_layer_norm
        self.norm_z = LayerNorm(cfg.c_z)                         # pair_layer_norm
        self.linear_in = Linear(cfg.c_s, c)                      # initial_projection
        self.ipa = InvariantPointAttention(c, cfg.c_z, cfg.c_ipa, cfg.ipa_heads,
                                           cfg.ipa_qk_points, cfg.ipa_v_points, cfg.c_ipa_v)
        self.ipa_dropout = nn.Dropout(cfg.sm_dropout)
        self.norm_ipa = LayerNorm(c)                             # attention_layer_norm
        self.transition = StructureTransition(c, cfg.sm_transition_layers, cfg.sm_dropout)
        self.backbone_update = BackboneUpdate(c)
        self.angle_resnet = AngleResnet(c, cfg.c_resnet, cfg.n_resnet_blocks, c_initial=cfg.c_s)

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, aatype: torch.Tensor) -> dict:
        # s [*, L, C_s], z [*, L, L, C_z], mask [*, L], aatype [*, L]
        s_initial = self.norm_s(s)
        z = self.norm_z(z)
        s = self.linear_in(s_initial)
        quat = torch.zeros(s.shape[:-1] + (4,), dtype=s.dtype, device=s.device)
        quat[..., 0] = 1.0
        frames = Rigid.identity(s.shape[:-1], device=s.device, dtype=s.dtype)
        traj, angles = [], []
        for layer in range(self.n_layers):
            s = s + self.ipa(s, z, frames, mask)
            s = self.norm_ipa(self.ipa_dropout(s))
            s = self.transition(s)
            quat, frames = self.backbone_update(s, quat, frames)
            angles.append(self.angle_resnet(s, s_initial))                        # [*, L, 7, 2]
            traj.append(Rigid(frames.rot, frames.trans * self.position_scale))    # Å
            if layer < self.n_layers - 1:   # Alg. 20 line 20: no gradient through rotations
                quat, frames = quat.detach(), Rigid(frames.rot.detach(), frames.trans)
        angles_norm = normalize_angles(angles[-1])
        group_frames = torsion_angles_to_frames(aatype, traj[-1], angles_norm)   # [*, L, 8]
        atom14 = frames_to_atom14(aatype, group_frames)                           # [*, L, 14, 3]
        atom37 = atom14_to_atom37(atom14, aatype)
        atom37 = atom37 * atom37_exists(aatype, atom37.dtype)[..., None]
        return {
            "frames": torch.stack([t.to_tensor_4x4() for t in traj]),  # [n_layers, *, L, 4, 4] Å
            "angles": torch.stack(angles),                           # [n_layers, *, L, 7, 2] raw
            "angles_normalized": normalize_angles(torch.stack(angles)),
            "sidechain_frames": group_frames.to_tensor_4x4(),        # [*, L, 8, 4, 4] Å
            "atom14_positions": atom14,                              # [*, L, 14, 3] Å
            "atom_positions": atom37,                                # [*, L, 37, 3] Å
            "single": s,                                             # [*, L, C_sm]
        }
