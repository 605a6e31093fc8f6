"""AlphaFold-Multimer model (Evans et al. 2021; AlphaFold v2.3.2 `modules_multimer.AlphaFold`,
`AlphaFoldIteration`, `EmbeddingsAndEvoformer`, `folding_multimer.StructureModule`), built by
composition from protdp's monomer modules:

- inputs: `MultimerInputEmbedder` (21-class target_feat, relative chain encoding) on the MSA
  sampled inside the model per recycling pass (`msa.sample_msa_features`);
- recycling (Alg. 32, `RecyclingEmbedder`), then the template pair update
  (`template`), the extra-MSA stack and the Evoformer with the multimer block order:
  outer product mean FIRST, then MSA row / column attention, MSA transition and the pair
  updates (`outer_product_mean.first`); template torsion rows are appended to the MSA for the
  Evoformer and cropped before the masked-MSA head;
- structure module: AF2's Algorithm 20 (`protdp.model.structure.StructureModule`) with the
  multimer `position_scale` 20; the multimer IPA (separate q/k/v scalar projections without
  bias, per-head point projections, logits scaled by sqrt(1/3) after summing) is the same
  function and loads into the monomer layout (`protdp.weights.alphafold_multimer`);
- heads: distogram, masked MSA (22 classes), pLDDT, experimentally resolved, PAE; pTM, ipTM,
  ranking confidence and the chain-pair ipTM (`heads.complex_confidence`);
- recycling stops early when the CA distance matrix changes by < `recycle_tolerance` Å (RMS),
  as AlphaFold-Multimer does (the first recycle always runs).

One complex per call (no batch dimension), like AlphaFold-Multimer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from protdp.data import residue_constants as rc
from protdp.model.all_atom import atom37_exists, pseudo_beta
from protdp.model.config import ModelConfig
from protdp.model.embedders import RecyclingEmbedder
from protdp.model.evoformer import EvoformerBlock
from protdp.model.heads import (DistogramHead, ExperimentallyResolvedHead, PAEHead, PLDDTHead,
                                distogram_edges, pae_bin_centres, plddt_from_logits)
from protdp.model.multimer.embedders import MultimerInputEmbedder
from protdp.model.multimer.heads import (chain_pair_actifptm, complex_confidence,
                                          contact_probability)
from protdp.model.multimer.msa import NUM_EXTRA_MSA, NUM_MSA, MaskedMsaConfig, sample_msa_features
from protdp.model.multimer.template import MultimerTemplateEmbedder
from protdp.model.precision import trunk_autocast
from protdp.model.primitives import Linear
from protdp.model.structure import StructureModule

MULTIMER_POSITION_SCALE = 20.0          # model_config(multimer): structure_module.position_scale
MASKED_MSA_CLASSES_MULTIMER = 22        # heads.masked_msa.num_output (AF2 monomer: 23)
RECYCLE_TOLERANCE = 0.5                 # model.recycle_early_stop_tolerance (Å)


@dataclass
class MultimerConfig:
    """Trunk sizes (`trunk`, a ModelConfig with position_scale 20 and pae_head on) plus the
    multimer-only settings."""

    trunk: ModelConfig
    num_msa: int = NUM_MSA
    num_extra_msa: int = NUM_EXTRA_MSA
    templates: bool = True
    c_t: int = 64
    template_blocks: int = 2
    template_heads: int = 4
    c_hidden_template_att: int = 16
    c_hidden_template_mul: int = 64
    template_transition_n: int = 2
    recycle_tolerance: float = RECYCLE_TOLERANCE
    masking: MaskedMsaConfig = field(default_factory=MaskedMsaConfig)


class MultimerEvoformerBlock(EvoformerBlock):
    """`EvoformerIteration` with `outer_product_mean.first` (the multimer order)."""

    outer_product_first = True


class _Stack(nn.Module):
    def __init__(self, blocks, c_m=None, c_s=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        if c_m is not None:
            self.linear_s = Linear(c_m, c_s)                      # single_activations


class MaskedMSAHeadMultimer(nn.Module):
    def __init__(self, c_m: int):
        super().__init__()
        self.linear = Linear(c_m, MASKED_MSA_CLASSES_MULTIMER, init="final")

    def forward(self, m):
        return self.linear(m)                                     # [S, L, 22]


def ca_distance_change(prev_pos: torch.Tensor, new_pos: torch.Tensor, seq_mask) -> torch.Tensor:
    """RMS change of the CA distance matrix (AlphaFold-Multimer's recycling early stop)."""
    ca = rc.ATOM_ORDER["CA"]

    def dist(x):
        return torch.sqrt(((x[:, None, ca] - x[None, :, ca]) ** 2).sum(-1))

    mask = seq_mask[:, None] * seq_mask[None, :]
    sq = (dist(prev_pos) - dist(new_pos)) ** 2
    return torch.sqrt((mask * sq).sum() / (mask.sum() + 1e-10) + 1e-8)


class MultimerModel(nn.Module):
    """See the module docstring."""

    def __init__(self, config: MultimerConfig):
        super().__init__()
        self.config = config
        t = config.trunk
        self.input_embedder = MultimerInputEmbedder(t.c_m, t.c_z, t.c_e)
        self.recycling_embedder = RecyclingEmbedder(t)
        if config.templates:
            self.template_embedder = MultimerTemplateEmbedder(
                t.c_m, t.c_z, config.c_t, config.template_blocks, config.c_hidden_template_mul,
                config.c_hidden_template_att, config.template_heads, config.template_transition_n)
        self.extra_msa_stack = _Stack(
            MultimerEvoformerBlock(t, t.c_e, t.c_hidden_extra_att, global_column=True)
            for _ in range(t.n_extra_blocks))
        self.evoformer = _Stack((MultimerEvoformerBlock(t, t.c_m, t.c_hidden_msa_att)
                                 for _ in range(t.n_blocks)), t.c_m, t.c_s)
        self.structure_module = StructureModule(t)
        self.distogram_head = DistogramHead(t)
        self.masked_msa_head = MaskedMSAHeadMultimer(t.c_m)
        self.plddt_head = PLDDTHead(t)
        self.experimentally_resolved_head = ExperimentallyResolvedHead(t)
        self.pae_head = PAEHead(t)

    @property
    def dtype(self) -> torch.dtype:
        return self.input_embedder.preprocess_1d.weight.dtype

    def _trunk(self, batch: dict, sample: dict, prev: dict, aatype, pair_mask, asym_id):
        """Embeddings, recycling, templates, extra-MSA stack and Evoformer -> m (without the
        template rows) [S, L, C_m], z [L, L, C_z], s [L, C_s]; under bf16 autocast when
        `trunk.bf16` is set (AlphaFold-Multimer's stock `bfloat16` trunk)."""
        dtype = self.dtype
        m, z, e = self.input_embedder(aatype, batch["residue_index"], asym_id,
                                      batch["entity_id"], batch["sym_id"],
                                      sample["msa_feat"].to(dtype),
                                      sample["extra_msa_feat"].to(dtype))
        m0_r, z_r = self.recycling_embedder(prev["m0"], prev["z"],
                                            pseudo_beta(aatype, prev["pos"]))
        m = torch.cat([m[:1] + m0_r[None], m[1:]], dim=0)
        z = z + z_r
        if self.config.templates:
            z = z + self.template_embedder.pair(z, batch, pair_mask, asym_id)
        extra_mask = sample["extra_msa_mask"].to(dtype)
        for block in self.extra_msa_stack.blocks:
            e, z = block(e, z, extra_mask, pair_mask)
        msa_mask = sample["msa_mask"].to(dtype)
        num_msa = m.shape[0]
        if self.config.templates:
            rows, row_mask = self.template_embedder.msa_rows(batch, dtype)
            m, msa_mask = torch.cat([m, rows], 0), torch.cat([msa_mask, row_mask], 0)
        for block in self.evoformer.blocks:
            m, z = block(m, z, msa_mask, pair_mask)
        s = self.evoformer.linear_s(m[0])                                       # [L, C_s]
        m = m[:num_msa]
        return m, z, s

    def iteration(self, batch: dict, sample: dict, prev: dict) -> dict:
        """One recycling pass on one complex; `sample` from `sample_msa_features`."""
        t, dtype = self.config.trunk, self.dtype
        aatype = batch["aatype"].long()
        seq_mask = batch["seq_mask"].to(dtype)
        pair_mask = seq_mask[:, None] * seq_mask[None, :]                       # [L, L]
        asym_id = batch["asym_id"]
        with trunk_autocast(aatype.device, t.bf16):
            m, z, s = self._trunk(batch, sample, prev, aatype, pair_mask, asym_id)
        m, z, s = m.to(dtype), z.to(dtype), s.to(dtype)
        sm = self.structure_module(s, z, seq_mask, aatype)
        atom_mask = atom37_exists(aatype, dtype) * seq_mask[:, None]
        out = {"msa": m, "pair": z, "single": s, "msa_first_row": m[0], "sm": sm,
               "final_atom_positions": sm["atom_positions"] * atom_mask[..., None],
               "final_atom_mask": atom_mask,
               "distogram_logits": self.distogram_head(z),
               "masked_msa_logits": self.masked_msa_head(m),
               "plddt_logits": self.plddt_head(sm["single"]),
               "experimentally_resolved_logits": self.experimentally_resolved_head(s),
               "pae_logits": self.pae_head(z)}
        out["plddt"] = plddt_from_logits(out["plddt_logits"])
        conf = complex_confidence(out["pae_logits"].to(torch.float32),
                                  pae_bin_centres(t).to(z.device), asym_id)
        out.update(conf)
        out["chain_pair_actifptm"], _ = chain_pair_actifptm(   # [C, C], ColabFold's actifpTM
            out["pae_logits"].to(torch.float32), pae_bin_centres(t).to(z.device),
            contact_probability(out["distogram_logits"], distogram_edges(t).to(z.device)), asym_id)
        return out

    def forward(self, batch: dict, num_recycles: int | None = None,
                orders: list | None = None, generator: torch.Generator | None = None) -> dict:
        """1 + num_recycles passes (early stop as AlphaFold-Multimer); pass i samples the MSA
        with `orders[i]` when given (e.g. AlphaFold's recorded order), else `generator`."""
        cfg, dtype = self.config, self.dtype
        n = cfg.trunk.num_recycles if num_recycles is None else int(num_recycles)
        L = batch["aatype"].shape[-1]
        seq_mask = batch["seq_mask"].to(dtype)
        prev = {"m0": seq_mask.new_zeros(L, cfg.trunk.c_m),
                "z": seq_mask.new_zeros(L, L, cfg.trunk.c_z),
                "pos": seq_mask.new_zeros(L, 37, 3)}
        def run(k: int, prev: dict) -> dict:
            sample = sample_msa_features(
                batch["msa"], batch["deletion_matrix"].to(dtype), batch["msa_mask"].to(dtype),
                batch["cluster_bias_mask"], batch.get("bert_mask"), num_msa=cfg.num_msa,
                num_extra_msa=cfg.num_extra_msa, masking=cfg.masking,
                order=None if orders is None else orders[k], generator=generator)
            return self.iteration(batch, sample, prev)

        i, before = 0, None
        while i < n and (i == 0 or cfg.recycle_tolerance <= 0 or ca_distance_change(
                before["pos"], prev["pos"], seq_mask) > cfg.recycle_tolerance):
            with torch.no_grad():
                out = run(i, prev)
            before, prev = prev, {"m0": out["msa_first_row"].detach(),
                                  "z": out["pair"].detach(),
                                  "pos": out["final_atom_positions"].detach()}
            i += 1
        out = run(i, prev)                                  # the final pass (with gradients)
        out["num_recycles"] = i
        return out
