"""Analytic matmul FLOP counts of the Evoformer (AF2 supplement Alg. 6-15, 18-19), to turn a
measured time into achieved TFLOP/s. Only matrix products are counted (2 * m * n * k each);
LayerNorm, softmax, gating and the structure module are a few per cent and left out, so the
achieved figure is a slight underestimate. Training = forward + backward (2x forward) + one
recomputed forward with activation recompute.
"""

from __future__ import annotations

from protdp.model.config import ModelConfig


def _attention(rows: int, length: int, c_in: int, heads: int, c: int, bias_c: int | None) -> int:
    """Gated attention over `rows` independent problems of `length` tokens (Alg. 7/8/13/14):
    q, k, v, g projections, logits, weights . v, output projection, optional pair-bias linear."""
    hc = heads * c
    tokens = rows * length
    flops = 4 * 2 * tokens * c_in * hc                     # q, k, v, gate
    flops += 2 * 2 * rows * heads * length * length * c    # q k^T and weights v
    flops += 2 * tokens * hc * c_in                        # output
    if bias_c is not None:
        flops += 2 * length * length * bias_c * heads      # pair bias, once for all rows
    return flops


def evoformer_block_flops(cfg: ModelConfig, n_seq: int, n_res: int, *, c_m: int | None = None,
                          c_hidden_msa: int | None = None, global_column: bool = False) -> int:
    """Forward matmul FLOPs of one Evoformer block (Alg. 6; Alg. 18 with `global_column`) on an
    MSA of n_seq x n_res and a pair representation of n_res x n_res."""
    S, L, cz = n_seq, n_res, cfg.c_z
    cm = c_m or cfg.c_m
    ch = c_hidden_msa or cfg.c_hidden_msa_att
    H, n = cfg.msa_heads, cfg.transition_n
    flops = _attention(S, L, cm, H, ch, cz)                               # Alg. 7 row + pair bias
    if global_column:                                                     # Alg. 19: one query
        flops += 2 * S * L * cm * (2 * ch + 2 * H * ch) + 2 * 2 * L * H * S * ch
        flops += 2 * S * L * H * ch * cm
    else:
        flops += _attention(L, S, cm, H, ch, None)                        # Alg. 8 column
    flops += 2 * 2 * S * L * cm * n * cm                                  # Alg. 9 transition
    co = cfg.c_hidden_opm
    flops += 2 * 2 * S * L * cm * co + 2 * L * L * S * co * co + 2 * L * L * co * co * cz  # Alg. 10
    cmul = cfg.c_hidden_tri_mul
    tri_mul = 4 * 2 * L * L * cz * cmul + 2 * L * L * cz * cz + 2 * L * L * L * cmul
    tri_mul += 2 * L * L * cmul * cz
    flops += 2 * tri_mul                                                  # Alg. 11, 12
    flops += 2 * _attention(L, L, cz, cfg.pair_heads, cfg.c_hidden_tri_att, cz)  # Alg. 13, 14
    flops += 2 * 2 * L * L * cz * n * cz                                  # Alg. 15 transition
    return flops


def trunk_forward_flops(cfg: ModelConfig, n_seq: int, n_res: int, n_extra_seq: int = 0) -> int:
    """Forward FLOPs of the Evoformer stack plus (if configured) the extra-MSA stack, one pass."""
    flops = cfg.n_blocks * evoformer_block_flops(cfg, n_seq, n_res)
    if cfg.extra_msa and n_extra_seq:
        flops += cfg.n_extra_blocks * evoformer_block_flops(
            cfg, n_extra_seq, n_res, c_m=cfg.c_e, c_hidden_msa=cfg.c_hidden_extra_att,
            global_column=True)
    return flops


def training_step_flops(cfg: ModelConfig, n_seq: int, n_res: int, n_extra_seq: int = 0,
                        recompute: bool | None = None, no_grad_passes: int = 0) -> int:
    """FLOPs of one training step: forward, backward (2x), a recomputed forward when
    recomputing, plus `no_grad_passes` forward-only recycling passes."""
    fwd = trunk_forward_flops(cfg, n_seq, n_res, n_extra_seq)
    recompute = cfg.recompute if recompute is None else recompute
    return fwd * (3 + (1 if recompute else 0) + no_grad_passes)
