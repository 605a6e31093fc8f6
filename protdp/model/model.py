"""AlphaFold2-style model: embedders -> (extra-MSA stack) -> Evoformer -> structure module ->
heads, with recycling (AF2 supplement Algorithm 2 and §1.10).

Recycling: the first `num_recycles` passes run without gradients and feed their detached
outputs (first MSA row, pair representation, pseudo-beta positions) to the next pass through
the recycling embedder (Alg. 32); only the last pass builds a graph. In training the number
of recycles is drawn by `sample_num_recycles` from a generator that the caller seeds
identically on every data-parallel rank for the step, so all ranks run the same graph.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Mapping

import torch
import torch.nn as nn

from protdp.config import load_config
from protdp.errors import InputError
from protdp.model.config import ModelConfig
from protdp.model.embedders import (MSA_FEAT_DIM, InputEmbedder, RecyclingEmbedder, make_msa_feat,
                                    pseudo_beta)
from protdp.model.evoformer import EvoformerStack, ExtraMSAStack
from protdp.model.heads import (DistogramHead, MaskedMSAHead, PAEHead, PLDDTHead, pae_bin_centres,
                                plddt_from_logits, ptm_from_logits)
from protdp.model.primitives import Linear
from protdp.model.structure import StructureModule

REQUIRED_KEYS = ("aatype", "residue_index", "seq_mask", "msa", "msa_mask", "has_deletion",
                 "deletion_value")


def sample_num_recycles(generator: torch.Generator, max_recycles: int) -> int:
    """Uniform number of recycles in [0, max_recycles] from `generator` (seed it identically on
    every data-parallel rank for the step so all ranks run the same number of passes)."""
    return int(torch.randint(0, max_recycles + 1, (1,), generator=generator).item())


def _check_batch(batch: Mapping) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in batch]
    if missing:
        raise InputError(f"batch is missing key(s) {missing} (see docs/batch_format.md)", field=missing[0])
    L = batch["aatype"].shape[-1]
    for key in ("residue_index", "seq_mask"):
        if batch[key].shape != batch["aatype"].shape:
            raise InputError(f"shape {tuple(batch[key].shape)} != aatype shape "
                             f"{tuple(batch['aatype'].shape)}", field=key)
    for key in ("msa", "msa_mask", "has_deletion", "deletion_value"):
        if batch[key].shape[-1] != L or batch[key].dim() != batch["aatype"].dim() + 1:
            raise InputError(f"expected [*, N, {L}], got {tuple(batch[key].shape)}", field=key)


class AlphaFoldModel(nn.Module):
    """Algorithm 2 (inference) with recycling; see the module docstring."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.input_embedder = InputEmbedder(cfg)
        self.recycling_embedder = RecyclingEmbedder(cfg)
        if cfg.extra_msa:
            self.extra_msa_embedder = Linear(MSA_FEAT_DIM, cfg.c_e)
            self.extra_msa_stack = ExtraMSAStack(cfg)
        self.evoformer = EvoformerStack(cfg)
        self.structure_module = StructureModule(cfg)
        self.distogram_head = DistogramHead(cfg)
        self.masked_msa_head = MaskedMSAHead(cfg)
        self.plddt_head = PLDDTHead(cfg)
        if cfg.pae_head:
            self.pae_head = PAEHead(cfg)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _autocast(self, device: torch.device):
        if not self.config.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def _split_msa(self, batch: Mapping):
        """Main-stack MSA features and (if the extra-MSA stack is on) the extra rows."""
        feat = make_msa_feat(batch["msa"], batch["has_deletion"].float(), batch["deletion_value"].float())
        mask = batch["msa_mask"].float()
        if not self.config.extra_msa:
            return feat, mask, None, None
        if "extra_msa" in batch:
            extra_feat = make_msa_feat(batch["extra_msa"], batch["extra_has_deletion"].float(),
                                       batch["extra_deletion_value"].float())
            return feat, mask, extra_feat, batch["extra_msa_mask"].float()
        n = self.config.max_msa_clusters
        if feat.shape[-3] <= n:
            # No extra rows: run the stack on one fully masked row (as AF2 does with its padded
            # extra MSA) so every rank builds the same graph and every parameter gets a gradient.
            return feat, mask, feat[..., :1, :, :] * 0.0, mask[..., :1, :] * 0.0
        return feat[..., :n, :, :], mask[..., :n, :], feat[..., n:, :, :], mask[..., n:, :]

    def iteration(self, batch: Mapping, prev: dict | None) -> dict:
        """One pass of Algorithm 2's loop body."""
        cfg = self.config
        aatype, seq_mask = batch["aatype"], batch["seq_mask"].float()
        pair_mask = seq_mask[..., :, None] * seq_mask[..., None, :]               # [*, L, L]
        msa_feat, msa_mask, extra_feat, extra_mask = self._split_msa(batch)
        L = aatype.shape[-1]
        if prev is None:
            lead = aatype.shape[:-1]
            prev = {"m0": seq_mask.new_zeros(lead + (L, cfg.c_m)),
                    "z": seq_mask.new_zeros(lead + (L, L, cfg.c_z)),
                    "x": seq_mask.new_zeros(lead + (L, 3))}
        with self._autocast(aatype.device):
            m, z = self.input_embedder(aatype, batch["residue_index"], msa_feat)
            m0_r, z_r = self.recycling_embedder(prev["m0"], prev["z"], prev["x"])
            m = torch.cat([m[..., :1, :, :] + m0_r[..., None, :, :], m[..., 1:, :, :]], dim=-3)
            z = z + z_r
            if extra_feat is not None:
                z = self.extra_msa_stack(self.extra_msa_embedder(extra_feat), z, extra_mask, pair_mask)
            m, z, s = self.evoformer(m, z, msa_mask, pair_mask)
        m, z, s = m.float(), z.float(), s.float()

        sm = self.structure_module(s, z, seq_mask)
        out = {
            "msa": m, "pair": z, "single": sm["single"], "sm": sm,
            "frames": sm["frames"][-1],                                          # [*, L, 4, 4] Å
            "final_atom_positions": sm["atom_positions"],                        # [*, L, 5, 3]
            "final_atom_mask": seq_mask[..., None].expand(seq_mask.shape + (5,)),
            "distogram_logits": self.distogram_head(z),
            "masked_msa_logits": self.masked_msa_head(m),
            "plddt_logits": self.plddt_head(sm["single"]),
        }
        out["plddt"] = plddt_from_logits(out["plddt_logits"])                    # [*, L] in 0-100
        if cfg.pae_head:
            out["pae_logits"] = self.pae_head(z)
            centres = pae_bin_centres(cfg).to(z.device)
            out["pae"] = (torch.softmax(out["pae_logits"], -1) * centres).sum(-1)  # [*, L, L] Å
            out["ptm"] = ptm_from_logits(out["pae_logits"], centres, seq_mask)
        return out

    def resolve_num_recycles(self, num_recycles: int | None,
                             recycle_generator: torch.Generator | None) -> int:
        """Explicit value > sampled (training with a generator) > config.num_recycles."""
        if num_recycles is not None:
            if num_recycles < 0:
                raise ValueError(f"num_recycles must be >= 0, got {num_recycles}")
            return int(num_recycles)
        if self.training and recycle_generator is not None:
            return sample_num_recycles(recycle_generator, self.config.max_recycles)
        return self.config.num_recycles

    def forward(self, batch: Mapping, num_recycles: int | None = None,
                recycle_generator: torch.Generator | None = None) -> dict:
        """Run 1 + num_recycles passes; gradients flow only through the last one."""
        _check_batch(batch)
        n = self.resolve_num_recycles(num_recycles, recycle_generator)
        grad = torch.is_grad_enabled()
        prev = None
        for i in range(n + 1):
            last = i == n
            with torch.set_grad_enabled(grad and last):
                out = self.iteration(batch, prev)
            if not last:
                prev = {"m0": out["msa"][..., 0, :, :].detach(), "z": out["pair"].detach(),
                        "x": pseudo_beta(batch["aatype"], out["final_atom_positions"]).detach()}
        out["num_recycles"] = n
        return out


def build_model(config: "ModelConfig | str | Path | Mapping | None" = None,
                verbose: bool = True) -> AlphaFoldModel:
    """Build the model from a ModelConfig, a YAML path (configs/model/*.yaml) or a mapping;
    prints the parameter count when `verbose`."""
    cfg = load_config(ModelConfig, config)
    model = AlphaFoldModel(cfg)
    if verbose:
        print(f"protdp.model: AlphaFoldModel with {model.num_parameters():,} parameters")
    return model
