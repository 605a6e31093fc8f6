"""AlphaFold-Multimer parameter files (`params_model_{1..5}_multimer_v3.npz`, `..._v2.npz`;
DeepMind's flat haiku naming) -> `protdp.model.multimer_model.MultimerModel` state dicts, the
configuration inferred from the array shapes.

Layout differences to the monomer files handled here (the rest reuses the monomer table of
`protdp.weights.alphafold`):
- triangle multiplications with fused `projection` / `gate` [C, 2c] (v3, and the v2/v3
  template stack): columns [:c] are AlphaFold's left projection, [c:] the right one, split
  into protdp's separate a/b linears (incoming: protdp's a = AlphaFold's right);
  unfused v2 Evoformer blocks (`left_projection`, ...) use the monomer names;
- the multimer IPA: `q_scalar_projection` / `k_scalar_projection` / `v_scalar_projection`
  [C, H, c] without bias (zero biases here), k and v interleaved per head into protdp's
  `linear_kv`; point projections [C, H, 3P] laid out (head, xyz, point) -> protdp's
  (xyz, head, point), k and v points concatenated per head;
- `quat_rigid/rigid` is the monomer `affine_update` (b, c, d, translation);
- template embedding, template torsion rows and the 22-class masked-MSA head of
  `MultimerModel`.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from protdp.errors import InputError
from protdp.model.config import ModelConfig
from protdp.model.multimer_embedders import MultimerInputEmbedder
from protdp.model.multimer_model import MULTIMER_POSITION_SCALE, MultimerConfig, MultimerModel
from protdp.model.multimer_template import PAIR_FEATURES
from protdp.weights.alphafold import (EVO, FOLD, MULTIMER_MARK, PREFIX, _Builder, _count,
                                      _evoformer_block, _ratio, _shape, _structure_module,
                                      to_torch)

TEMPLATE = EVO + "template_embedding/"
SINGLE_TEMPLATE = TEMPLATE + "single_template_embedding/"
IPA = FOLD + "invariant_point_attention/"
# monomer structure-module arrays that the multimer stores differently (`_ipa`, quat_rigid)
MONOMER_ONLY = ("q_scalar", "kv_scalar", "q_point_local", "kv_point_local", "affine_update")


def is_multimer(shapes: Mapping[str, tuple]) -> bool:
    return EVO + MULTIMER_MARK in shapes


def _fused(shapes: Mapping, stack: str) -> bool:
    return f"{stack}/triangle_multiplication_outgoing/projection//weights" in shapes


def infer_multimer_config(shapes: Mapping[str, tuple], *, sm_layers: int = 8,
                          num_recycles: int = 20) -> MultimerConfig:
    """MultimerConfig from the array shapes (structure-module depth and recycles are not in
    the arrays: AlphaFold-Multimer's values are the defaults, 8 layers, 20 recycles)."""
    s = lambda key: _shape(shapes, key)                                     # noqa: E731
    evo = EVO + "evoformer_iteration/"
    n_blocks, c_m, msa_heads, c_hidden_msa = s(evo + "msa_row_attention_with_pair_bias/attention//query_w")
    _, c_z, pair_heads, c_hidden_tri = s(evo + "triangle_attention_starting_node/attention//query_w")
    if _fused(shapes, EVO + "evoformer_iteration"):
        c_mul = s(evo + "triangle_multiplication_outgoing/projection//weights")[-1] // 2
    else:
        c_mul = s(evo + "triangle_multiplication_outgoing/left_projection//weights")[-1]
    extra = EVO + "extra_msa_stack/msa_row_attention_with_pair_bias/attention//query_w"
    e_blocks, c_e, _, c_hidden_e = s(extra)
    _, heads, c_ipa = s(IPA + "q_scalar_projection//weights")
    fields = dict(
        c_m=c_m, c_z=c_z, c_s=s(EVO + "single_activations//weights")[1], n_blocks=n_blocks,
        msa_heads=msa_heads, c_hidden_msa_att=c_hidden_msa, pair_heads=pair_heads,
        c_hidden_tri_att=c_hidden_tri, c_hidden_tri_mul=c_mul,
        c_hidden_opm=s(evo + "outer_product_mean/left_projection//weights")[-1],
        transition_n=_ratio(s(evo + "msa_transition/transition1//weights")[-1], c_m,
                            "MSA transition width", evo + "msa_transition"),
        extra_msa=True, c_e=c_e, n_extra_blocks=e_blocks, c_hidden_extra_att=c_hidden_e,
        msa_dropout=0.0, pair_dropout=0.0, sm_dropout=0.0,
        sm_layers=sm_layers, ipa_heads=heads, c_ipa=c_ipa,
        c_ipa_v=s(IPA + "v_scalar_projection//weights")[2],
        ipa_qk_points=s(IPA + "q_point_projection/point_projection//weights")[2] // 3,
        ipa_v_points=s(IPA + "v_point_projection/point_projection//weights")[2] // 3,
        sm_transition_layers=_count(shapes, FOLD + "transition"),
        c_resnet=s(FOLD + "rigid_sidechain/input_projection//weights")[1],
        n_resnet_blocks=_count(shapes, FOLD + "rigid_sidechain/resblock1"),
        position_scale=MULTIMER_POSITION_SCALE,
        distogram_bins=s(PREFIX + "distogram_head/half_logits//weights")[1],
        plddt_bins=s(PREFIX + "predicted_lddt_head/logits//weights")[1],
        c_plddt=s(PREFIX + "predicted_lddt_head/act_0//weights")[1],
        pae_head=True, pae_bins=s(PREFIX + "predicted_aligned_error_head/logits//weights")[1],
        recycle_bins=s(EVO + "prev_pos_linear//weights")[0],
        num_recycles=num_recycles, max_recycles=num_recycles)
    try:
        trunk = ModelConfig(**fields)
    except ValueError as exc:
        raise InputError(f"the AlphaFold-Multimer arrays describe no valid model: {exc}") from None
    templates = SINGLE_TEMPLATE + "output_layer_norm//scale" in shapes
    cfg = MultimerConfig(trunk=trunk, templates=templates)
    if templates:
        it = SINGLE_TEMPLATE + "template_embedding_iteration/"
        blocks, c_t, t_heads, c_t_att = s(it + "triangle_attention_starting_node/attention//query_w")
        cfg.c_t, cfg.template_blocks, cfg.template_heads = c_t, blocks, t_heads
        cfg.c_hidden_template_att = c_t_att
        cfg.c_hidden_template_mul = s(it + "triangle_multiplication_outgoing/projection//weights")[-1] // 2
        cfg.template_transition_n = s(it + "pair_transition/transition1//weights")[-1] // c_t
    return cfg


class _State:
    """Collects protdp tensors (numpy float32) from AlphaFold arrays, shapes checked."""

    def __init__(self, arrays: Mapping[str, np.ndarray], shapes: Mapping[str, tuple]):
        self.arrays, self.shapes, self.state, self.used = arrays, shapes, {}, set()

    def get(self, key: str, block: int | None = None) -> np.ndarray:
        if key not in self.arrays:
            raise InputError("AlphaFold parameter is missing", field=key)
        self.used.add(key)
        a = np.asarray(self.arrays[key], dtype=np.float32)
        return a if block is None else a[block]

    def put(self, torch_key: str, value: np.ndarray, af2_key: str) -> None:
        want = tuple(self.shapes[torch_key])
        if value.size != int(np.prod(want)):
            raise InputError(f"shape {value.shape} does not fit protdp's {want}", field=af2_key)
        if not np.isfinite(value).all():
            raise InputError("non-finite value(s) (NaN/Inf)", field=af2_key)
        self.state[torch_key] = np.ascontiguousarray(value.reshape(want))

    def linear(self, af2: str, mod: str, block=None, bias=True):
        w = self.get(af2 + "//weights", block)
        self.put(mod + ".weight", w.reshape(-1, w.shape[-1]).T if w.ndim > 1 else w[None].T,
                 af2)
        if bias:
            self.put(mod + ".bias", self.get(af2 + "//bias", block), af2)

    def layer_norm(self, af2: str, mod: str, block=None):
        self.put(mod + ".weight", self.get(af2 + "//scale", block), af2)
        self.put(mod + ".bias", self.get(af2 + "//offset", block), af2)

    def fused_tri_mul(self, af2: str, mod: str, block, outgoing: bool):
        self.layer_norm(af2 + "/left_norm_input", mod + ".norm_in", block)
        for name, kind in (("projection", "p"), ("gate", "g")):
            w, b = self.get(f"{af2}/{name}//weights", block), self.get(f"{af2}/{name}//bias", block)
            c = w.shape[-1] // 2
            halves = {"left": (w[:, :c], b[:c]), "right": (w[:, c:], b[c:])}
            a, bb = ("left", "right") if outgoing else ("right", "left")
            for side, src in (("a", a), ("b", bb)):
                self.put(f"{mod}.linear_{side}_{kind}.weight", halves[src][0].T, af2)
                self.put(f"{mod}.linear_{side}_{kind}.bias", halves[src][1], af2)
        self.layer_norm(af2 + "/center_norm", mod + ".norm_out", block)
        self.linear(af2 + "/output_projection", mod + ".linear_z", block)
        self.linear(af2 + "/gating_linear", mod + ".linear_g", block)


def _monomer_entries(state: _State, cfg: ModelConfig, stack_af2: str, stack_mod: str,
                     n: int, extra: bool) -> None:
    """Evoformer blocks through the monomer table; fused triangle updates split here."""
    b = _Builder(state.shapes)
    fused = _fused(state.arrays, stack_af2)
    for i in range(n):
        _evoformer_block(b, stack_af2, f"{stack_mod}.blocks.{i}", i, cfg, extra)
        if fused:
            state.fused_tri_mul(stack_af2 + "/triangle_multiplication_outgoing",
                                f"{stack_mod}.blocks.{i}.tri_mul_out", i, True)
            state.fused_tri_mul(stack_af2 + "/triangle_multiplication_incoming",
                                f"{stack_mod}.blocks.{i}.tri_mul_in", i, False)
    for e in b.entries:
        if fused and "triangle_multiplication" in e.af2:
            continue
        state.put(e.torch, to_torch(e, state.get(e.af2, e.block)), e.af2)


def _ipa(state: _State) -> None:
    def pts(name):
        w = state.get(IPA + f"{name}_point_projection/point_projection//weights")   # [C, H, 3P]
        b = state.get(IPA + f"{name}_point_projection/point_projection//bias")      # [H, 3P]
        C, H, P3 = w.shape
        return (w.reshape(C, H, 3, P3 // 3).transpose(0, 2, 1, 3),                 # [C, 3, H, P]
                b.reshape(H, 3, P3 // 3).transpose(1, 0, 2))
    mod = "structure_module.ipa"
    q = state.get(IPA + "q_scalar_projection//weights")
    k, v = state.get(IPA + "k_scalar_projection//weights"), state.get(IPA + "v_scalar_projection//weights")
    C = q.shape[0]
    state.put(mod + ".linear_q.weight", q.reshape(C, -1).T, IPA + "q_scalar_projection")
    state.put(mod + ".linear_q.bias", np.zeros(q.shape[1] * q.shape[2], np.float32), IPA)
    kv = np.concatenate([k, v], axis=-1)
    state.put(mod + ".linear_kv.weight", kv.reshape(C, -1).T, IPA + "k/v_scalar_projection")
    state.put(mod + ".linear_kv.bias", np.zeros(kv.shape[1] * kv.shape[2], np.float32), IPA)
    qw, qb = pts("q")
    state.put(mod + ".linear_q_pts.weight", qw.reshape(C, -1).T, IPA + "q_point_projection")
    state.put(mod + ".linear_q_pts.bias", qb.reshape(-1), IPA + "q_point_projection")
    (kw, kb), (vw, vb) = pts("k"), pts("v")
    state.put(mod + ".linear_kv_pts.weight", np.concatenate([kw, vw], -1).reshape(C, -1).T,
              IPA + "k/v_point_projection")
    state.put(mod + ".linear_kv_pts.bias", np.concatenate([kb, vb], -1).reshape(-1),
              IPA + "k/v_point_projection")


def multimer_state_from_arrays(arrays: Mapping[str, np.ndarray], cfg: MultimerConfig
                               ) -> dict[str, np.ndarray]:
    """protdp MultimerModel state dict (float32 numpy) from AlphaFold-Multimer arrays; an
    array that no parameter reads is an error naming it."""
    shapes = {k: tuple(v.shape) for k, v in MultimerModel(cfg).state_dict().items()}
    st, t = _State(arrays, shapes), cfg.trunk
    for mod, af in MultimerInputEmbedder.ALPHAFOLD_NAMES.items():
        st.linear(EVO + af, "input_embedder." + mod)
    st.linear(EVO + "prev_pos_linear", "recycling_embedder.linear_d")
    st.layer_norm(EVO + "prev_msa_first_row_norm", "recycling_embedder.norm_m")
    st.layer_norm(EVO + "prev_pair_norm", "recycling_embedder.norm_z")
    _monomer_entries(st, t, EVO + "extra_msa_stack", "extra_msa_stack", t.n_extra_blocks, True)
    _monomer_entries(st, t, EVO + "evoformer_iteration", "evoformer", t.n_blocks, False)
    st.linear(EVO + "single_activations", "evoformer.linear_s")
    b = _Builder(shapes)
    _structure_module(b, t)
    for e in b.entries:
        if any(f"/{name}//" in e.af2 for name in MONOMER_ONLY):
            continue
        st.put(e.torch, to_torch(e, st.get(e.af2)), e.af2)
    _ipa(st)
    st.linear(FOLD + "quat_rigid/rigid", "structure_module.backbone_update.linear")
    for af2, mod in (("distogram_head/half_logits", "distogram_head.linear"),
                     ("masked_msa_head/logits", "masked_msa_head.linear"),
                     ("experimentally_resolved_head/logits", "experimentally_resolved_head.linear"),
                     ("predicted_lddt_head/act_0", "plddt_head.linear_1"),
                     ("predicted_lddt_head/act_1", "plddt_head.linear_2"),
                     ("predicted_lddt_head/logits", "plddt_head.linear_3"),
                     ("predicted_aligned_error_head/logits", "pae_head.linear")):
        st.linear(PREFIX + af2, mod)
    st.layer_norm(PREFIX + "predicted_lddt_head/input_layer_norm", "plddt_head.norm")
    if cfg.templates:
        _templates(st, cfg)
    unused = sorted(set(arrays.keys()) - st.used)
    if unused:
        raise InputError("unexpected AlphaFold-Multimer parameter (no protdp parameter reads "
                         "it)", field=unused[0])
    missing = sorted(set(shapes) - set(st.state))
    if missing:
        raise InputError(f"protdp parameter not filled from the AlphaFold arrays: {missing[0]}")
    return st.state


def _templates(st: _State, cfg: MultimerConfig) -> None:
    mod = "template_embedder"
    for i, _ in enumerate(PAIR_FEATURES):
        st.linear(SINGLE_TEMPLATE + f"template_pair_embedding_{i}", f"{mod}.pair_embeddings.{i}")
    st.layer_norm(SINGLE_TEMPLATE + "query_embedding_norm", mod + ".query_norm")
    st.layer_norm(SINGLE_TEMPLATE + "output_layer_norm", mod + ".norm")
    st.linear(TEMPLATE + "output_linear", mod + ".output_linear")
    st.linear(EVO + "template_single_embedding", mod + ".single_embedding")
    st.linear(EVO + "template_projection", mod + ".single_projection")
    it = SINGLE_TEMPLATE + "template_embedding_iteration"
    b = _Builder(st.shapes)
    for i in range(cfg.template_blocks):
        blk = f"{mod}.blocks.{i}"
        st.fused_tri_mul(it + "/triangle_multiplication_outgoing", blk + ".tri_mul_out", i, True)
        st.fused_tri_mul(it + "/triangle_multiplication_incoming", blk + ".tri_mul_in", i, False)
        for name, sub in (("starting", "tri_att_start"), ("ending", "tri_att_end")):
            att = f"{it}/triangle_attention_{name}_node"
            b.layer_norm(att + "/query_norm", f"{blk}.{sub}.norm", i)
            b.add(att + "//feat_2d_weights", f"{blk}.{sub}.linear_b.weight", "T", block=i)
            b.attention(att + "/attention", f"{blk}.{sub}.attention", cfg.template_heads, i)
        tr = it + "/pair_transition"
        b.layer_norm(tr + "/input_layer_norm", blk + ".pair_transition.norm", i)
        b.linear(tr + "/transition1", blk + ".pair_transition.linear_1", i)
        b.linear(tr + "/transition2", blk + ".pair_transition.linear_2", i)
    for e in b.entries:
        st.put(e.torch, to_torch(e, st.get(e.af2, e.block)), e.af2)
