"""Structure module (Alg. 20-23): rigid algebra, IPA invariance, ideal backbone geometry."""

import math

import torch

from model_fixtures import tiny_config, one_thread  # noqa: F401
from protdp.model.rigid import Rigid, quat_to_rot
from protdp.model.structure import (InvariantPointAttention, StructureModule, backbone_atoms,
                                    psi_from_atoms)


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


def test_ideal_backbone_reconstruction_and_psi_roundtrip():
    g = torch.Generator().manual_seed(0)
    # idealised residues: place the ideal atoms under random frames with random psi
    frames = random_rigid((6,), 7)
    psi = torch.nn.functional.normalize(torch.randn(6, 2, generator=g), dim=-1)
    atoms = backbone_atoms(frames, psi)                                      # [6, 5, 3]
    assert atoms.shape == (6, 5, 3)
    d = lambda i, j: (atoms[:, i] - atoms[:, j]).norm(dim=-1)               # noqa: E731
    assert torch.allclose(d(0, 1), torch.full((6,), 1.46), atol=2e-3)        # N-CA
    assert torch.allclose(d(1, 2), torch.full((6,), 1.526), atol=2e-3)       # CA-C
    assert torch.allclose(d(2, 3), torch.full((6,), 1.23), atol=1e-2)        # C=O
    assert torch.allclose(d(1, 4), torch.full((6,), 1.53), atol=1e-2)        # CA-CB
    assert torch.allclose(psi_from_atoms(atoms), psi, atol=1e-4)
    again = Rigid.from_3_points(atoms[:, 0], atoms[:, 1], atoms[:, 2])
    assert torch.allclose(again.rot, frames.rot, atol=1e-4)


def test_structure_module_outputs_and_stop_gradient():
    torch.manual_seed(0)
    cfg = tiny_config(sm_dropout=0.0)
    sm = StructureModule(cfg)
    for p in sm.parameters():
        torch.nn.init.normal_(p, std=0.3)
    L = 7
    s = torch.randn(L, cfg.c_s, requires_grad=True)
    out = sm(s, torch.randn(L, L, cfg.c_z), torch.ones(L))
    assert out["frames"].shape == (cfg.sm_layers, L, 4, 4)
    assert out["atom_positions"].shape == (L, 5, 3)
    rot = out["frames"][..., :3, :3]
    assert torch.allclose(rot @ rot.transpose(-1, -2), torch.eye(3).expand_as(rot), atol=1e-4)
    # CA is the frame origin (in Å)
    assert torch.allclose(out["atom_positions"][:, 1], out["frames"][-1, :, :3, 3], atol=1e-5)
    assert torch.isfinite(out["atom_positions"]).all()


def test_ipa_matches_algorithm_22_written_out():
    """Per-pair evaluation of Alg. 22 lines 1-10 with the module's weights."""
    torch.manual_seed(0)
    L, Cs, Cz, c, H, Pq, Pv = 4, 6, 5, 3, 2, 2, 3
    ipa = InvariantPointAttention(Cs, Cz, c, H, Pq, Pv)
    for p in ipa.parameters():
        torch.nn.init.normal_(p, std=0.5)
    s, z = torch.randn(L, Cs), torch.randn(L, L, Cz)
    T = random_rigid((L,), 8)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    out = ipa(s, z, T, mask)

    q = ipa.linear_q(s).view(L, H, c)
    k, v = ipa.linear_kv(s).view(L, H, 2 * c).split(c, dim=-1)
    qp = ipa.linear_q_pts(s).view(L, H, Pq, 3)
    kvp = ipa.linear_kv_pts(s).view(L, H, Pq + Pv, 3)
    kp, vp = kvp[:, :, :Pq], kvp[:, :, Pq:]
    b = ipa.linear_b(z)
    gamma = torch.nn.functional.softplus(ipa.head_weights)
    w_l, w_c = (1 / 3) ** 0.5, (2 / (9 * Pq)) ** 0.5
    for i in range(L):
        feats_o, feats_pt, feats_norm, feats_pair = [], [], [], []
        for h in range(H):
            logits = torch.zeros(L)
            for j in range(L):
                dist = sum(((T.rot[i] @ qp[i, h, p] + T.trans[i]) - (T.rot[j] @ kp[j, h, p] + T.trans[j])).pow(2).sum()
                           for p in range(Pq))
                logits[j] = w_l * (q[i, h] @ k[j, h] / c ** 0.5 + b[i, j, h] - gamma[h] * w_c / 2 * dist)
            logits = logits.masked_fill(mask == 0, -1e9) if mask[i] else torch.full((L,), -1e9)
            a = torch.softmax(logits, 0)
            feats_o.append((a[:, None] * v[:, h]).sum(0))
            glob = sum(a[j] * (T.rot[j] @ vp[j, h].T + T.trans[j][:, None]).T for j in range(L))   # [Pv, 3]
            local = (T.rot[i].T @ (glob - T.trans[i]).T).T
            feats_pt.append(local.flatten())
            feats_norm.append(torch.sqrt(local.pow(2).sum(-1) + 1e-8))
            feats_pair.append((a[:, None] * z[i]).sum(0))
        ref = ipa.linear_out(torch.cat([torch.cat(feats_o), torch.cat(feats_pt), torch.cat(feats_norm),
                                        torch.cat(feats_pair)]))
        assert torch.allclose(out[i], ref, atol=1e-4), i
