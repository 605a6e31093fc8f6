"""Structure module (Alg. 20-24): rigid algebra, IPA invariance and AF2 layout, quaternion
backbone updates, all-atom outputs with ideal geometry."""

import math

import torch

from model_fixtures import tiny_config, one_thread  # noqa: F401
from protdp.data import residue_constants as rc
from protdp.model.rigid import Rigid, quat_multiply, quat_to_rot
from protdp.model.structure import BackboneUpdate, InvariantPointAttention, StructureModule


def random_rigid(shape, seed=0, dtype=torch.float32) -> Rigid:
    g = torch.Generator().manual_seed(seed)
    return Rigid(quat_to_rot(torch.randn(*shape, 4, generator=g, dtype=dtype)),
                 torch.randn(*shape, 3, generator=g, dtype=dtype) * 5)


def test_quaternion_rotation_is_proper_and_matches_axis_angle():
    rot = quat_to_rot(torch.randn(10, 4))
    eye = torch.eye(3).expand(10, 3, 3)
    assert torch.allclose(rot @ rot.transpose(-1, -2), eye, atol=1e-5)
    assert torch.allclose(torch.linalg.det(rot), torch.ones(10), atol=1e-5)
    # 90 degrees about z: q = (cos 45, 0, 0, sin 45) maps x -> y
    q = torch.tensor([math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)])
    assert torch.allclose(quat_to_rot(q) @ torch.tensor([1.0, 0, 0]), torch.tensor([0.0, 1, 0]), atol=1e-6)


def test_rigid_compose_invert_apply():
    a, b = random_rigid((4,), 1), random_rigid((4,), 2)
    x = torch.randn(4, 3)
    assert torch.allclose(a.compose(b).apply(x), a.apply(b.apply(x)), atol=1e-4)
    assert torch.allclose(a.invert().apply(a.apply(x)), x, atol=1e-4)
    assert torch.allclose(a.invert_apply(a.apply(x)), x, atol=1e-4)
    ident = a.compose(a.invert())
    assert torch.allclose(ident.rot, torch.eye(3).expand(4, 3, 3), atol=1e-5)
    assert torch.allclose(ident.trans, torch.zeros(4, 3), atol=1e-4)
    m = a.to_tensor_4x4()
    back = Rigid.from_tensor_4x4(m)
    assert torch.equal(back.rot, a.rot) and torch.equal(back.trans, a.trans)


def test_frames_from_3_points_gram_schmidt():
    n, ca, c = torch.tensor([[-0.525, 1.363, 0.0]]), torch.zeros(1, 3), torch.tensor([[1.526, 0.0, 0.0]])
    g = random_rigid((1,), 3)
    frame = Rigid.from_3_points(g.apply(n), g.apply(ca), g.apply(c))
    assert torch.allclose(frame.rot, g.rot, atol=1e-5)
    assert torch.allclose(frame.trans, g.trans, atol=1e-5)


def test_ipa_invariant_to_global_rigid_transform():
    torch.manual_seed(0)
    L, cfg = 9, tiny_config()
    # in float64, so the check is about the math, not about fp32 rounding of outputs ~60
    f64 = torch.float64
    ipa = InvariantPointAttention(cfg.c_s, cfg.c_z, 4, 3, 4, 5).to(f64)
    torch.nn.init.normal_(ipa.linear_out.weight)
    s, z = torch.randn(2, L, cfg.c_s, dtype=f64), torch.randn(2, L, L, cfg.c_z, dtype=f64)
    frames = random_rigid((2, L), 4, f64)
    mask = torch.ones(2, L, dtype=f64)
    mask[1, -2:] = 0
    out = ipa(s, z, frames, mask)
    g = random_rigid((), 5, f64)
    moved = Rigid(g.rot.expand(2, L, 3, 3), g.trans.expand(2, L, 3)).compose(frames)
    assert torch.allclose(ipa(s, z, moved, mask), out, rtol=1e-9, atol=1e-9)
    # ... but not to per-residue transforms
    assert not torch.allclose(ipa(s, z, random_rigid((2, L), 6, f64), mask), out, atol=1e-3)


def test_quaternion_product_composes_rotations():
    g = torch.Generator().manual_seed(0)
    q1, q2 = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(quat_to_rot(quat_multiply(q1, q2)), quat_to_rot(q1) @ quat_to_rot(q2), atol=1e-12)


def test_backbone_update_is_applied_before_the_current_frame():
    """Alg. 23 / AF2 QuatAffine.pre_compose: T_new = T o T_update, kept as a unit quaternion."""
    torch.manual_seed(0)
    upd = BackboneUpdate(6).double()
    torch.nn.init.normal_(upd.linear.weight)
    s = torch.randn(4, 6, dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(4, 4, dtype=torch.float64), dim=-1)
    frames = Rigid(quat_to_rot(q), torch.randn(4, 3, dtype=torch.float64))
    q_new, new = upd(s, q, frames)
    bcd, t = upd.linear(s).split(3, dim=-1)
    step = Rigid(quat_to_rot(torch.cat([torch.ones(4, 1, dtype=torch.float64), bcd], -1)), t)
    ref = frames.compose(step)
    assert torch.allclose(new.rot, ref.rot, atol=1e-12) and torch.allclose(new.trans, ref.trans, atol=1e-12)
    assert torch.allclose(q_new.norm(dim=-1), torch.ones(4, dtype=torch.float64))


def test_structure_module_all_atom_outputs():
    torch.manual_seed(0)
    cfg = tiny_config(sm_dropout=0.0)
    sm = StructureModule(cfg).double()
    for p in sm.parameters():
        torch.nn.init.normal_(p, std=0.3)
    L = 20
    aatype = torch.arange(L)
    s = torch.randn(L, cfg.c_s, dtype=torch.float64, requires_grad=True)
    out = sm(s, torch.randn(L, L, cfg.c_z, dtype=torch.float64), torch.ones(L, dtype=torch.float64), aatype)
    assert out["frames"].shape == (cfg.sm_layers, L, 4, 4)
    assert out["atom_positions"].shape == (L, 37, 3) and out["atom14_positions"].shape == (L, 14, 3)
    assert out["angles"].shape == (cfg.sm_layers, L, 7, 2) and out["sidechain_frames"].shape == (L, 8, 4, 4)
    rot = out["frames"][..., :3, :3]
    assert torch.allclose(rot @ rot.transpose(-1, -2), torch.eye(3, dtype=rot.dtype).expand_as(rot), atol=1e-12)
    # CA is the frame origin (in Å); N and C sit at the residue type's ideal distances
    pos = out["atom_positions"]
    assert torch.allclose(pos[:, 1], out["frames"][-1, :, :3, 3], atol=1e-12)
    ideal = torch.as_tensor(rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS, dtype=torch.float64)[:L]
    assert torch.allclose((pos[:, 0] - pos[:, 1]).norm(dim=-1), ideal[:, 0].norm(dim=-1), atol=1e-9)
    assert torch.allclose((pos[:, 2] - pos[:, 1]).norm(dim=-1), ideal[:, 2].norm(dim=-1), atol=1e-9)
    exists = torch.as_tensor(rc.RESTYPE_ATOM37_MASK)[aatype].bool()
    assert torch.all(pos[~exists] == 0) and torch.isfinite(pos).all()
    out["atom_positions"].sum().backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_ipa_matches_algorithm_22_written_out():
    """Per-pair evaluation of Alg. 22 lines 1-10 with the module's weights, reading the weights
    in AF2's layout: point projections (xyz, head, point), per-head [k | v] scalar projection,
    output features [scalar, x, y, z, |point|, pair]; masks subtract 1e5 from the logits."""
    torch.manual_seed(0)
    L, Cs, Cz, c, cv, H, Pq, Pv = 4, 6, 5, 3, 2, 2, 2, 3
    ipa = InvariantPointAttention(Cs, Cz, c, H, Pq, Pv, c_hidden_v=cv).double()
    for p in ipa.parameters():
        torch.nn.init.normal_(p, std=0.5)
    f64 = torch.float64
    s, z = torch.randn(L, Cs, dtype=f64), torch.randn(L, L, Cz, dtype=f64)
    T = random_rigid((L,), 8, f64)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=f64)
    out = ipa(s, z, T, mask)

    q = ipa.linear_q(s).view(L, H, c)
    k, v = ipa.linear_kv(s).view(L, H, c + cv).split([c, cv], dim=-1)
    qp = ipa.linear_q_pts(s).view(L, 3, H, Pq).permute(0, 2, 3, 1)          # [L, H, Pq, xyz]
    kvp = ipa.linear_kv_pts(s).view(L, 3, H, Pq + Pv).permute(0, 2, 3, 1)
    kp, vp = kvp[:, :, :Pq], kvp[:, :, Pq:]
    b = ipa.linear_b(z)
    gamma = torch.nn.functional.softplus(ipa.head_weights)
    w_l, w_c = (1 / 3) ** 0.5, (2 / (9 * Pq)) ** 0.5
    for i in range(L):
        feats_o, feats_pt, feats_norm, feats_pair = [], [], [], []
        for h in range(H):
            logits = torch.zeros(L, dtype=f64)
            for j in range(L):
                dist = sum(((T.rot[i] @ qp[i, h, p] + T.trans[i]) - (T.rot[j] @ kp[j, h, p] + T.trans[j])).pow(2).sum()
                           for p in range(Pq))
                logits[j] = w_l * (q[i, h] @ k[j, h] / c ** 0.5 + b[i, j, h] - gamma[h] * w_c / 2 * dist)
                logits[j] -= 1e5 * (1 - mask[i] * mask[j])
            a = torch.softmax(logits, 0)
            feats_o.append((a[:, None] * v[:, h]).sum(0))
            glob = sum(a[j] * (T.rot[j] @ vp[j, h].T + T.trans[j][:, None]).T for j in range(L))   # [Pv, 3]
            local = (T.rot[i].T @ (glob - T.trans[i]).T).T
            feats_pt.append(local)
            feats_norm.append(torch.sqrt(local.pow(2).sum(-1) + 1e-8))
            feats_pair.append((a[:, None] * z[i]).sum(0))
        pts = torch.stack(feats_pt)                                            # [H, Pv, 3]
        ref = ipa.linear_out(torch.cat([torch.cat(feats_o), pts[..., 0].flatten(), pts[..., 1].flatten(),
                                        pts[..., 2].flatten(), torch.cat(feats_norm),
                                        torch.cat(feats_pair)]))
        assert torch.allclose(out[i], ref, atol=1e-10), i
