"""Analytic parameter count of `protdp.model.AlphaFoldModel` from a ModelConfig alone.

Mirrors the module structure of AF2 supplement Algorithms 3-4 (input embedder), 32 (recycling),
6-19 (Evoformer / extra-MSA stack), 20-23 (structure module) and the heads of §1.9, so the
planner can size af2.yaml without building it. Tested equal to `sum(p.numel())` of the built
model for tiny/small/af2: a change to the model that is not mirrored here fails that test.
"""

from __future__ import annotations

from protdp.data.residue_constants import NUM_ATOM37, NUM_TORSIONS
from protdp.data.residues import NUM_MSA_TOKENS
from protdp.model.config import ModelConfig
from protdp.model.inputs import EXTRA_MSA_FEAT_DIM, MSA_FEAT_DIM, TARGET_FEAT_DIM


def linear(c_in: int, c_out: int, bias: bool = True) -> int:
    return c_in * c_out + (c_out if bias else 0)


def layer_norm(c: int) -> int:
    return 2 * c


def attention(c_in: int, c_hidden: int, heads: int) -> int:
    """Gated multi-head attention: q, k, v without bias, gate and output with bias."""
    hc = c_hidden * heads
    return 3 * linear(c_in, hc, bias=False) + linear(c_in, hc) + linear(hc, c_in)


def transition(c: int, n: int) -> int:
    """Algorithms 9 / 15."""
    return layer_norm(c) + linear(c, n * c) + linear(n * c, c)


def global_column_attention(c_e: int, c_hidden: int, heads: int) -> int:
    """Algorithm 19: per-head queries, one shared key/value head."""
    hc = c_hidden * heads
    return (layer_norm(c_e) + linear(c_e, hc, bias=False) + 2 * linear(c_e, c_hidden, bias=False)
            + linear(c_e, hc) + linear(hc, c_e))


def evoformer_block(cfg: ModelConfig, c_m: int, c_hidden_msa: int, global_column: bool) -> int:
    """Algorithm 6 (Algorithm 18 when `global_column`)."""
    row = layer_norm(c_m) + layer_norm(cfg.c_z) + linear(cfg.c_z, cfg.msa_heads, bias=False) \
        + attention(c_m, c_hidden_msa, cfg.msa_heads)                               # Alg. 7
    if global_column:
        col = global_column_attention(c_m, c_hidden_msa, cfg.msa_heads)            # Alg. 19
    else:
        col = layer_norm(c_m) + attention(c_m, c_hidden_msa, cfg.msa_heads)        # Alg. 8
    c = cfg.c_hidden_opm
    opm = layer_norm(c_m) + 2 * linear(c_m, c) + linear(c * c, cfg.c_z)             # Alg. 10
    t = cfg.c_hidden_tri_mul
    tri_mul = (layer_norm(cfg.c_z) + 4 * linear(cfg.c_z, t) + linear(cfg.c_z, cfg.c_z)
               + layer_norm(t) + linear(t, cfg.c_z))                                # Alg. 11/12
    tri_att = (layer_norm(cfg.c_z) + linear(cfg.c_z, cfg.pair_heads, bias=False)
               + attention(cfg.c_z, cfg.c_hidden_tri_att, cfg.pair_heads))          # Alg. 13/14
    return (row + col + transition(c_m, cfg.transition_n) + opm + 2 * tri_mul + 2 * tri_att
            + transition(cfg.c_z, cfg.transition_n))


def ipa(cfg: ModelConfig) -> int:
    """Algorithm 22."""
    h, hc = cfg.ipa_heads, cfg.ipa_heads * cfg.c_ipa
    c_v = cfg.c_ipa if cfg.c_ipa_v is None else cfg.c_ipa_v
    concat = h * (cfg.c_z + c_v + 4 * cfg.ipa_v_points)
    return (linear(cfg.c_s, hc) + linear(cfg.c_s, hc + h * c_v)
            + linear(cfg.c_s, h * cfg.ipa_qk_points * 3)
            + linear(cfg.c_s, h * (cfg.ipa_qk_points + cfg.ipa_v_points) * 3)
            + linear(cfg.c_z, h) + h + linear(concat, cfg.c_s))


def structure_module(cfg: ModelConfig) -> int:
    """Algorithm 20 (one weight set shared by all layers) with the 7-torsion angle resnet."""
    r = cfg.c_resnet
    psi = (2 * linear(cfg.c_s, r) + 2 * cfg.n_resnet_blocks * linear(r, r)
           + linear(r, 2 * NUM_TORSIONS))
    trans = cfg.sm_transition_layers * linear(cfg.c_s, cfg.c_s) + layer_norm(cfg.c_s)
    return (2 * layer_norm(cfg.c_s) + layer_norm(cfg.c_z) + linear(cfg.c_s, cfg.c_s) + ipa(cfg)
            + trans + linear(cfg.c_s, 6) + psi)


def parameter_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per top-level component (names follow AlphaFoldModel's attributes)."""
    out = {
        "input_embedder": (2 * linear(TARGET_FEAT_DIM, cfg.c_z) + linear(TARGET_FEAT_DIM, cfg.c_m)
                           + linear(MSA_FEAT_DIM, cfg.c_m) + linear(2 * cfg.relpos_k + 1, cfg.c_z)),
        "recycling_embedder": (layer_norm(cfg.c_m) + layer_norm(cfg.c_z)
                               + linear(cfg.recycle_bins, cfg.c_z)),
    }
    if cfg.extra_msa:
        out["extra_msa_embedder"] = linear(EXTRA_MSA_FEAT_DIM, cfg.c_e)
        out["extra_msa_stack"] = cfg.n_extra_blocks * evoformer_block(
            cfg, cfg.c_e, cfg.c_hidden_extra_att, global_column=True)
    out["evoformer"] = (cfg.n_blocks * evoformer_block(cfg, cfg.c_m, cfg.c_hidden_msa_att, False)
                        + linear(cfg.c_m, cfg.c_s))
    out["structure_module"] = structure_module(cfg)
    out["distogram_head"] = linear(cfg.c_z, cfg.distogram_bins)
    out["masked_msa_head"] = linear(cfg.c_m, NUM_MSA_TOKENS)
    out["plddt_head"] = (layer_norm(cfg.c_s) + linear(cfg.c_s, cfg.c_plddt)
                         + linear(cfg.c_plddt, cfg.c_plddt) + linear(cfg.c_plddt, cfg.plddt_bins))
    out["experimentally_resolved_head"] = linear(cfg.c_s, NUM_ATOM37)
    if cfg.pae_head:
        out["pae_head"] = linear(cfg.c_z, cfg.pae_bins)
    return out


def parameter_count(cfg: ModelConfig) -> int:
    return sum(parameter_breakdown(cfg).values())
