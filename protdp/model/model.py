"""AlphaFold2-style model: embedders -> (extra-MSA stack) -> Evoformer -> structure module ->
heads, with recycling (AF2 supplement Algorithm 2 and §1.10).

Recycling: the first `num_recycles` passes run without gradients and feed their detached
outputs (first MSA row, pair representation, pseudo-beta of the all-atom prediction) to the
next pass through the recycling embedder (Alg. 32); only the last pass builds a graph. Pass i
reads MSA sample min(i, P-1) when the batch carries P samples (`protdp.model.inputs`), as AF2
resamples the MSA per recycling pass: stacked [*, P, N, L] (training, fixtures) or built when
the pass starts (`protdp.data.msa_passes`, the predictor's: one pass in memory at a time). In training the number of recycles is drawn by
`sample_num_recycles` from a generator that the caller seeds identically on every data-parallel
rank for the step, so all ranks run the same graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.nn as nn

from protdp.config import load_config
from protdp.model.all_atom import atom37_exists, pseudo_beta
from protdp.model.config import ModelConfig
from protdp.model.embedders import InputEmbedder, RecyclingEmbedder
from protdp.model.evoformer import EvoformerStack, ExtraMSAStack
from protdp.model.heads import (DistogramHead, ExperimentallyResolvedHead, MaskedMSAHead, PAEHead,
                                PLDDTHead, pae_bin_centres, plddt_from_logits, ptm_from_logits)
from protdp.model.inputs import (EXTRA_MSA_FEAT_DIM, check_batch, extra_msa_feat, msa_feat,
                                 num_passes, select_pass, target_feat)
from protdp.model.precision import trunk_autocast
from protdp.model.primitives import Linear, set_attention_backend, set_inference_chunk_size
from protdp.model.structure import StructureModule
from protdp.model.template import TemplateEmbedder, placeholder_templates


def sample_num_recycles(generator: torch.Generator, max_recycles: int) -> int:
    """Uniform number of recycles in [0, max_recycles] from `generator` (seed it identically on
    every data-parallel rank for the step so all ranks run the same number of passes)."""
    return int(torch.randint(0, max_recycles + 1, (1,), generator=generator).item())


class AlphaFoldModel(nn.Module):
    """Algorithm 2 (inference) with recycling; see the module docstring."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.input_embedder = InputEmbedder(cfg)
        self.recycling_embedder = RecyclingEmbedder(cfg)
        if cfg.extra_msa:
            self.extra_msa_embedder = Linear(EXTRA_MSA_FEAT_DIM, cfg.c_e)
            self.extra_msa_stack = ExtraMSAStack(cfg)
        if cfg.templates:
            self.template_embedder = TemplateEmbedder(cfg)
        self.evoformer = EvoformerStack(cfg)
        self.structure_module = StructureModule(cfg)
        self.distogram_head = DistogramHead(cfg)
        self.masked_msa_head = MaskedMSAHead(cfg)
        self.plddt_head = PLDDTHead(cfg)
        self.experimentally_resolved_head = ExperimentallyResolvedHead(cfg)
        if cfg.pae_head:
            self.pae_head = PAEHead(cfg)
        set_attention_backend(self, cfg.attention_backend)
        set_inference_chunk_size(self, cfg.chunk_size)

    def set_axial_comm(self, comm) -> None:
        """Run the Evoformer and extra-MSA stacks split over a DAP group (`comm`: a
        `protdp.parallel.dap.AxialComm`; None = one rank). Every rank of the group must call
        forward on the same batch with the same RNG state (shared dropout masks)."""
        self.evoformer.axial = comm
        if self.config.extra_msa:
            self.extra_msa_stack.axial = comm

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def dtype(self) -> torch.dtype:
        return self.input_embedder.linear_tf_m.weight.dtype

    def _autocast(self, device: torch.device):
        return trunk_autocast(device, self.config.bf16)

    def _extra_msa(self, batch: Mapping, dtype: torch.dtype):
        """Extra-MSA features [*, E, L, 25] and mask [*, E, L]: the batch's `extra_*` keys; else
        (hand-built batches) the rows beyond `max_msa_clusters`, or one fully masked row, as AF2
        runs the stack on its zero-padded extra MSA, so every rank builds the same graph."""
        if "extra_msa" in batch:
            return (extra_msa_feat(batch["extra_msa"], batch["extra_has_deletion"],
                                   batch["extra_deletion_value"], dtype),
                    batch["extra_msa_mask"].to(dtype))
        n = self.config.max_msa_clusters
        if "msa_feat" not in batch and batch["msa"].shape[-2] > n:
            rows = slice(n, None)
            return (extra_msa_feat(batch["msa"][..., rows, :], batch["has_deletion"][..., rows, :],
                                   batch["deletion_value"][..., rows, :], dtype),
                    batch["msa_mask"][..., rows, :].to(dtype))
        mask = batch["msa_mask"][..., :1, :].to(dtype) * 0.0
        return torch.zeros(mask.shape + (EXTRA_MSA_FEAT_DIM,), dtype=dtype, device=mask.device), mask

    def _cluster_msa(self, batch: Mapping, dtype: torch.dtype):
        """Main-stack MSA features [*, N, L, 49] and mask [*, N, L] (hand-built batches without
        `extra_msa` keep their first `max_msa_clusters` rows when the extra stack is on)."""
        feat, mask = msa_feat(batch, dtype), batch["msa_mask"].to(dtype)
        if self.config.extra_msa and "extra_msa" not in batch and "msa_feat" not in batch:
            n = self.config.max_msa_clusters
            feat, mask = feat[..., :n, :, :], mask[..., :n, :]
        return feat, mask

    def _trunk(self, batch: Mapping, prev: dict, pair_mask: torch.Tensor):
        """Embeddings, recycling, extra-MSA stack and Evoformer -> m, z, s (Alg. 2 lines 5-18)."""
        dtype = self.dtype
        m_feat, msa_mask = self._cluster_msa(batch, dtype)
        m, z = self.input_embedder(target_feat(batch, dtype), batch["residue_index"], m_feat)
        m0_r, z_r = self.recycling_embedder(prev["m0"], prev["z"], prev["x"])
        m = torch.cat([m[..., :1, :, :] + m0_r[..., None, :, :], m[..., 1:, :, :]], dim=-3)
        z = z + z_r
        cfg = self.config
        if cfg.templates:   # Alg. 2 lines 9-13; AF2's placeholder when the batch has none
            templates = batch if "template_aatype" in batch else \
                placeholder_templates(batch["aatype"], dtype)
            z = z + self.template_embedder.pair(templates, z, pair_mask)
        if cfg.extra_msa:
            extra_feat, extra_mask = self._extra_msa(batch, dtype)
            z = self.extra_msa_stack(self.extra_msa_embedder(extra_feat), z, extra_mask, pair_mask)
        num_rows = m.shape[-3]
        if cfg.templates and cfg.template_torsion_angles:   # Alg. 2 lines 7-8 (§1.7.1)
            rows, rows_mask = self.template_embedder.msa_rows(templates, dtype)
            m = torch.cat([m, rows.to(m.dtype)], dim=-3)
            msa_mask = torch.cat([msa_mask, rows_mask.to(msa_mask.dtype)], dim=-2)
        m, z, s = self.evoformer(m, z, msa_mask, pair_mask)
        return m[..., :num_rows, :, :], z, s     # template rows never reach the heads (AF2)

    def iteration(self, batch: Mapping, prev: dict | None) -> dict:
        """One pass of Algorithm 2's loop body on a single-sample batch (`select_pass`)."""
        cfg, dtype = self.config, self.dtype
        aatype = batch["aatype"]
        seq_mask = batch["seq_mask"].to(dtype)
        pair_mask = seq_mask[..., :, None] * seq_mask[..., None, :]               # [*, L, L]
        L = aatype.shape[-1]
        if prev is None:
            lead = aatype.shape[:-1]
            prev = {"m0": seq_mask.new_zeros(lead + (L, cfg.c_m)),
                    "z": seq_mask.new_zeros(lead + (L, L, cfg.c_z)),
                    "x": seq_mask.new_zeros(lead + (L, 3))}
        with self._autocast(aatype.device):
            m, z, s = self._trunk(batch, prev, pair_mask)
        m, z, s = m.to(dtype), z.to(dtype), s.to(dtype)

        sm = self.structure_module(s, z, seq_mask, aatype)
        out = {
            "msa": m, "pair": z, "single": s, "msa_first_row": m[..., 0, :, :], "sm": sm,
            "frames": sm["frames"][-1],                                          # [*, L, 4, 4] Å
            "final_atom_positions": sm["atom_positions"],                        # [*, L, 37, 3]
            "final_atom_mask": atom37_exists(aatype, dtype),                     # [*, L, 37]
            "distogram_logits": self.distogram_head(z),
            "masked_msa_logits": self.masked_msa_head(m),
            "plddt_logits": self.plddt_head(sm["single"]),
            "experimentally_resolved_logits": self.experimentally_resolved_head(s),
        }
        out["plddt"] = plddt_from_logits(out["plddt_logits"])                    # [*, L] in 0-100
        if cfg.pae_head:
            out["pae_logits"] = self.pae_head(z)
            centres = pae_bin_centres(cfg).to(z.device)
            probs = torch.softmax(out["pae_logits"].to(out["plddt"].dtype), -1)
            out["pae"] = (probs * centres.to(probs.dtype)).sum(-1)               # [*, L, L] Å
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
                recycle_generator: torch.Generator | None = None,
                after_pass: Callable[[int, dict], bool] | None = None) -> dict:
        """Run 1 + num_recycles passes; gradients flow only through the last one.
        `after_pass(i, out)` (inference, no gradients) is called after pass i; returning True
        stops recycling there (early stop) and `num_recycles` reports the passes run - 1."""
        check_batch(batch)
        n = self.resolve_num_recycles(num_recycles, recycle_generator)
        grad = torch.is_grad_enabled()
        if after_pass is not None and grad:
            raise ValueError("after_pass (early stop) is for inference: run under torch.no_grad()")
        prev = None
        for i in range(n + 1):
            last = i == n
            with torch.set_grad_enabled(grad and last):
                out = self.iteration(select_pass(batch, i), prev)
            if after_pass is not None and not last and after_pass(i, out):
                n = i
                break
            if not last:
                prev = {"m0": out["msa_first_row"].detach(), "z": out["pair"].detach(),
                        "x": pseudo_beta(batch["aatype"], out["final_atom_positions"]).detach()}
        out["num_recycles"] = n
        passes = num_passes(batch)
        out["msa_sample"] = 0 if passes is None else min(n, passes - 1)          # for the losses
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
