"""Memory accounting of one data-parallel rank: model/optimizer state and activations.

State bytes per parameter (Megatron-LM's accounting, `docs/source/api-guide/dist_optimizer.md`;
protdp.parallel.DistributedOptimizer implements the same layout):

    mixed precision (bf16 params, fp32 main grads, fp32 master + Adam m, v):
        plain DP        2 + 4 + (4 + 4 + 4)      = 18 B/param
        distributed     2 + 4 + (4 + 4 + 4) / d  = 6 + 12/d
    fp32 (fp32 params are their own master copy):
        plain DP        4 + 4 + (4 + 4)          = 16 B/param
        distributed     4 + 4 + (4 + 4) / d      = 8 + 8/d

Activations (bytes saved for backward, one example of crop L with S MSA rows) are counted per
module from what autograd keeps in protdp's implementation (AF2 supplement Algorithms 6-23):
layer-norm inputs, linear inputs, gate/ReLU outputs, attention weights where the backend keeps
them. The dominant terms of an Evoformer block are the pair activations O(L^2 c_z) and the MSA
activations O(S L c_m); with the "explicit" attention backend also the triangle-attention
weights O(h L^3) and the row-attention weights O(h S L^2) (the default backends keep q, k, v
and a per-row logsumexp instead).
With recompute (`torch.utils.checkpoint` per block) only each block's inputs (m, z) stay, and
one block's activations are rebuilt during its backward. A transient working set (softmax
logits being produced/differentiated, gradients of the pair stream) comes on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from protdp.data.residue_constants import NUM_ATOM14, NUM_RIGID_GROUPS
from protdp.model.attention import RECOMPUTE_ELEMENTS
from protdp.model.config import ModelConfig
from protdp.planning.params import MSA_FEAT_DIM, parameter_count

GIB = 1024 ** 3
ALL_ATOM_FAPE_PAIRS = NUM_RIGID_GROUPS * NUM_ATOM14     # (frame, atom) pairs per residue pair


# ------------------------------------------------------------------------------ state

def state_bytes_per_param(dp: int, bf16: bool, distributed_optimizer: bool) -> dict[str, float]:
    """Bytes per parameter on one rank: {'params', 'grads', 'optimizer', 'total'}."""
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    shard = dp if distributed_optimizer else 1
    if bf16:
        params, grads, opt = 2.0, 4.0, 12.0 / shard          # fp32 master + m + v
    else:
        params, grads, opt = 4.0, 4.0, 8.0 / shard           # m + v (param is the master)
    return {"params": params, "grads": grads, "optimizer": opt, "total": params + grads + opt}


def state_bytes(n_params: int, dp: int, bf16: bool, distributed_optimizer: bool) -> dict[str, float]:
    """Bytes of params / grads / optimizer state on one rank."""
    per = state_bytes_per_param(dp, bf16, distributed_optimizer)
    return {k: v * n_params for k, v in per.items()}


# ------------------------------------------------------------------------------ activations

@dataclass(frozen=True)
class Shape:
    """Sizes of one training example: crop L, MSA rows S (main stack), extra-MSA rows."""
    L: int
    S: int
    S_extra: int = 0


def stores_attention_weights(cfg: ModelConfig) -> bool:
    """Whether training keeps the softmax weights [R, H, Q, Q] for backward: only the
    "explicit" backend does; "auto" (CUDA memory-efficient SDPA, CPU "recompute"), "sdpa" and
    "recompute" keep q, k, v and a per-row logsumexp (protdp.model.attention)."""
    return cfg.attention_backend == "explicit"


def _attention(R: int, Q: int, c_in: int, hc: int, heads: int, weights: bool = True) -> int:
    """Gated attention over x [R, Q, c_in]: LN output, q/k/v, gate, output, gated output
    (R Q (c_in + 6 hc)) and the softmax weights [R, H, Q, Q] (`weights`) or else their
    per-row logsumexp [R, H, Q]."""
    return R * Q * (c_in + 6 * hc) + R * heads * Q * (Q if weights else 1)


def evoformer_block_elements(cfg: ModelConfig, L: int, S: int, c_m: int, c_hidden_msa: int,
                             global_column: bool = False) -> dict[str, int]:
    """Saved-for-backward elements of one block (Alg. 6 / 18), by sub-module."""
    M, P, n = S * L, L * L, cfg.transition_n
    hm, hc_m = cfg.msa_heads, cfg.msa_heads * c_hidden_msa
    hp, hc_p = cfg.pair_heads, cfg.pair_heads * cfg.c_hidden_tri_att
    t, o, cz = cfg.c_hidden_tri_mul, cfg.c_hidden_opm, cfg.c_z
    w = stores_attention_weights(cfg)
    out = {
        # LN(m), LN(z) in/out for the bias, attention over rows of the MSA          Alg. 7
        "msa_row_attention": M * c_m + 2 * P * cz + _attention(S, L, c_m, hc_m, hm, w),
        "msa_transition": M * c_m * (2 + n),                                        # Alg. 9
        # LN(m), a, b [S, L, c] and the outer product [L, L, c*c]                    Alg. 10
        "outer_product_mean": 2 * M * c_m + 2 * M * o + P * o * o,
        # LN input, the four projections (gated operands rebuilt in backward), the product
        # (LN input), sigmoid gate and gated output                                  Alg. 11/12
        "triangle_multiplication": 2 * P * (3 * cz + 5 * t),
        # LN in/out (bias from the LN output) + attention along rows                Alg. 13/14
        "triangle_attention": 2 * (P * cz + _attention(L, L, cz, hc_p, hp, w)),
        "pair_transition": P * cz * (2 + n),                                       # Alg. 15
    }
    if global_column:   # Alg. 19: LN, k, v, gate, gated output, probabilities [L, H, S]
        c = c_hidden_msa
        out["msa_column_attention"] = M * (2 * c_m + 2 * c + hm + 2 * hm * c)
    else:               # Alg. 8: LN of the transposed MSA + attention over columns
        out["msa_column_attention"] = M * c_m + _attention(L, S, c_m, hc_m, hm, w)
    return out


def activation_elements(cfg: ModelConfig, shape: Shape, recompute: bool) -> dict[str, int]:
    """Saved-for-backward elements of one training forward pass (the last recycling iteration;
    earlier ones run without gradients) by component, plus 'transient' (working set on top)."""
    L, S, Se = shape.L, shape.S, (shape.S_extra if cfg.extra_msa else 0)
    P, M, cz, cm = L * L, S * L, cfg.c_z, cfg.c_m
    out: dict[str, int] = {}
    # Alg. 3-4, 32: one-hot relpos and recycling-distance inputs, LN(z_prev), MSA features.
    out["embedders"] = (P * (2 * cfg.relpos_k + 1) + P * cfg.recycle_bins + 2 * P * cz
                        + (S + Se) * L * MSA_FEAT_DIM + 2 * L * cm)
    blocks = []
    if Se and cfg.n_extra_blocks:
        blocks.append(("extra_msa_stack", cfg.n_extra_blocks, Se, cfg.c_e, cfg.c_hidden_extra_att, True))
    blocks.append(("evoformer", cfg.n_blocks, S, cm, cfg.c_hidden_msa_att, False))
    recomputed = 0
    for name, n_blocks, rows, c_m, c_h, global_column in blocks:
        block = sum(evoformer_block_elements(cfg, L, rows, c_m, c_h, global_column).values())
        if recompute:   # each block keeps only its inputs m, z; one is rebuilt in backward
            out[name] = n_blocks * (rows * L * c_m + P * cz)
            recomputed = max(recomputed, block if n_blocks else 0)
        else:
            out[name] = n_blocks * block
    # Alg. 20-22: LN(z) in/out once; per layer the attention probabilities, squared point
    # distances [H, L, L] and the pair readout's own copy of the [L, L, c_z] operand.
    out["structure_module"] = 2 * P * cz + cfg.sm_layers * P * (2 * cfg.ipa_heads + cz)
    # Distogram log-softmax [L, L, bins] (+ int64 targets), masked-MSA logits input and
    # log-softmax [S, L, c_m + 23], backbone FAPE: ~15 [L, L] terms per layer (local points,
    # differences, distances); the final all-atom FAPE: ~12 terms over 8 frames x 14 atoms of
    # every residue pair (local points [.., 3] x 3, distances, clamp, masks).
    out["heads_losses"] = (P * (cfg.distogram_bins + 2) + M * (cm + 23)
                           + 15 * P * cfg.sm_layers + 12 * P * ALL_ATOM_FAPE_PAIRS)
    if recompute:
        out["recomputed_block"] = recomputed
    # Working set on top of what is saved: the largest attention weights being formed / their
    # gradient (backends that keep no weights form them a chunk of RECOMPUTE_ELEMENTS at a
    # time) and two pair-stream gradients.
    largest_probs = max(cfg.pair_heads * L ** 3, cfg.msa_heads * S * P, cfg.msa_heads * L * S * S,
                        cfg.ipa_heads * P)
    if not stores_attention_weights(cfg):
        largest_probs = min(largest_probs, RECOMPUTE_ELEMENTS)
    out["transient"] = largest_probs + 2 * P * cz
    return out


def peak_elements(elems: dict[str, float], grads: float = 0) -> float:
    """Peak live elements (or bytes) of forward+backward, parameter gradients `grads` included.

    Without recompute everything saved is alive when backward starts; parameter gradients are
    allocated block by block while larger saved activations are freed, so they do not add to
    that peak. With recompute the trunk's backward begins after the heads/structure-module/loss
    tensors were freed; the peak is the larger of the end of forward and the recomputation of a
    block late in backward, when nearly all parameter gradients exist. Block inputs and
    embedder tensors live throughout."""
    if "recomputed_block" not in elems:
        return max(sum(elems.values()), grads + elems["transient"])
    base = sum(v for k, v in elems.items() if k in ("embedders", "extra_msa_stack", "evoformer"))
    tail = elems["structure_module"] + elems["heads_losses"]
    return base + max(tail, elems["recomputed_block"] + grads) + elems["transient"]


def activation_bytes(cfg: ModelConfig, shape: Shape, recompute: bool) -> dict:
    """Activation bytes (fp32) by component and 'peak' (see `peak_elements`).

    No discount for bf16: protdp's bf16 path is autocast, which keeps layer-norm outputs,
    softmax probabilities and the residual streams in fp32 and saves bf16 copies of matmul
    inputs next to them; measured on CPU it saves under 10 % (benchmarks/results/
    plan_validation.json), so counting fp32 activations is the validated, conservative choice.
    """
    elems = activation_elements(cfg, shape, recompute)
    out = {k: 4 * v for k, v in elems.items()}
    out["peak"] = peak_elements(out)
    return out


def train_step_bytes(cfg: ModelConfig, shape: Shape, recompute: bool) -> dict:
    """Peak bytes one forward+backward adds on top of the weights: activations and parameter
    gradients on their timeline (`peak_elements`); the planner's check compares this with the
    measured CPU peak."""
    act = activation_bytes(cfg, shape, recompute)
    grads = 4 * parameter_count(cfg)
    parts = {k: v for k, v in act.items() if k != "peak"}
    return {"activations": act["peak"], "grads": grads, "total": peak_elements(parts, grads),
            "by_component": parts}
