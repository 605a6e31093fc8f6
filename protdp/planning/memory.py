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
them, each in the dtype it is kept in (`Saved`; fp32, or the trunk under bf16 autocast:
`activation_bytes`). A block's count equals the bytes autograd holds for it, in fp32 and in
bf16 (tests/test_plan.py counts them with saved-tensor hooks). The dominant terms of an Evoformer block are the pair activations O(L^2 c_z) and the MSA
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
from protdp.planning.params import MSA_FEAT_DIM, parameter_breakdown, parameter_count

GIB = 1024 ** 3
ALL_ATOM_FAPE_PAIRS = NUM_RIGID_GROUPS * NUM_ATOM14     # (frame, atom) pairs per residue pair
FAPE_TERMS = 8   # fp32 elements FAPE keeps per (frame, point) pair: x - t, local diff [3] each, dist, clamp


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


@dataclass(frozen=True)
class Saved:
    """Elements saved for backward by one component, by the dtype they are kept in:

    - `fp32`: fp32 whatever the compute dtype: the residual streams m, z (LayerNorm inputs),
      LayerNorm statistics, softmax statistics / weights, the structure module and the losses;
    - `compute`: in the compute dtype: projections, gates, attention q/k/v/outputs, transition
      hidden layers, GEMM inputs (bf16 under autocast);
    - `cast`: bf16 copies that exist only under autocast (an fp32 value cast for a bf16 op:
      the weights a Linear casts and autograd keeps, the softmax weights cast for the PV GEMM);
    - `bytes1`: bool key masks (one byte each)."""
    fp32: int = 0
    compute: int = 0
    cast: int = 0
    bytes1: int = 0

    def __add__(self, other: "Saved") -> "Saved":
        return Saved(self.fp32 + other.fp32, self.compute + other.compute,
                     self.cast + other.cast, self.bytes1 + other.bytes1)

    def __mul__(self, k: int) -> "Saved":
        return Saved(k * self.fp32, k * self.compute, k * self.cast, k * self.bytes1)

    __rmul__ = __mul__

    def elements(self) -> int:
        """fp32-equivalent elements without autocast (no casts; masks as a quarter element)."""
        return self.fp32 + self.compute + self.bytes1 // 4

    def bytes(self, bf16: bool) -> int:
        """Bytes in fp32 (`bf16` False: every term 4 bytes, no casts) or under bf16 autocast."""
        if bf16:
            return 4 * self.fp32 + 2 * (self.compute + self.cast) + self.bytes1
        return 4 * (self.fp32 + self.compute) + self.bytes1


def stores_attention_weights(cfg: ModelConfig) -> bool:
    """Whether training keeps the softmax weights [R, H, Q, Q] for backward: only the
    "explicit" backend does; "auto" (CUDA memory-efficient SDPA, CPU "recompute"), "sdpa" and
    "recompute" keep q, k, v and a per-row logsumexp (protdp.model.attention)."""
    return cfg.attention_backend == "explicit"


def _layer_norm(rows: int, c: int) -> Saved:
    """LayerNorm of x [rows, c] (fused with its projections or not): x and mean/rstd [rows],
    fp32 under autocast; the normalised output is not kept (recomputed or not needed)."""
    return Saved(fp32=rows * c + 2 * rows)


def _attention(R: int, Q: int, hc: int, heads: int, weights: bool, bias: bool,
               c_out: int) -> Saved:
    """Gated attention over R rows of Q positions (Alg. 7/8/13/14 after their LayerNorm and
    fused projections): q, k, v, output, sigmoid gate and gated output (6 R Q hc, compute
    dtype); the softmax weights [R, H, Q, Q] in fp32 plus their bf16 cast for the PV GEMM
    ("explicit", `weights`) or else the per-row logsumexp [R, H, Q] and the shared bias
    [H, Q, Q] (compute dtype); the key mask (bool, or the additive [R, Q] mask of unbiased
    SDPA in the compute dtype); the output Linear's weight cast to bf16 under autocast."""
    out = Saved(compute=6 * R * Q * hc, cast=hc * c_out)
    if weights:
        out += Saved(fp32=R * heads * Q * Q, cast=R * heads * Q * Q, bytes1=R * Q)
    else:
        out += Saved(fp32=R * heads * Q)
        out += Saved(compute=heads * Q * Q, bytes1=R * Q) if bias else Saved(compute=R * Q)
    return out


def evoformer_block_saved(cfg: ModelConfig, L: int, S: int, c_m: int, c_hidden_msa: int,
                          global_column: bool = False) -> dict[str, Saved]:
    """Saved-for-backward elements of one block (Alg. 6 / 18), by sub-module, as protdp's
    training path keeps them (LayerNorm -> projections fused, `_LayerNormLinear`; gated
    triangle operands and outer products recomputed in backward)."""
    M, P, n = S * L, L * L, cfg.transition_n
    hm, hc_m = cfg.msa_heads, cfg.msa_heads * c_hidden_msa
    hp, hc_p = cfg.pair_heads, cfg.pair_heads * cfg.c_hidden_tri_att
    t, o, cz = cfg.c_hidden_tri_mul, cfg.c_hidden_opm, cfg.c_z
    w = stores_attention_weights(cfg)
    msa_dropout, pair_dropout = Saved(compute=L * c_m), Saved(compute=L * cz)   # shared masks
    out = {
        # Alg. 7: LN(m), LN(z) -> pair bias, attention over the S rows; row dropout mask
        "msa_row_attention": _layer_norm(M, c_m) + _layer_norm(P, cz)
        + _attention(S, L, hc_m, hm, w, True, c_m) + msa_dropout,
        # Alg. 9: LN input and the ReLU output [M, n c_m] (the second Linear's input)
        "msa_transition": _layer_norm(M, c_m) + Saved(compute=M * n * c_m, cast=n * c_m * c_m),
        # Alg. 10: LN input, masked a, b [S, L, c] (outer products recomputed in backward), the
        # divisor [L, L] (compute dtype: its einsum runs under autocast) and the bf16 mask cast
        "outer_product_mean": _layer_norm(M, c_m) + Saved(compute=2 * M * o + P, cast=M),
        # Alg. 11/12: LN input, the four projections [L, L, t] (gated operands rebuilt), the
        # product (output LN input, + its statistics), sigmoid gate and projected output
        "triangle_multiplication": 2 * (_layer_norm(P, cz) + Saved(fp32=2 * P)
                                        + Saved(compute=5 * P * t + 2 * P * cz) + pair_dropout),
        # Alg. 13/14: LN input, attention along the L rows (bias from the fused projection)
        "triangle_attention": 2 * (_layer_norm(P, cz) + _attention(L, L, hc_p, hp, w, True, cz)
                                   + pair_dropout),
        # Alg. 15
        "pair_transition": _layer_norm(P, cz) + Saved(compute=P * n * cz, cast=n * cz * cz),
    }
    if global_column:
        # Alg. 19: LN input (+ statistics twice: the fused k, v, g projection and the query
        # average recompute LayerNorm(e)), k, v [M, c], sigmoid gate and gated output
        # [M, H c], probabilities [L, H, S] (fp32 + bf16 cast), the key mask; per column the
        # average query (linear_q's input) [L, c_m], its divisor [L], q and o [L, H c]; the
        # query / output weights' casts
        c = c_hidden_msa
        out["msa_column_attention"] = (_layer_norm(M, c_m) + Saved(fp32=2 * M + M * hm + L)
                                       + Saved(compute=2 * M * c + 2 * M * hm * c
                                               + L * c_m + 2 * L * hm * c,
                                               cast=M * hm + 2 * c_m * hm * c, bytes1=M))
    else:               # Alg. 8: LN of the transposed MSA + unbiased attention over columns
        out["msa_column_attention"] = _layer_norm(M, c_m) + _attention(L, S, hc_m, hm, w, False, c_m)
    return out


def evoformer_block_elements(cfg: ModelConfig, L: int, S: int, c_m: int, c_hidden_msa: int,
                             global_column: bool = False) -> dict[str, int]:
    """Saved-for-backward elements of one block without autocast (`evoformer_block_saved`)."""
    return {k: v.elements() for k, v in
            evoformer_block_saved(cfg, L, S, c_m, c_hidden_msa, global_column).items()}


def _trunk_linear_params(cfg: ModelConfig) -> int:
    """Parameters of the embedders (their Linears run under autocast, whose bf16 weight casts
    autograd keeps; an upper bound: their LayerNorm parameters are counted too). The blocks'
    casts are counted in `evoformer_block_saved`."""
    parts = parameter_breakdown(cfg)
    return sum(v for k, v in parts.items() if k.endswith("_embedder"))


def activation_saved(cfg: ModelConfig, shape: Shape, recompute: bool) -> dict[str, Saved]:
    """Saved-for-backward elements of one training forward pass (the last recycling iteration;
    earlier ones run without gradients) by component, plus 'transient' (working set on top)."""
    L, S, Se = shape.L, shape.S, (shape.S_extra if cfg.extra_msa else 0)
    P, M, cz, cm = L * L, S * L, cfg.c_z, cfg.c_m
    out: dict[str, Saved] = {}
    # Alg. 3-5, 32: one-hot relpos, recycling-distance one-hot and MSA features (inputs of
    # Linears: compute dtype), LN(z_prev), LN(m0_prev) inputs and statistics (fp32), the
    # embedders' weight casts.
    out["embedders"] = (Saved(compute=P * (2 * cfg.relpos_k + 1) + P * cfg.recycle_bins
                              + (S + Se) * L * MSA_FEAT_DIM, cast=_trunk_linear_params(cfg))
                        + _layer_norm(P, cz) + _layer_norm(L, cm))
    blocks = []
    if Se and cfg.n_extra_blocks:
        blocks.append(("extra_msa_stack", cfg.n_extra_blocks, Se, cfg.c_e, cfg.c_hidden_extra_att, True))
    blocks.append(("evoformer", cfg.n_blocks, S, cm, cfg.c_hidden_msa_att, False))
    recomputed = Saved()
    for name, n_blocks, rows, c_m, c_h, global_column in blocks:
        block = sum(evoformer_block_saved(cfg, L, rows, c_m, c_h, global_column).values(), Saved())
        if recompute:   # each block keeps only its inputs m, z (fp32 streams); one is rebuilt
            out[name] = n_blocks * Saved(fp32=rows * L * c_m + P * cz)
            if n_blocks and block.elements() > recomputed.elements():
                recomputed = block
        else:
            out[name] = n_blocks * block
    # Alg. 20-22 (fp32, outside autocast): LN(z) in/out once; per layer the attention
    # probabilities, squared point distances [H, L, L] and the pair readout's own copy of the
    # [L, L, c_z] operand.
    out["structure_module"] = Saved(fp32=2 * P * cz + cfg.sm_layers * P * (2 * cfg.ipa_heads + cz))
    # Losses (fp32, §1.9): distogram log-softmax and its input [L, L, bins] (+ int64 targets),
    # masked-MSA log-softmax and its input [S, L, 23], and FAPE (Alg. 28) keeping 8 terms per
    # (frame, point) pair: the point offsets x - t and local differences [.., 3], the
    # distance and the clamp's input; per structure-module layer over L x L backbone pairs, and
    # once over the 8 frames x 14 atoms of every residue pair (all-atom FAPE of the last layer).
    out["heads_losses"] = Saved(fp32=P * (2 * cfg.distogram_bins + 2) + M * (cm + 2 * 23)
                                + FAPE_TERMS * P * (cfg.sm_layers + ALL_ATOM_FAPE_PAIRS))
    if recompute:
        out["recomputed_block"] = recomputed
    # Working sets on top of what is saved. Trunk backward: the largest attention weights being
    # formed / their gradient, fp32 in every backend (backends that keep no weights form them a
    # chunk of RECOMPUTE_ELEMENTS at a time), and two gradients of the fp32 pair stream. Start
    # of backward (everything saved still alive): the all-atom FAPE's gradients of its 8 saved
    # terms per (frame, point) pair.
    largest_probs = max(cfg.pair_heads * L ** 3, cfg.msa_heads * S * P, cfg.msa_heads * L * S * S,
                        cfg.ipa_heads * P)
    if not stores_attention_weights(cfg):
        largest_probs = min(largest_probs, RECOMPUTE_ELEMENTS)
    out["transient"] = Saved(fp32=largest_probs + 2 * P * cz)
    out["loss_transient"] = Saved(fp32=FAPE_TERMS * P * ALL_ATOM_FAPE_PAIRS)
    return out


def activation_elements(cfg: ModelConfig, shape: Shape, recompute: bool) -> dict[str, int]:
    """`activation_saved` as fp32 elements (no autocast)."""
    return {k: v.elements() for k, v in activation_saved(cfg, shape, recompute).items()}


def peak_elements(elems: dict[str, float], grads: float = 0) -> float:
    """Peak live elements (or bytes) of forward+backward, parameter gradients `grads` included.

    Without recompute everything saved is alive when backward starts (with the loss's working
    set, 'loss_transient', or later the trunk's, 'transient'); parameter gradients are
    allocated block by block while larger saved activations are freed, so they do not add to
    that peak. With recompute the trunk's backward begins after the heads/structure-module/loss
    tensors were freed; the peak is the larger of the start of backward and the recomputation
    of a block late in backward, when nearly all parameter gradients exist. Block inputs and
    embedder tensors live throughout."""
    trunk_ws, loss_ws = elems["transient"], elems.get("loss_transient", 0)
    if "recomputed_block" not in elems:
        saved = sum(v for k, v in elems.items() if k not in ("transient", "loss_transient"))
        return max(saved + max(trunk_ws, loss_ws), grads + trunk_ws)
    base = sum(v for k, v in elems.items() if k in ("embedders", "extra_msa_stack", "evoformer"))
    tail = elems["structure_module"] + elems["heads_losses"]
    return base + max(tail + loss_ws, elems["recomputed_block"] + grads + trunk_ws)


def activation_bytes(cfg: ModelConfig, shape: Shape, recompute: bool,
                     bf16: bool | None = None) -> dict:
    """Activation bytes by component and 'peak' (see `peak_elements`); `bf16` (default:
    ``cfg.bf16``) is the trunk under bf16 autocast (`protdp.model.precision`).

    bf16 is derived from what autocast keeps in protdp's implementation, per term of
    `evoformer_block_saved` (`Saved`): autocast runs GEMMs in bf16 but LayerNorm, softmax and
    every op it does not list in the dtype of its inputs, and a residual update x + f(x) of an
    fp32 x stays fp32. So the residual streams m, z (Alg. 6 lines 2-10: the LayerNorm inputs
    every sub-block keeps, and the block inputs recompute keeps), LayerNorm and softmax
    statistics, the explicit backend's softmax weights, the structure module (Alg. 20-22) and
    the losses stay 4 bytes; projections, gates, q/k/v/outputs, transition hidden layers and
    the outer product's operands are 2 bytes; bf16 copies that exist only under autocast (the
    weights each Linear casts, the softmax weights cast for the PV GEMM) come on top. No
    element is saved twice: the fused LayerNorm -> projection functions keep the fp32 input and
    recompute the normalised value, so no bf16 copy of a LayerNorm output is kept next to it.
    """
    bf16 = cfg.bf16 if bf16 is None else bf16
    out = {k: v.bytes(bf16) for k, v in activation_saved(cfg, shape, recompute).items()}
    out["peak"] = peak_elements(out)
    return out


def train_step_bytes(cfg: ModelConfig, shape: Shape, recompute: bool,
                     bf16: bool | None = None) -> dict:
    """Peak bytes one forward+backward adds on top of the weights: activations and parameter
    gradients (fp32 parameters: 4 bytes, also under autocast) on their timeline
    (`peak_elements`); the planner's check compares this with the measured CPU peak."""
    act = activation_bytes(cfg, shape, recompute, bf16)
    grads = 4 * parameter_count(cfg)
    parts = {k: v for k, v in act.items() if k != "peak"}
    return {"activations": act["peak"], "grads": grads, "total": peak_elements(parts, grads),
            "by_component": parts}
