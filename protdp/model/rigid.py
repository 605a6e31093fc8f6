"""Rigid-body frames T = (R, t) (AF2 supplement §1.1 and Alg. 21, 23).

A frame maps local coordinates to global ones: x_global = R x_local + t. Rotations are
[*, 3, 3] matrices, translations [*, 3]. All operations are pure and differentiable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def quat_to_rot(q: torch.Tensor) -> torch.Tensor:
    """Unit quaternion (a, b, c, d) [*, 4] -> rotation matrix [*, 3, 3] (Alg. 23 line 3)."""
    q = q / torch.linalg.norm(q, dim=-1, keepdim=True)
    a, b, c, d = q.unbind(-1)
    rows = [
        a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c),
        2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b),
        2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d,
    ]
    return torch.stack(rows, dim=-1).reshape(q.shape[:-1] + (3, 3))


def quat_multiply(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """Hamilton product of quaternions (a, b, c, d) [*, 4] x [*, 4] -> [*, 4]."""
    a1, b1, c1, d1 = q1.unbind(-1)
    a2, b2, c2, d2 = q2.unbind(-1)
    return torch.stack([a1 * a2 - b1 * b2 - c1 * c2 - d1 * d2,
                        a1 * b2 + b1 * a2 + c1 * d2 - d1 * c2,
                        a1 * c2 - b1 * d2 + c1 * a2 + d1 * b2,
                        a1 * d2 + b1 * c2 - c1 * b2 + d1 * a2], dim=-1)


def rot_x(angle_sin_cos: torch.Tensor) -> torch.Tensor:
    """Rotation about the x axis from (sin, cos) [*, 2] -> [*, 3, 3]."""
    s, c = angle_sin_cos.unbind(-1)
    zero, one = torch.zeros_like(s), torch.ones_like(s)
    rows = [one, zero, zero, zero, c, -s, zero, s, c]
    return torch.stack(rows, dim=-1).reshape(s.shape + (3, 3))


@dataclass
class Rigid:
    """A batch of rigid transforms: rot [*, 3, 3], trans [*, 3]."""

    rot: torch.Tensor
    trans: torch.Tensor

    @staticmethod
    def identity(shape: tuple, device=None, dtype=torch.float32) -> "Rigid":
        rot = torch.eye(3, device=device, dtype=dtype).expand(*shape, 3, 3).clone()
        return Rigid(rot, torch.zeros(*shape, 3, device=device, dtype=dtype))

    @staticmethod
    def from_3_points(x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor,
                      eps: float = 1e-8) -> "Rigid":
        """Algorithm 21 (Gram-Schmidt): frame at x2 with e1 along x3 - x2 and x1 in the xy plane.

        For backbones call with (N, CA, C)."""
        v1 = x3 - x2
        v2 = x1 - x2
        e1 = v1 / torch.sqrt((v1 ** 2).sum(-1, keepdim=True) + eps)
        u2 = v2 - e1 * (e1 * v2).sum(-1, keepdim=True)
        e2 = u2 / torch.sqrt((u2 ** 2).sum(-1, keepdim=True) + eps)
        e3 = torch.cross(e1, e2, dim=-1)
        return Rigid(torch.stack([e1, e2, e3], dim=-1), x2)

    @staticmethod
    def from_3_points_neg_x(point_on_neg_x_axis: torch.Tensor, origin: torch.Tensor,
                            point_on_xy_plane: torch.Tensor, eps: float = 1e-8) -> "Rigid":
        """Algorithm 21 in AF2's argument order (`r3.rigids_from_3_points`): frame at `origin`,
        x axis from `point_on_neg_x_axis` towards `origin`, `point_on_xy_plane` at y >= 0."""
        e0 = origin - point_on_neg_x_axis
        e0 = e0 / torch.sqrt((e0 ** 2).sum(-1, keepdim=True) + eps)
        e1 = point_on_xy_plane - origin
        e1 = e1 - e0 * (e1 * e0).sum(-1, keepdim=True)
        e1 = e1 / torch.sqrt((e1 ** 2).sum(-1, keepdim=True) + eps)
        return Rigid(torch.stack([e0, e1, torch.cross(e0, e1, dim=-1)], dim=-1), origin)

    def compose(self, other: "Rigid") -> "Rigid":
        """self ∘ other: apply `other` first, then `self`."""
        rot = self.rot @ other.rot
        trans = (self.rot @ other.trans[..., None])[..., 0] + self.trans
        return Rigid(rot, trans)

    def invert(self) -> "Rigid":
        rot_t = self.rot.transpose(-1, -2)
        return Rigid(rot_t, -(rot_t @ self.trans[..., None])[..., 0])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [*, 3] (broadcast against the frame batch) -> R x + t."""
        return torch.einsum("...ij,...j->...i", self.rot, x) + self.trans

    def invert_apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [*, 3] -> R^T (x - t)."""
        return torch.einsum("...ji,...j->...i", self.rot, x - self.trans)

    def compose_rot(self, rot: torch.Tensor) -> "Rigid":
        """self ∘ (rot, 0): rotate first, then apply self (AF2 `rigids_mul_rots`)."""
        return Rigid(self.rot @ rot, self.trans)

    def unsqueeze(self, dim: int) -> "Rigid":
        """Insert a batch dimension (dim counts over the batch dims, not the 3/3x3 tails)."""
        d_rot = dim if dim >= 0 else dim - 2
        d_trans = dim if dim >= 0 else dim - 1
        return Rigid(self.rot.unsqueeze(d_rot), self.trans.unsqueeze(d_trans))

    def stop_rot_gradient(self) -> "Rigid":
        """Detach the rotation only (Alg. 20 line 20: gradients still flow into translations)."""
        return Rigid(self.rot.detach(), self.trans)

    def detach(self) -> "Rigid":
        return Rigid(self.rot.detach(), self.trans.detach())

    def index(self, index) -> "Rigid":
        """Index the batch dimensions, e.g. `frames.index((..., 4))` picks group 4."""
        index = index if isinstance(index, tuple) else (index,)
        return Rigid(self.rot[index + (slice(None), slice(None))], self.trans[index + (slice(None),)])

    @staticmethod
    def cat(rigids: list["Rigid"], dim: int) -> "Rigid":
        """Concatenate along a batch dimension (negative dims count over the batch dims)."""
        d_rot = dim if dim >= 0 else dim - 2
        d_trans = dim if dim >= 0 else dim - 1
        return Rigid(torch.cat([r.rot for r in rigids], d_rot),
                     torch.cat([r.trans for r in rigids], d_trans))

    def to_tensor_4x4(self) -> torch.Tensor:
        """[*, 4, 4] homogeneous matrices (for outputs/serialisation)."""
        out = torch.zeros(self.trans.shape[:-1] + (4, 4), dtype=self.trans.dtype,
                          device=self.trans.device)
        out[..., :3, :3] = self.rot
        out[..., :3, 3] = self.trans
        out[..., 3, 3] = 1.0
        return out

    @staticmethod
    def from_tensor_4x4(m: torch.Tensor) -> "Rigid":
        return Rigid(m[..., :3, :3], m[..., :3, 3])
