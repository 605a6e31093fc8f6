"""Structure module (AF2 supplement §1.8, Algorithms 20-24).

Invariant point attention (Alg. 22), backbone update (Alg. 23), transition and a psi-only
torsion resnet (Alg. 20 lines 11-14) that places the carbonyl O; one set of weights is applied
`sm_layers` times, with the rotations detached between layers (Alg. 20 line 20).
Frames are kept in nm internally and scaled by `position_scale` (10) to Å for every output.
Backbone atoms N, CA, C, CB come from the ideal ALA geometry in the backbone frame and O from
the psi frame (AF2 `residue_constants.rigid_group_atom_positions`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from protdp.model.config import ModelConfig
from protdp.model.primitives import LayerNorm, Linear, MASK_NEG
from protdp.model.rigid import Rigid, quat_to_rot, rot_x

# Ideal ALA backbone atoms in the backbone frame (Å): N, CA, C, CB.
IDEAL_N = (-0.525, 1.363, 0.0)
IDEAL_CA = (0.0, 0.0, 0.0)
IDEAL_C = (1.526, 0.0, 0.0)
IDEAL_CB = (-0.529, -0.774, -1.205)
# O in the psi frame; the default psi frame sits at C with axes (C-CA, CA-N, x-y normal).
IDEAL_O_PSI = (0.627, 1.062, 0.0)
PSI_FRAME_ROT = ((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0))
PSI_FRAME_TRANS = IDEAL_C


class InvariantPointAttention(nn.Module):
    """Algorithm 22."""

    def __init__(self, c_s: int, c_z: int, c_hidden: int, n_heads: int, n_qk: int, n_v: int,
                 eps: float = 1e-8):
        super().__init__()
        self.c_hidden, self.n_heads, self.n_qk, self.n_v, self.eps = c_hidden, n_heads, n_qk, n_v, eps
        hc = c_hidden * n_heads
        self.linear_q = Linear(c_s, hc)
        self.linear_kv = Linear(c_s, 2 * hc)
        self.linear_q_pts = Linear(c_s, n_heads * n_qk * 3)
        self.linear_kv_pts = Linear(c_s, n_heads * (n_qk + n_v) * 3)
        self.linear_b = Linear(c_z, n_heads)
        # softplus(head_weights) = 1 at init
        self.head_weights = nn.Parameter(torch.full((n_heads,), math.log(math.e - 1.0)))
        concat = n_heads * (c_z + c_hidden + n_v * 4)
        self.linear_out = Linear(concat, c_s, init="final")

    def forward(self, s: torch.Tensor, z: torch.Tensor, frames: Rigid, mask: torch.Tensor) -> torch.Tensor:
        # s [*, L, C_s], z [*, L, L, C_z], frames [*, L], mask [*, L]
        h, c = self.n_heads, self.c_hidden
        q = rearrange(self.linear_q(s), "... l (h c) -> ... l h c", h=h)
        k, v = rearrange(self.linear_kv(s), "... l (h c) -> ... l h c", h=h).chunk(2, dim=-1)

        def global_points(x, n):  # local points [*, L, H*n*3] -> global [*, L, H, n, 3]
            pts = rearrange(x, "... l (h p x) -> ... l h p x", h=h, p=n, x=3)
            return frames.unsqueeze(-1).unsqueeze(-1).apply(pts)

        q_pts = global_points(self.linear_q_pts(s), self.n_qk)
        kv_pts = global_points(self.linear_kv_pts(s), self.n_qk + self.n_v)
        k_pts, v_pts = kv_pts[..., :self.n_qk, :], kv_pts[..., self.n_qk:, :]

        w_l = math.sqrt(1.0 / 3.0)
        w_c = math.sqrt(2.0 / (9.0 * self.n_qk))
        scalar = torch.einsum("...ihc,...jhc->...hij", q, k) / math.sqrt(c)      # [*, H, L, L]
        bias = rearrange(self.linear_b(z), "... i j h -> ... h i j")
        # squared point distances sum_p |T_i q_p - T_j k_p|^2 via |q|^2 + |k|^2 - 2 q.k
        qf = rearrange(q_pts, "... i h p x -> ... h i (p x)")                    # [*, H, L, P*3]
        kf = rearrange(k_pts, "... j h p x -> ... h j (p x)")
        d2 = ((qf ** 2).sum(-1)[..., :, None] + (kf ** 2).sum(-1)[..., None, :]
              - 2.0 * qf @ kf.transpose(-1, -2))                                   # [*, H, L, L]
        gamma = F.softplus(self.head_weights)[:, None, None]
        logits = w_l * (scalar + bias - gamma * w_c / 2.0 * d2)
        pair_mask = mask[..., :, None] * mask[..., None, :]
        logits = logits.masked_fill(pair_mask[..., None, :, :] == 0, MASK_NEG)
        a = torch.softmax(logits, dim=-1)                                          # [*, H, L, L]

        o = rearrange(torch.einsum("...hij,...jhc->...ihc", a, v), "... i h c -> ... i (h c)")
        o_pt = torch.einsum("...hij,...jhpx->...ihpx", a, v_pts)                   # [*, L, H, Pv, 3]
        o_pt = frames.unsqueeze(-1).unsqueeze(-1).invert_apply(o_pt)
        o_pt_norm = torch.sqrt((o_pt ** 2).sum(-1) + self.eps)                     # [*, L, H, Pv]
        o_pair = torch.einsum("...hij,...ijc->...ihc", a, z)                       # [*, L, H, C_z]
        feats = [o, rearrange(o_pt, "... i h p x -> ... i (h p x)"),
                 rearrange(o_pt_norm, "... i h p -> ... i (h p)"),
                 rearrange(o_pair, "... i h c -> ... i (h c)")]
        return self.linear_out(torch.cat(feats, dim=-1))


class BackboneUpdate(nn.Module):
    """Algorithm 23: s -> (quaternion (1, b, c, d), translation) update of every frame."""

    def __init__(self, c_s: int):
        super().__init__()
        self.linear = Linear(c_s, 6, init="final")

    def forward(self, s: torch.Tensor) -> Rigid:
        bcd, t = self.linear(s).split(3, dim=-1)
        quat = torch.cat([torch.ones_like(bcd[..., :1]), bcd], dim=-1)
        return Rigid(quat_to_rot(quat), t)


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


class PsiResnet(nn.Module):
    """Alg. 20 lines 11-14 (torsion angle resnet) restricted to psi, the one torsion that moves
    a backbone atom (O). Returns the unnormalised (sin, cos) [*, L, 2]."""

    def __init__(self, c_s: int, c_hidden: int):
        super().__init__()
        self.linear_in = Linear(c_s, c_hidden)
        self.linear_initial = Linear(c_s, c_hidden)
        self.blocks = nn.ModuleList(
            nn.ModuleList([Linear(c_hidden, c_hidden, init="relu"),
                           Linear(c_hidden, c_hidden, init="final")]) for _ in range(2))
        self.linear_out = Linear(c_hidden, 2)

    def forward(self, s, s_initial):
        a = self.linear_in(F.relu(s)) + self.linear_initial(F.relu(s_initial))
        for lin1, lin2 in self.blocks:
            a = a + lin2(F.relu(lin1(F.relu(a))))
        return self.linear_out(F.relu(a))


def backbone_atoms(frames: Rigid, psi_sin_cos: torch.Tensor) -> torch.Tensor:
    """Frames in Å [*, L] and normalised psi (sin, cos) [*, L, 2] -> N, CA, C, O, CB [*, L, 5, 3]."""
    dev, dt = frames.trans.device, frames.trans.dtype
    local = torch.tensor([IDEAL_N, IDEAL_CA, IDEAL_C, IDEAL_CB], device=dev, dtype=dt)  # [4, 3]
    n_ca_c_cb = frames.unsqueeze(-1).apply(local)                                       # [*, L, 4, 3]
    psi_default = Rigid(torch.tensor(PSI_FRAME_ROT, device=dev, dtype=dt),
                        torch.tensor(PSI_FRAME_TRANS, device=dev, dtype=dt))
    psi_frame = frames.compose(Rigid(psi_default.rot @ rot_x(psi_sin_cos),
                                     psi_default.trans.expand_as(frames.trans)))
    o = psi_frame.apply(torch.tensor(IDEAL_O_PSI, device=dev, dtype=dt))                # [*, L, 3]
    return torch.cat([n_ca_c_cb[..., :3, :], o[..., None, :], n_ca_c_cb[..., 3:, :]], dim=-2)


def psi_from_atoms(positions: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """True psi (sin, cos) [*, L, 2] in the convention of `backbone_atoms`, from N, CA, C, O.

    The O atom is expressed in the default psi frame; its (y, z) direction is the rotation
    about x that maps IDEAL_O_PSI (which has z = 0) onto it."""
    n, ca, c, o = positions[..., 0, :], positions[..., 1, :], positions[..., 2, :], positions[..., 3, :]
    bb = Rigid.from_3_points(n, ca, c)
    o_local = bb.invert_apply(o)
    rot = torch.tensor(PSI_FRAME_ROT, device=o.device, dtype=o.dtype)
    o_psi = torch.einsum("ji,...j->...i", rot, o_local - torch.tensor(PSI_FRAME_TRANS, device=o.device,
                                                                       dtype=o.dtype))
    yz = o_psi[..., 1:]
    yz = yz / torch.sqrt((yz ** 2).sum(-1, keepdim=True) + eps)
    return torch.stack([yz[..., 1], yz[..., 0]], dim=-1)                                # (sin, cos)


class StructureModule(nn.Module):
    """Algorithm 20 with shared weights across `sm_layers` layers."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_layers = cfg.sm_layers
        self.position_scale = cfg.position_scale
        self.norm_s = LayerNorm(cfg.c_s)
        self.norm_z = LayerNorm(cfg.c_z)
        self.linear_in = Linear(cfg.c_s, cfg.c_s)
        self.ipa = InvariantPointAttention(cfg.c_s, cfg.c_z, cfg.c_ipa, cfg.ipa_heads,
                                           cfg.ipa_qk_points, cfg.ipa_v_points)
        self.ipa_dropout = nn.Dropout(cfg.sm_dropout)
        self.norm_ipa = LayerNorm(cfg.c_s)
        self.transition = StructureTransition(cfg.c_s, cfg.sm_transition_layers, cfg.sm_dropout)
        self.backbone_update = BackboneUpdate(cfg.c_s)
        self.psi_resnet = PsiResnet(cfg.c_s, cfg.c_resnet)

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> dict:
        # s [*, L, C_s], z [*, L, L, C_z], mask [*, L]
        s_initial = self.norm_s(s)
        z = self.norm_z(z)
        s = self.linear_in(s_initial)
        frames = Rigid.identity(s.shape[:-1], device=s.device, dtype=s.dtype)
        traj, angles, angles_norm = [], [], []
        for layer in range(self.n_layers):
            s = s + self.ipa(s, z, frames, mask)
            s = self.norm_ipa(self.ipa_dropout(s))
            s = self.transition(s)
            frames = frames.compose(self.backbone_update(s))
            psi = self.psi_resnet(s, s_initial)                                   # [*, L, 2]
            psi_norm = psi / torch.sqrt((psi ** 2).sum(-1, keepdim=True) + 1e-8)
            scaled = Rigid(frames.rot, frames.trans * self.position_scale)       # Å
            traj.append(scaled.to_tensor_4x4())
            angles.append(psi)
            angles_norm.append(psi_norm)
            if layer < self.n_layers - 1:
                frames = frames.stop_rot_gradient()
        atoms = backbone_atoms(scaled, angles_norm[-1])
        return {
            "frames": torch.stack(traj),                  # [n_layers, *, L, 4, 4] (Å)
            "angles": torch.stack(angles),                # [n_layers, *, L, 2] unnormalised psi
            "angles_normalized": torch.stack(angles_norm),
            "single": s,                                  # [*, L, C_s]
            "atom_positions": atoms,                      # [*, L, 5, 3]
        }
