"""AlphaFold2 parameter files (`params_model_N[_ptm].npz`, DeepMind's flat haiku naming
`'<module path>//<param>'`) <-> protdp state dicts.

`alphafold_entries(cfg)` lists every protdp parameter with the AF2 key it comes from and how the
array is laid out there, so import and export are the same table read in two directions:

- "T": a torch Linear weight [out, in] is AF2's [in, ...out dims] (or [...in dims, out]) array
  reshaped to [in, out] and transposed (attention q/k/v/gate weights [C, H, c], output weights
  [H, c, C], the outer-product-mean output [c, c, C_z]);
- "id": a vector or tensor reshaped only (biases, LayerNorm scale/offset, gate biases [H, c]).

Evoformer and extra-MSA blocks are stacked in AF2 (`layer_stack`: a leading block axis), one
protdp module each. The IPA point projections share AF2's (xyz, head, point) layout, the
incoming triangle update reads AF2's equation 'kjc,kic->ijc' (protdp's a = AF2's right
projection). Template modules (`template_embedding`: Alg. 16 pair stack stacked like the
Evoformer under `__layer_stack_no_state`, Alg. 17 pointwise attention without gating; the
torsion rows `template_single_embedding` / `template_projection`) map onto
`protdp.model.template`; a parameter set without them gives a template-free config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from protdp.errors import InputError
from protdp.model.config import ModelConfig
from protdp.model.weight_checks import value_problem

PREFIX = "alphafold/alphafold_iteration/"
EVO = PREFIX + "evoformer/"
FOLD = PREFIX + "structure_module/fold_iteration/"
TEMPLATE_MARKERS = ("template_embedding", "template_single_embedding", "template_projection")
TEMPLATES_USED = ("template modules imported: template pair stack, pointwise attention and "
                  "torsion rows (AF2 Alg. 16-17, §1.7.1)")
TEMPLATES_ABSENT = ("no template parameters: template-free, as AlphaFold's models 3-5 (template "
                    "rows absent)")


@dataclass(frozen=True)
class Entry:
    """One protdp parameter and its AF2 source: `af2_shape` is one block's shape."""

    af2: str
    torch: str
    kind: str                 # "T" (reshape to [in, out], transpose) | "id" (reshape only)
    af2_shape: tuple
    torch_shape: tuple
    block: int | None = None  # index into AF2's stacked leading axis


def to_torch(entry: Entry, array: np.ndarray) -> np.ndarray:
    """One block's AF2 array -> the protdp tensor layout."""
    if entry.kind == "T":
        return np.ascontiguousarray(array.reshape(entry.torch_shape[::-1]).T)
    return array.reshape(entry.torch_shape)


def to_af2(entry: Entry, tensor: np.ndarray) -> np.ndarray:
    """The protdp tensor -> one block's AF2 array."""
    if entry.kind == "T":
        return np.ascontiguousarray(tensor.T).reshape(entry.af2_shape)
    return np.ascontiguousarray(tensor).reshape(entry.af2_shape)


class _Builder:
    """Collects entries; shapes come from the protdp state dict and the head counts."""

    def __init__(self, shapes: Mapping[str, tuple]):
        self.shapes, self.entries = shapes, []

    def add(self, af2, torch_key, kind, af2_shape=None, block=None):
        tshape = tuple(self.shapes[torch_key])
        if af2_shape is None:
            af2_shape = tshape[::-1] if kind == "T" else tshape
        self.entries.append(Entry(af2, torch_key, kind, tuple(af2_shape), tshape, block))

    def linear(self, af2, mod, block=None, bias=True):
        self.add(af2 + "//weights", mod + ".weight", "T", block=block)
        if bias:
            self.add(af2 + "//bias", mod + ".bias", "id", block=block)

    def layer_norm(self, af2, mod, block=None):
        self.add(af2 + "//scale", mod + ".weight", "id", block=block)
        self.add(af2 + "//offset", mod + ".bias", "id", block=block)

    def attention(self, af2, mod, heads, block=None, global_kv=False):
        """AF2 `Attention` / `GlobalAttention` (gated) on protdp's linear_q/k/v/g/o."""
        hc, in_c = self.shapes[mod + ".linear_q.weight"]
        out_c = self.shapes[mod + ".linear_o.weight"][0]
        head_shape = (heads, hc // heads)
        self.add(af2 + "//query_w", mod + ".linear_q.weight", "T", (in_c,) + head_shape, block)
        for name, lin in (("key_w", "linear_k"), ("value_w", "linear_v")):
            if global_kv:   # one shared key/value head [C, c]
                self.add(f"{af2}//{name}", f"{mod}.{lin}.weight", "T", block=block)
            else:
                self.add(f"{af2}//{name}", f"{mod}.{lin}.weight", "T", (in_c,) + head_shape, block)
        self.add(af2 + "//gating_w", mod + ".linear_g.weight", "T", (in_c,) + head_shape, block)
        self.add(af2 + "//gating_b", mod + ".linear_g.bias", "id", head_shape, block)
        self.add(af2 + "//output_w", mod + ".linear_o.weight", "T", head_shape + (out_c,), block)
        self.add(af2 + "//output_b", mod + ".linear_o.bias", "id", block=block)


def _transition(b: _Builder, af2, mod, block):
    b.layer_norm(af2 + "/input_layer_norm", mod + ".norm", block)
    b.linear(af2 + "/transition1", mod + ".linear_1", block)
    b.linear(af2 + "/transition2", mod + ".linear_2", block)


def _tri_mul(b: _Builder, af2, mod, block, outgoing):
    b.layer_norm(af2 + "/layer_norm_input", mod + ".norm_in", block)
    left, right = ("a", "b") if outgoing else ("b", "a")     # AF2 incoming: 'kjc,kic->ijc'
    b.linear(af2 + "/left_projection", f"{mod}.linear_{left}_p", block)
    b.linear(af2 + "/right_projection", f"{mod}.linear_{right}_p", block)
    b.linear(af2 + "/left_gate", f"{mod}.linear_{left}_g", block)
    b.linear(af2 + "/right_gate", f"{mod}.linear_{right}_g", block)
    b.layer_norm(af2 + "/center_layer_norm", mod + ".norm_out", block)
    b.linear(af2 + "/output_projection", mod + ".linear_z", block)
    b.linear(af2 + "/gating_linear", mod + ".linear_g", block)


def _evoformer_block(b: _Builder, af2, mod, block, cfg: ModelConfig, extra: bool):
    """Algorithm 6 (Alg. 18 with global column attention for the extra-MSA stack)."""
    row = af2 + "/msa_row_attention_with_pair_bias"
    b.layer_norm(row + "/query_norm", mod + ".msa_row.norm_m", block)
    b.layer_norm(row + "/feat_2d_norm", mod + ".msa_row.norm_z", block)
    b.add(row + "//feat_2d_weights", mod + ".msa_row.linear_b.weight", "T", block=block)
    b.attention(row + "/attention", mod + ".msa_row.attention", cfg.msa_heads, block)
    if extra:
        col = af2 + "/msa_column_global_attention"
        b.layer_norm(col + "/query_norm", mod + ".msa_col.norm", block)
        b.attention(col + "/attention", mod + ".msa_col", cfg.msa_heads, block, global_kv=True)
    else:
        col = af2 + "/msa_column_attention"
        b.layer_norm(col + "/query_norm", mod + ".msa_col.norm", block)
        b.attention(col + "/attention", mod + ".msa_col.attention", cfg.msa_heads, block)
    _transition(b, af2 + "/msa_transition", mod + ".msa_transition", block)
    opm = af2 + "/outer_product_mean"
    b.layer_norm(opm + "/layer_norm_input", mod + ".opm.norm", block)
    b.linear(opm + "/left_projection", mod + ".opm.linear_a", block)
    b.linear(opm + "/right_projection", mod + ".opm.linear_b", block)
    c = cfg.c_hidden_opm
    b.add(opm + "//output_w", mod + ".opm.linear_out.weight", "T", (c, c, cfg.c_z), block)
    b.add(opm + "//output_b", mod + ".opm.linear_out.bias", "id", block=block)
    _tri_mul(b, af2 + "/triangle_multiplication_outgoing", mod + ".tri_mul_out", block, True)
    _tri_mul(b, af2 + "/triangle_multiplication_incoming", mod + ".tri_mul_in", block, False)
    for name, sub in (("starting", "tri_att_start"), ("ending", "tri_att_end")):
        att = f"{af2}/triangle_attention_{name}_node"
        b.layer_norm(att + "/query_norm", f"{mod}.{sub}.norm", block)
        b.add(att + "//feat_2d_weights", f"{mod}.{sub}.linear_b.weight", "T", block=block)
        b.attention(att + "/attention", f"{mod}.{sub}.attention", cfg.pair_heads, block)
    _transition(b, af2 + "/pair_transition", mod + ".pair_transition", block)


TEMPLATE = EVO + "template_embedding/"
TEMPLATE_STACK = TEMPLATE + "single_template_embedding/template_pair_stack/__layer_stack_no_state/"


def _templates(b: _Builder, cfg: ModelConfig):
    """Alg. 2 lines 7-13: template pair embedding, Alg. 16 stack, Alg. 17, torsion rows."""
    mod = "template_embedder"
    b.linear(TEMPLATE + "single_template_embedding/embedding2d", mod + ".embedding2d")
    b.layer_norm(TEMPLATE + "single_template_embedding/output_layer_norm", mod + ".norm")
    for i in range(cfg.template_pair_blocks):
        blk = f"{mod}.blocks.{i}"
        for name, sub in (("starting", "tri_att_start"), ("ending", "tri_att_end")):
            att = f"{TEMPLATE_STACK}triangle_attention_{name}_node"
            b.layer_norm(att + "/query_norm", f"{blk}.{sub}.norm", i)
            b.add(att + "//feat_2d_weights", f"{blk}.{sub}.linear_b.weight", "T", block=i)
            b.attention(att + "/attention", f"{blk}.{sub}.attention", cfg.template_tri_heads, i)
        _tri_mul(b, TEMPLATE_STACK + "triangle_multiplication_outgoing", blk + ".tri_mul_out", i, True)
        _tri_mul(b, TEMPLATE_STACK + "triangle_multiplication_incoming", blk + ".tri_mul_in", i, False)
        _transition(b, TEMPLATE_STACK + "pair_transition", blk + ".pair_transition", i)
    att, pw = TEMPLATE + "attention/", mod + ".pointwise"
    heads = (cfg.template_att_heads, cfg.c_hidden_template_att)
    for af2_name, lin, c_in in (("query_w", "linear_q", cfg.c_z), ("key_w", "linear_k", cfg.c_t),
                                ("value_w", "linear_v", cfg.c_t)):
        b.add(att + "/" + af2_name, f"{pw}.{lin}.weight", "T", (c_in,) + heads)
    b.add(att + "/output_w", pw + ".linear_o.weight", "T", heads + (cfg.c_z,))
    b.add(att + "/output_b", pw + ".linear_o.bias", "id")
    if cfg.template_torsion_angles:
        b.linear(EVO + "template_single_embedding", mod + ".linear_single")
        b.linear(EVO + "template_projection", mod + ".linear_projection")


def _structure_module(b: _Builder, cfg: ModelConfig):
    sm = PREFIX + "structure_module/"
    b.layer_norm(sm + "single_layer_norm", "structure_module.norm_s")
    b.layer_norm(sm + "pair_layer_norm", "structure_module.norm_z")
    b.linear(sm + "initial_projection", "structure_module.linear_in")
    ipa = FOLD + "invariant_point_attention"
    for af2_name, mod in (("q_scalar", "linear_q"), ("kv_scalar", "linear_kv"),
                          ("q_point_local", "linear_q_pts"), ("kv_point_local", "linear_kv_pts"),
                          ("attention_2d", "linear_b"), ("output_projection", "linear_out")):
        b.linear(f"{ipa}/{af2_name}", f"structure_module.ipa.{mod}")
    b.add(ipa + "//trainable_point_weights", "structure_module.ipa.head_weights", "id")
    b.layer_norm(FOLD + "attention_layer_norm", "structure_module.norm_ipa")
    for k in range(cfg.sm_transition_layers):
        b.linear(FOLD + ("transition" if k == 0 else f"transition_{k}"),
                 f"structure_module.transition.layers.{k}")
    b.layer_norm(FOLD + "transition_layer_norm", "structure_module.transition.norm")
    b.linear(FOLD + "affine_update", "structure_module.backbone_update.linear")
    sc, mod = FOLD + "rigid_sidechain/", "structure_module.angle_resnet"
    b.linear(sc + "input_projection", mod + ".linear_in")
    b.linear(sc + "input_projection_1", mod + ".linear_initial")
    for k in range(cfg.n_resnet_blocks):
        suffix = "" if k == 0 else f"_{k}"
        b.linear(f"{sc}resblock1{suffix}", f"{mod}.blocks.{k}.0")
        b.linear(f"{sc}resblock2{suffix}", f"{mod}.blocks.{k}.1")
    b.linear(sc + "unnormalized_angles", mod + ".linear_out")


def alphafold_entries(cfg: ModelConfig, shapes: Mapping[str, tuple]) -> list[Entry]:
    """Every parameter of a protdp model (config `cfg`, state-dict `shapes`) with its AF2 key."""
    b = _Builder(shapes)
    for af2, mod in (("left_single", "input_embedder.linear_tf_z_i"),
                     ("right_single", "input_embedder.linear_tf_z_j"),
                     ("preprocess_1d", "input_embedder.linear_tf_m"),
                     ("preprocess_msa", "input_embedder.linear_msa_m"),
                     ("pair_activiations", "input_embedder.linear_relpos"),
                     ("prev_pos_linear", "recycling_embedder.linear_d"),
                     ("single_activations", "evoformer.linear_s")):
        b.linear(EVO + af2, mod)
    b.layer_norm(EVO + "prev_msa_first_row_norm", "recycling_embedder.norm_m")
    b.layer_norm(EVO + "prev_pair_norm", "recycling_embedder.norm_z")
    if cfg.extra_msa:
        b.linear(EVO + "extra_msa_activations", "extra_msa_embedder")
        for i in range(cfg.n_extra_blocks):
            _evoformer_block(b, EVO + "extra_msa_stack", f"extra_msa_stack.blocks.{i}", i, cfg, True)
    if cfg.templates:
        _templates(b, cfg)
    for i in range(cfg.n_blocks):
        _evoformer_block(b, EVO + "evoformer_iteration", f"evoformer.blocks.{i}", i, cfg, False)
    _structure_module(b, cfg)
    _heads(b, cfg.pae_head)
    return b.entries


def _heads(b: _Builder, pae_head: bool) -> None:
    """The output heads (AF2 supplement 1.9): distogram, masked MSA, experimentally resolved,
    pLDDT and, where the model has one, PAE (AF-Multimer always has)."""
    heads = [("distogram_head/half_logits", "distogram_head.linear"),
             ("masked_msa_head/logits", "masked_msa_head.linear"),
             ("experimentally_resolved_head/logits", "experimentally_resolved_head.linear"),
             ("predicted_lddt_head/act_0", "plddt_head.linear_1"),
             ("predicted_lddt_head/act_1", "plddt_head.linear_2"),
             ("predicted_lddt_head/logits", "plddt_head.linear_3")]
    if pae_head:
        heads.append(("predicted_aligned_error_head/logits", "pae_head.linear"))
    for af2, mod in heads:
        b.linear(PREFIX + af2, mod)
    b.layer_norm(PREFIX + "predicted_lddt_head/input_layer_norm", "plddt_head.norm")


# ------------------------------------------------------------------ configuration from shapes
def _shape(shapes: Mapping[str, tuple], key: str) -> tuple:
    if key not in shapes:
        raise InputError("AlphaFold parameter is missing", field=key)
    return tuple(shapes[key])


def _count(shapes: Mapping, prefix: str) -> int:
    """Number of haiku modules named prefix, prefix_1, prefix_2, ... (AF2's repeated names)."""
    n = 0
    while f"{prefix}{'' if n == 0 else f'_{n}'}//weights" in shapes:
        n += 1
    return n


def _ratio(num: int, den: int, what: str, key: str) -> int:
    if den <= 0 or num % den:
        raise InputError(f"{what}: {num} is not a multiple of {den}", field=key)
    return num // den


MULTIMER_MARK = "~_relative_encoding/position_activations//weights"   # multimer-only array


def infer_config(shapes: Mapping[str, tuple], *, sm_layers: int = 8,
                 num_recycles: int = 3) -> ModelConfig:
    """The ModelConfig of an AF2 parameter set from its array shapes {key: shape} alone (any
    size). The structure-module depth and the recycles are not in the arrays: AF2's values are
    the defaults (8 layers, 3 recycles)."""
    if not any(k.startswith(PREFIX) for k in shapes):
        raise InputError(f"not an AlphaFold parameter set: no '{PREFIX}...' arrays")
    if EVO + MULTIMER_MARK in shapes:
        raise InputError("AlphaFold-Multimer parameters (they have "
                         f"'{EVO + MULTIMER_MARK}'): they build the multimer model "
                         "(protdp.weights.alphafold_multimer; `protdp weights import` writes a "
                         "multimer checkpoint), not the monomer one")
    s = lambda key: _shape(shapes, key)                                     # noqa: E731
    row = EVO + "evoformer_iteration/msa_row_attention_with_pair_bias/attention//query_w"
    tri = EVO + "evoformer_iteration/triangle_attention_starting_node/attention//query_w"
    n_blocks, c_m, msa_heads, c_hidden_msa = s(row)
    _, c_z, pair_heads, c_hidden_tri = s(tri)
    c_s = s(EVO + "single_activations//weights")[1]
    msa_tr = EVO + "evoformer_iteration/msa_transition/transition1//weights"
    pair_tr = EVO + "evoformer_iteration/pair_transition/transition1//weights"
    transition_n = _ratio(s(msa_tr)[-1], c_m, "MSA transition width", msa_tr)
    if _ratio(s(pair_tr)[-1], c_z, "pair transition width", pair_tr) != transition_n:
        raise InputError("MSA and pair transitions differ in expansion factor; protdp uses one",
                         field=pair_tr)
    ipa = FOLD + "invariant_point_attention/"
    heads = s(FOLD + "invariant_point_attention//trainable_point_weights")[0]
    c_ipa = _ratio(s(ipa + "q_scalar//weights")[1], heads, "IPA q_scalar", ipa + "q_scalar")
    qk_pts = _ratio(s(ipa + "q_point_local//weights")[1], 3 * heads, "IPA q points", ipa + "q_point_local")
    kv = _ratio(s(ipa + "kv_scalar//weights")[1], heads, "IPA kv_scalar", ipa + "kv_scalar")
    kv_pts = _ratio(s(ipa + "kv_point_local//weights")[1], 3 * heads, "IPA kv points",
                    ipa + "kv_point_local")
    sm_channels = s(PREFIX + "structure_module/initial_projection//weights")[1]
    extra = EVO + "extra_msa_stack/msa_row_attention_with_pair_bias/attention//query_w"
    fields = dict(
        c_m=c_m, c_z=c_z, c_s=c_s, n_blocks=n_blocks, msa_heads=msa_heads,
        c_hidden_msa_att=c_hidden_msa, pair_heads=pair_heads, c_hidden_tri_att=c_hidden_tri,
        c_hidden_tri_mul=s(EVO + "evoformer_iteration/triangle_multiplication_outgoing/"
                           "left_projection//weights")[-1],
        c_hidden_opm=s(EVO + "evoformer_iteration/outer_product_mean/left_projection//weights")[-1],
        transition_n=transition_n,
        relpos_k=_ratio(s(EVO + "pair_activiations//weights")[0] - 1, 2, "relpos classes",
                        EVO + "pair_activiations"),
        extra_msa=extra in shapes,
        c_sm=None if sm_channels == c_s else sm_channels,
        sm_layers=sm_layers, ipa_heads=heads, c_ipa=c_ipa, c_ipa_v=kv - c_ipa,
        ipa_qk_points=qk_pts, ipa_v_points=kv_pts - qk_pts,
        sm_transition_layers=_count(shapes, FOLD + "transition"),
        c_resnet=s(FOLD + "rigid_sidechain/input_projection//weights")[1],
        n_resnet_blocks=_count(shapes, FOLD + "rigid_sidechain/resblock1"),
        distogram_bins=s(PREFIX + "distogram_head/half_logits//weights")[1],
        plddt_bins=s(PREFIX + "predicted_lddt_head/logits//weights")[1],
        c_plddt=s(PREFIX + "predicted_lddt_head/act_0//weights")[1],
        pae_head=PREFIX + "predicted_aligned_error_head/logits//weights" in shapes,
        recycle_bins=s(EVO + "prev_pos_linear//weights")[0],
        num_recycles=num_recycles, max_recycles=num_recycles,
    )
    if fields["pae_head"]:
        fields["pae_bins"] = s(PREFIX + "predicted_aligned_error_head/logits//weights")[1]
    if fields["extra_msa"]:
        e_blocks, c_e, e_heads, c_hidden_e = s(extra)
        if e_heads != msa_heads:
            raise InputError(f"extra-MSA attention has {e_heads} heads, the MSA stack {msa_heads}; "
                             "protdp uses one count", field=extra)
        fields.update(c_e=c_e, n_extra_blocks=e_blocks, c_hidden_extra_att=c_hidden_e)
    fields.update(_template_fields(shapes, s))
    try:
        return ModelConfig(**fields)
    except ValueError as exc:
        raise InputError(f"the AlphaFold arrays describe no valid model: {exc}") from None


def _template_fields(shapes: Mapping, s) -> dict:
    """ModelConfig template fields from the template arrays ({} without templates)."""
    emb = TEMPLATE + "single_template_embedding/embedding2d//weights"
    if emb not in shapes:
        return {}
    tri = TEMPLATE_STACK + "triangle_attention_starting_node/attention//query_w"
    n_blocks, c_t, tri_heads, c_tri = s(tri)
    mul = TEMPLATE_STACK + "triangle_multiplication_outgoing/left_projection//weights"
    tr = TEMPLATE_STACK + "pair_transition/transition1//weights"
    _, att_heads, c_att = s(TEMPLATE + "attention//query_w")
    n_feat = s(emb)[0]
    fields = dict(templates=True, c_t=c_t, template_pair_blocks=n_blocks,
                  template_tri_heads=tri_heads, c_hidden_template_tri_att=c_tri,
                  c_hidden_template_tri_mul=s(mul)[-1],
                  template_transition_n=_ratio(s(tr)[-1], c_t, "template transition width", tr),
                  template_att_heads=att_heads, c_hidden_template_att=c_att,
                  template_torsion_angles=EVO + "template_single_embedding//weights" in shapes,
                  template_dgram_bins=n_feat - (1 + 2 * 22 + 3 + 1))
    if fields["template_dgram_bins"] <= 0:
        raise InputError(f"template pair features: {n_feat} channels, expected 49 + bins", field=emb)
    return fields


def classify_keys(keys, entries: list[Entry]) -> dict[str, str]:
    """{skipped key: reason} for the source keys no entry maps; an unknown key is an error."""
    mapped = {e.af2 for e in entries}
    skipped = {}
    for key in keys:
        if key in mapped:
            continue
        if any(marker in key for marker in TEMPLATE_MARKERS):
            raise InputError("template parameter without the rest of the template module (its "
                             "embedding2d / pair stack / attention arrays are missing or mis-sized)",
                             field=key)
        else:
            raise InputError("unexpected AlphaFold parameter: not part of the AF2 monomer model "
                             "(multimer and other variants are not supported)", field=key)
    return skipped


def check_array(key: str, array: np.ndarray, expected: tuple) -> None:
    """One AlphaFold array: the shape the config implies, floating point, finite and within
    MAX_WEIGHT_MAGNITUDE (`protdp.model.weight_checks`); an error
    names the array, the shape it has and the expected one."""
    if tuple(array.shape) != tuple(expected):
        raise InputError(f"shape {tuple(array.shape)}, expected {tuple(expected)} from the "
                         "configuration", field=key)
    if not np.issubdtype(array.dtype, np.floating):
        raise InputError(f"dtype {array.dtype} is not floating point", field=key)
    if not np.isfinite(array).all():
        raise InputError(f"{int((~np.isfinite(array)).sum())} non-finite value(s) (NaN/Inf)", field=key)
    problem = value_problem(key, array)       # |w| <= MAX_WEIGHT_MAGNITUDE (one rule, one number)
    if problem:
        raise InputError(problem, field=key)


def _check_shape(entries: list[Entry], array: np.ndarray) -> None:
    """The shape AF2 stores for these entries (one key; a leading block axis if stacked)."""
    e = entries[0]
    if e.block is None:
        check_array(e.af2, array, e.af2_shape)
    else:
        check_array(e.af2, array, (max(x.block for x in entries) + 1,) + e.af2_shape)


def state_from_arrays(arrays: Mapping[str, np.ndarray], entries: list[Entry]) -> dict[str, np.ndarray]:
    """protdp state dict (float32 numpy) from AF2 arrays; each source array is read once (a
    lazily loading npz stays at about one array in memory besides the result); shapes are
    checked per key."""
    by_key: dict[str, list[Entry]] = {}
    for e in entries:
        by_key.setdefault(e.af2, []).append(e)
    state = {}
    for key, group in by_key.items():
        if key not in arrays:
            raise InputError("AlphaFold parameter is missing", field=key)
        array = np.asarray(arrays[key])
        _check_shape(group, array)
        array = array.astype(np.float32, copy=False)
        for e in group:
            state[e.torch] = to_torch(e, array if e.block is None else array[e.block])
    return state


def arrays_from_state(state: Mapping[str, np.ndarray], entries: list[Entry]) -> dict[str, np.ndarray]:
    """AF2 arrays (float32) from a protdp state dict; stacked blocks re-stacked."""
    blocks: dict[str, dict[int, np.ndarray]] = {}
    out = {}
    for e in entries:
        value = to_af2(e, np.asarray(state[e.torch], dtype=np.float32))
        if e.block is None:
            out[e.af2] = value
        else:
            blocks.setdefault(e.af2, {})[e.block] = value
    for key, per_block in blocks.items():
        out[key] = np.stack([per_block[i] for i in range(len(per_block))])
    return dict(sorted(out.items()))


def parameter_count(shapes: Mapping[str, tuple]) -> int:
    return int(sum(math.prod(v) for v in shapes.values()))
