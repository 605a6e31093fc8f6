"""Output heads (AF2 supplement §1.9): distogram (§1.9.8), masked MSA (§1.9.9),
pLDDT (Alg. 29), predicted aligned error and pTM (§1.9.7), experimentally resolved (§1.9.10).
Final layers are zero-initialised. Confidence read-outs follow AF2's `confidence.py`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from protdp.data.residue_constants import NUM_ATOM37
from protdp.data.residues import NUM_MSA_TOKENS
from protdp.model.config import ModelConfig
from protdp.model.primitives import LayerNorm, Linear


def distogram_edges(cfg: ModelConfig) -> torch.Tensor:
    """The 63 inner bin edges of the 64-bin distogram (2.3125 ... 21.6875 Å)."""
    return torch.linspace(cfg.distogram_min, cfg.distogram_max, cfg.distogram_bins - 1)


def pae_edges(cfg: ModelConfig) -> torch.Tensor:
    """Inner bin edges of the aligned-error histogram (0 ... 31 Å)."""
    return torch.linspace(0.0, cfg.pae_max, cfg.pae_bins - 1)


def pae_bin_centres(cfg: ModelConfig) -> torch.Tensor:
    edges = pae_edges(cfg)
    step = edges[1] - edges[0]
    centres = edges + step / 2                                                # AF2 _calculate_bin_centers
    return torch.cat([centres, centres[-1:] + step])


def plddt_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Alg. 29 readout: 100 * sum_b p_b * centre_b with centres (b + 0.5) / n_bins -> [*, L]."""
    n = logits.shape[-1]
    dtype = torch.promote_types(logits.dtype, torch.float32)
    centres = (torch.arange(n, device=logits.device, dtype=dtype) + 0.5) / n
    return 100.0 * (torch.softmax(logits.to(dtype), dim=-1) * centres).sum(-1)


def ptm_from_logits(logits: torch.Tensor, centres: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """pTM (supplement Eq. 40): max over alignment frames i of the expected TM term over j.

    logits [*, L, L, bins], centres [bins], mask [*, L] -> [*]."""
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    mask = mask.to(probs.dtype)
    n = mask.sum(-1).clamp(min=19.0)                                          # [*]
    d0 = 1.24 * (n - 15.0).clamp(min=1.0) ** (1.0 / 3.0) - 1.8
    tm = 1.0 / (1.0 + (centres.to(probs) / d0[..., None]) ** 2)              # [*, bins]
    expected = (probs * tm[..., None, None, :]).sum(-1)                      # [*, L, L]
    per_frame = (expected * mask[..., None, :]).sum(-1) / (mask.sum(-1, keepdim=True) + 1e-8)
    per_frame = per_frame.masked_fill(mask == 0, 0.0)
    return per_frame.max(dim=-1).values


class DistogramHead(nn.Module):
    """§1.9.8: symmetric logits over pseudo-beta distance bins from the pair representation."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = Linear(cfg.c_z, cfg.distogram_bins, init="final")

    def forward(self, z):
        logits = self.linear(z)                                               # [*, L, L, bins]
        return logits + logits.transpose(-2, -3)


class MaskedMSAHead(nn.Module):
    """§1.9.9: per-position logits over the 23 MSA classes."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = Linear(cfg.c_m, NUM_MSA_TOKENS, init="final")

    def forward(self, m):
        return self.linear(m)                                                 # [*, S, L, 23]


class PLDDTHead(nn.Module):
    """Algorithm 29: per-residue lDDT-Cα bins from the structure module's single rep."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = LayerNorm(cfg.sm_channels)                   # structure module's single
        self.linear_1 = Linear(cfg.sm_channels, cfg.c_plddt, init="relu")
        self.linear_2 = Linear(cfg.c_plddt, cfg.c_plddt, init="relu")
        self.linear_3 = Linear(cfg.c_plddt, cfg.plddt_bins, init="final")

    def forward(self, s):
        return self.linear_3(F.relu(self.linear_2(F.relu(self.linear_1(self.norm(s))))))


class PAEHead(nn.Module):
    """§1.9.7: aligned-error bins from the pair representation."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = Linear(cfg.c_z, cfg.pae_bins, init="final")

    def forward(self, z):
        return self.linear(z)                                                 # [*, L, L, bins]


class ExperimentallyResolvedHead(nn.Module):
    """§1.9.10: per-atom (atom37) logits that the atom is resolved in an experiment, from the
    Evoformer's single representation."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = Linear(cfg.c_s, NUM_ATOM37, init="final")

    def forward(self, s):
        return self.linear(s)                                                 # [*, L, 37]
