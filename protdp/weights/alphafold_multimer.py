"""AlphaFold-Multimer parameter files (`params_model_{1..5}_multimer_v3.npz`, `..._v2.npz`;
DeepMind's flat haiku naming) <-> `protdp.model.multimer.model.MultimerModel` state dicts, the
configuration inferred from the array shapes.

Every width is read from its own array, never assumed equal to another: the single
representation (`single_activations`, seq_channel) and the structure module
(`initial_projection`, num_channel) may differ, as may MSA / pair / extra-MSA / template channels,
head counts, IPA scalar and point sizes, outer-product and triangle-multiplication widths.
`multimer_layout(cfg, shapes)` lists every protdp parameter with the AlphaFold array it comes
from, so import (`multimer_state_from_arrays`) and export (`multimer_arrays_from_state`) read one
table in two directions, and every array's shape is checked against the shape the config implies
(a mismatch names the array, its shape and the expected one).

Layout differences to the monomer files handled here (the rest reuses the monomer table of
`protdp.weights.alphafold`):
- triangle multiplications with fused `projection` / `gate` [C, 2c] (v3, and the v2/v3
  template stack; `Fused`): columns [:c] are AlphaFold's left projection, [c:] the right one,
  split into protdp's separate a/b linears (incoming: protdp's a = AlphaFold's right);
  unfused v2 Evoformer blocks (`left_projection`, ...) use the monomer names;
- the multimer IPA: `q_scalar_projection` / `k_scalar_projection` / `v_scalar_projection`
  [C, H, c] without bias (zero biases here), k and v interleaved per head into protdp's
  `linear_kv`; point projections [C, H, 3P] laid out (head, xyz, point) -> protdp's
  (xyz, head, point), k and v points concatenated per head;
- `quat_rigid/rigid` is the monomer `affine_update` (b, c, d, translation);
- template embedding (scalar pair features have 1-D weights [C_t]), template torsion rows and
  the 22-class masked-MSA head of `MultimerModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from protdp.errors import InputError
from protdp.model.config import ModelConfig
from protdp.model.multimer.embedders import MultimerInputEmbedder, relative_chain_dim
from protdp.model.multimer.model import MULTIMER_POSITION_SCALE, MultimerConfig, MultimerModel
from protdp.model.multimer.template import PAIR_FEATURES
from protdp.weights.alphafold import (EVO, FOLD, MULTIMER_MARK, PREFIX, Entry, _Builder, _count,
                                      _evoformer_block, _heads, _ratio, _shape, _structure_module,
                                      arrays_from_state, check_array, state_from_arrays)

TEMPLATE = EVO + "template_embedding/"
SINGLE_TEMPLATE = TEMPLATE + "single_template_embedding/"
TEMPLATE_ITERATION = SINGLE_TEMPLATE + "template_embedding_iteration"
IPA = FOLD + "invariant_point_attention/"
# monomer structure-module arrays that the multimer stores differently (`_ipa_*`, quat_rigid)
MONOMER_ONLY = ("q_scalar", "kv_scalar", "q_point_local", "kv_point_local", "affine_update")
IPA_MOD = "structure_module.ipa."
IPA_SCALAR_BIASES = (IPA_MOD + "linear_q.bias", IPA_MOD + "linear_kv.bias")


def is_multimer(shapes: Mapping[str, tuple]) -> bool:
    return EVO + MULTIMER_MARK in shapes


def is_fused_evoformer(shapes: Mapping) -> bool:
    """v3's fused Evoformer triangle projections (v2: left/right_projection, ...)."""
    return _fused(shapes, EVO + "evoformer_iteration")


def _fused(shapes: Mapping, stack: str) -> bool:
    return f"{stack}/triangle_multiplication_outgoing/projection//weights" in shapes


def _trunk_fields(shapes: Mapping[str, tuple]) -> dict:
    """ModelConfig fields of the Evoformer, extra-MSA stack and input embedding."""
    s = lambda key: _shape(shapes, key)                                     # noqa: E731
    evo = EVO + "evoformer_iteration/"
    n_blocks, c_m, msa_heads, c_hidden_msa = s(evo + "msa_row_attention_with_pair_bias/attention//query_w")
    _, c_z, pair_heads, c_hidden_tri = s(evo + "triangle_attention_starting_node/attention//query_w")
    if _fused(shapes, EVO + "evoformer_iteration"):
        key = evo + "triangle_multiplication_outgoing/projection//weights"
        c_mul = _ratio(s(key)[-1], 2, "fused triangle projection (left | right)", key)
    else:
        c_mul = s(evo + "triangle_multiplication_outgoing/left_projection//weights")[-1]
    msa_tr, pair_tr = evo + "msa_transition/transition1//weights", evo + "pair_transition/transition1//weights"
    transition_n = _ratio(s(msa_tr)[-1], c_m, "MSA transition width", msa_tr)
    pair_n = _ratio(s(pair_tr)[-1], c_z, "pair transition width", pair_tr)
    if pair_n != transition_n:
        raise InputError(f"shape {s(pair_tr)}: pair transition factor {pair_n}, the MSA "
                         f"transition's {transition_n}; protdp uses one", field=pair_tr)
    extra = EVO + "extra_msa_stack/msa_row_attention_with_pair_bias/attention//query_w"
    e_blocks, c_e, e_heads, c_hidden_e = s(extra)
    if e_heads != msa_heads:
        raise InputError(f"shape {s(extra)}: {e_heads} extra-MSA heads, the MSA stack has "
                         f"{msa_heads}; protdp uses one count", field=extra)
    relpos = EVO + MULTIMER_MARK
    if s(relpos)[0] != relative_chain_dim():
        raise InputError(f"shape {s(relpos)}: {s(relpos)[0]} relative-encoding features, protdp "
                         f"encodes {relative_chain_dim()} (max_relative_idx 32, "
                         "max_relative_chain 2)", field=relpos)
    return dict(c_m=c_m, c_z=c_z, c_s=s(EVO + "single_activations//weights")[1],
                n_blocks=n_blocks, msa_heads=msa_heads, c_hidden_msa_att=c_hidden_msa,
                pair_heads=pair_heads, c_hidden_tri_att=c_hidden_tri, c_hidden_tri_mul=c_mul,
                c_hidden_opm=s(evo + "outer_product_mean/left_projection//weights")[-1],
                transition_n=transition_n, extra_msa=True, c_e=c_e, n_extra_blocks=e_blocks,
                c_hidden_extra_att=c_hidden_e)


def _structure_fields(shapes: Mapping[str, tuple], c_s: int) -> dict:
    """ModelConfig fields of the structure module (multimer IPA) and the heads."""
    s = lambda key: _shape(shapes, key)                                     # noqa: E731
    c_sm, heads, c_ipa = s(IPA + "q_scalar_projection//weights")
    points = {}
    for name in ("q", "v"):
        key = IPA + f"{name}_point_projection/point_projection//weights"
        points[name] = _ratio(s(key)[2], 3, "IPA points (xyz per point)", key)
    width = s(PREFIX + "structure_module/initial_projection//weights")[1]
    return dict(
        c_sm=None if width == c_s else width, sm_dropout=0.0, ipa_heads=heads, c_ipa=c_ipa,
        c_ipa_v=s(IPA + "v_scalar_projection//weights")[2], ipa_qk_points=points["q"],
        ipa_v_points=points["v"], sm_transition_layers=_count(shapes, FOLD + "transition"),
        c_resnet=s(FOLD + "rigid_sidechain/input_projection//weights")[1],
        n_resnet_blocks=_count(shapes, FOLD + "rigid_sidechain/resblock1"),
        position_scale=MULTIMER_POSITION_SCALE,
        distogram_bins=s(PREFIX + "distogram_head/half_logits//weights")[1],
        plddt_bins=s(PREFIX + "predicted_lddt_head/logits//weights")[1],
        c_plddt=s(PREFIX + "predicted_lddt_head/act_0//weights")[1],
        pae_head=True, pae_bins=s(PREFIX + "predicted_aligned_error_head/logits//weights")[1],
        recycle_bins=s(EVO + "prev_pos_linear//weights")[0])


def _template_fields(shapes: Mapping[str, tuple]) -> dict:
    s = lambda key: _shape(shapes, key)                                     # noqa: E731
    if SINGLE_TEMPLATE + "output_layer_norm//scale" not in shapes:
        return {"templates": False}
    it = TEMPLATE_ITERATION + "/"
    blocks, c_t, t_heads, c_t_att = s(it + "triangle_attention_starting_node/attention//query_w")
    mul, tr = it + "triangle_multiplication_outgoing/projection//weights", it + "pair_transition/transition1//weights"
    return dict(templates=True, c_t=c_t, template_blocks=blocks, template_heads=t_heads,
                c_hidden_template_att=c_t_att,
                c_hidden_template_mul=_ratio(s(mul)[-1], 2, "fused triangle projection", mul),
                template_transition_n=_ratio(s(tr)[-1], c_t, "template transition width", tr))


def infer_multimer_config(shapes: Mapping[str, tuple], *, sm_layers: int = 8,
                          num_recycles: int = 20, overrides: Mapping | None = None
                          ) -> MultimerConfig:
    """MultimerConfig from the array shapes (structure-module depth and recycles are not in
    the arrays: AlphaFold-Multimer's values are the defaults, 8 layers, 20 recycles).
    `overrides` ({"trunk": {...}, "multimer": {...}}, e.g. from AlphaFold's config JSON,
    `protdp.weights.alphafold_config`) replace inferred values; the import then checks every
    array against them and names the first that disagrees."""
    overrides = overrides or {}
    fields = _trunk_fields(shapes)
    fields.update(_structure_fields(shapes, fields["c_s"]), msa_dropout=0.0, pair_dropout=0.0,
                  sm_layers=sm_layers, num_recycles=num_recycles, max_recycles=num_recycles)
    fields.update(overrides.get("trunk", {}))
    if fields.get("c_sm") == fields["c_s"]:
        fields["c_sm"] = None                           # one width: ModelConfig's null
    try:
        trunk = ModelConfig(**fields)
        return MultimerConfig(trunk=trunk, **{**_template_fields(shapes),
                                              **overrides.get("multimer", {})})
    except (TypeError, ValueError) as exc:
        raise InputError(f"the AlphaFold-Multimer arrays describe no valid model: {exc}") from None


# ------------------------------------------------------------------ the parameter table
@dataclass(frozen=True)
class Fused:
    """A fused triangle multiplication's `projection` and `gate` ([C, 2c]: left | right) of
    block `block`, split onto protdp's linear_{a,b}_{p,g}."""

    af2: str
    mod: str
    block: int
    outgoing: bool

    def sides(self) -> tuple[str, str]:
        """protdp's linears holding AlphaFold's (left, right) halves (incoming: 'kjc,kic->ijc')."""
        return ("a", "b") if self.outgoing else ("b", "a")


def _fused_tri_mul(b: _Builder, af2: str, mod: str, block: int) -> list[Fused]:
    out = []
    for direction, outgoing, sub in (("outgoing", True, "tri_mul_out"),
                                     ("incoming", False, "tri_mul_in")):
        key, m = f"{af2}/triangle_multiplication_{direction}", f"{mod}.{sub}"
        b.layer_norm(key + "/left_norm_input", m + ".norm_in", block)
        b.layer_norm(key + "/center_norm", m + ".norm_out", block)
        b.linear(key + "/output_projection", m + ".linear_z", block)
        b.linear(key + "/gating_linear", m + ".linear_g", block)
        out.append(Fused(key, m, block, outgoing))
    return out


def _template_entries(b: _Builder, cfg: MultimerConfig) -> list[Fused]:
    mod, fused = "template_embedder", []
    for i, _ in enumerate(PAIR_FEATURES):
        af2, lin = SINGLE_TEMPLATE + f"template_pair_embedding_{i}", f"{mod}.pair_embeddings.{i}"
        c_t, c_in = b.shapes[lin + ".weight"]
        b.add(af2 + "//weights", lin + ".weight", "T", (c_t,) if c_in == 1 else (c_in, c_t))
        b.add(af2 + "//bias", lin + ".bias", "id")
    b.layer_norm(SINGLE_TEMPLATE + "query_embedding_norm", mod + ".query_norm")
    b.layer_norm(SINGLE_TEMPLATE + "output_layer_norm", mod + ".norm")
    b.linear(TEMPLATE + "output_linear", mod + ".output_linear")
    b.linear(EVO + "template_single_embedding", mod + ".single_embedding")
    b.linear(EVO + "template_projection", mod + ".single_projection")
    it = TEMPLATE_ITERATION
    for i in range(cfg.template_blocks):
        blk = f"{mod}.blocks.{i}"
        fused += _fused_tri_mul(b, it, blk, i)
        for name, sub in (("starting", "tri_att_start"), ("ending", "tri_att_end")):
            att = f"{it}/triangle_attention_{name}_node"
            b.layer_norm(att + "/query_norm", f"{blk}.{sub}.norm", i)
            b.add(att + "//feat_2d_weights", f"{blk}.{sub}.linear_b.weight", "T", block=i)
            b.attention(att + "/attention", f"{blk}.{sub}.attention", cfg.template_heads, i)
        tr = it + "/pair_transition"
        b.layer_norm(tr + "/input_layer_norm", blk + ".pair_transition.norm", i)
        b.linear(tr + "/transition1", blk + ".pair_transition.linear_1", i)
        b.linear(tr + "/transition2", blk + ".pair_transition.linear_2", i)
    return fused


def multimer_layout(cfg: MultimerConfig, shapes: Mapping[str, tuple], fused_evoformer: bool
                    ) -> tuple[list[Entry], list[Fused]]:
    """Every protdp parameter but the multimer IPA's (`_ipa_from_arrays`): plain entries (the
    monomer table's layouts) and the fused triangle projections."""
    t, b, fused = cfg.trunk, _Builder(shapes), []
    for mod, af in MultimerInputEmbedder.ALPHAFOLD_NAMES.items():
        b.linear(EVO + af, "input_embedder." + mod)
    b.linear(EVO + "prev_pos_linear", "recycling_embedder.linear_d")
    b.layer_norm(EVO + "prev_msa_first_row_norm", "recycling_embedder.norm_m")
    b.layer_norm(EVO + "prev_pair_norm", "recycling_embedder.norm_z")
    for stack, mod, n, extra in ((EVO + "extra_msa_stack", "extra_msa_stack", t.n_extra_blocks, True),
                                 (EVO + "evoformer_iteration", "evoformer", t.n_blocks, False)):
        for i in range(n):
            first = len(b.entries)
            _evoformer_block(b, stack, f"{mod}.blocks.{i}", i, t, extra)
            if fused_evoformer:    # drop the monomer's unfused triangle entries
                b.entries[first:] = [e for e in b.entries[first:]
                                     if "/triangle_multiplication_" not in e.af2]
                fused += _fused_tri_mul(b, stack, f"{mod}.blocks.{i}", i)
    b.linear(EVO + "single_activations", "evoformer.linear_s")
    _structure_module(b, t)
    b.entries = [e for e in b.entries if not any(f"/{name}//" in e.af2 for name in MONOMER_ONLY)]
    b.linear(FOLD + "quat_rigid/rigid", "structure_module.backbone_update.linear")
    _heads(b, pae_head=True)
    if cfg.templates:
        fused += _template_entries(b, cfg)
    return b.entries, fused


# ------------------------------------------------------------------ special layouts
class _Reader:
    """AlphaFold arrays read once each (a lazily loading npz stays near one array in memory),
    every shape checked against the one the config implies; `used` records the keys read."""

    def __init__(self, arrays: Mapping[str, np.ndarray], blocks: Mapping[str, int]):
        self.arrays, self.blocks, self.used = arrays, blocks, set()
        self._last: tuple[str, np.ndarray] | None = None

    def read(self, key: str, shape: tuple, block: int | None = None) -> np.ndarray:
        if self._last is None or self._last[0] != key:
            if key not in self.arrays:
                raise InputError("AlphaFold parameter is missing", field=key)
            n = self.blocks.get(key.rsplit("//", 1)[0].rsplit("/", 1)[0])
            want = tuple(shape) if block is None else (n,) + tuple(shape)
            array = np.asarray(self.arrays[key])
            check_array(key, array, want)
            self._last = (key, array.astype(np.float32, copy=False))
            self.used.add(key)
        array = self._last[1]
        return array if block is None else array[block]


def _fused_from_arrays(r: _Reader, f: Fused, shapes: Mapping) -> dict[str, np.ndarray]:
    out = {}
    c, c_in = shapes[f"{f.mod}.linear_a_p.weight"]
    for name, kind in (("projection", "p"), ("gate", "g")):
        w = r.read(f"{f.af2}/{name}//weights", (c_in, 2 * c), f.block)          # [C, 2c]
        bias = r.read(f"{f.af2}/{name}//bias", (2 * c,), f.block)
        for side, cols in zip(f.sides(), (slice(0, c), slice(c, 2 * c))):
            out[f"{f.mod}.linear_{side}_{kind}.weight"] = np.ascontiguousarray(w[:, cols].T)
            out[f"{f.mod}.linear_{side}_{kind}.bias"] = np.ascontiguousarray(bias[cols])
    return out


def _fused_to_arrays(state: Mapping, f: Fused) -> dict[str, np.ndarray]:
    out = {}
    for name, kind in (("projection", "p"), ("gate", "g")):
        lin = [f"{f.mod}.linear_{side}_{kind}" for side in f.sides()]         # left, right
        out[f"{f.af2}/{name}//weights"] = np.concatenate([state[k + ".weight"].T for k in lin], 1)
        out[f"{f.af2}/{name}//bias"] = np.concatenate([state[k + ".bias"] for k in lin])
    return out


def _ipa_sizes(shapes: Mapping) -> tuple[int, ...]:
    """(C_sm, heads, scalar qk, scalar v, qk points, v points) from protdp's IPA shapes."""
    heads = shapes[IPA_MOD + "head_weights"][0]
    hc, c_sm = shapes[IPA_MOD + "linear_q.weight"]
    c = hc // heads
    p = shapes[IPA_MOD + "linear_q_pts.weight"][0] // (3 * heads)
    return (c_sm, heads, c, shapes[IPA_MOD + "linear_kv.weight"][0] // heads - c, p,
            shapes[IPA_MOD + "linear_kv_pts.weight"][0] // (3 * heads) - p)


def _ipa_from_arrays(r: _Reader, shapes: Mapping) -> dict[str, np.ndarray]:
    """The multimer IPA projections (module docstring) -> protdp's monomer IPA layout."""
    C, H, c, cv, P, PV = _ipa_sizes(shapes)
    q = r.read(IPA + "q_scalar_projection//weights", (C, H, c))
    k = r.read(IPA + "k_scalar_projection//weights", (C, H, c))
    v = r.read(IPA + "v_scalar_projection//weights", (C, H, cv))

    def points(name, n):        # [C, H, 3n] (head, xyz, point) -> [C, 3, H, n], bias [3, H, n]
        w = r.read(IPA + f"{name}_point_projection/point_projection//weights", (C, H, 3 * n))
        b = r.read(IPA + f"{name}_point_projection/point_projection//bias", (H, 3 * n))
        return w.reshape(C, H, 3, n).transpose(0, 2, 1, 3), b.reshape(H, 3, n).transpose(1, 0, 2)

    (qw, qb), (kw, kb), (vw, vb) = points("q", P), points("k", P), points("v", PV)
    out = {"linear_q.weight": q.reshape(C, -1).T,
           "linear_q.bias": np.zeros(H * c, np.float32),
           "linear_kv.weight": np.concatenate([k, v], -1).reshape(C, -1).T,
           "linear_kv.bias": np.zeros(H * (c + cv), np.float32),
           "linear_q_pts.weight": qw.reshape(C, -1).T, "linear_q_pts.bias": qb.reshape(-1),
           "linear_kv_pts.weight": np.concatenate([kw, vw], -1).reshape(C, -1).T,
           "linear_kv_pts.bias": np.concatenate([kb, vb], -1).reshape(-1)}
    return {IPA_MOD + k: np.ascontiguousarray(v) for k, v in out.items()}


def _ipa_to_arrays(state: Mapping, shapes: Mapping) -> dict[str, np.ndarray]:
    """protdp's IPA -> the multimer arrays; a non-zero scalar bias has no AlphaFold array."""
    C, H, c, cv, P, PV = _ipa_sizes(shapes)
    for key in IPA_SCALAR_BIASES:
        if np.any(state[key] != 0):
            raise InputError("non-zero bias: AlphaFold-Multimer's IPA scalar projections have "
                             "none, so it cannot be exported", field=key)
    kv = state[IPA_MOD + "linear_kv.weight"].T.reshape(C, H, c + cv)

    def points(name, lo, hi, n_all):    # protdp [3H n_all, C] -> AlphaFold [C, H, 3n], [H, 3n]
        w = state[IPA_MOD + f"{name}.weight"].T.reshape(C, 3, H, n_all)[..., lo:hi]
        b = state[IPA_MOD + f"{name}.bias"].reshape(3, H, n_all)[..., lo:hi]
        n = hi - lo
        return (w.transpose(0, 2, 1, 3).reshape(C, H, 3 * n), b.transpose(1, 0, 2).reshape(H, 3 * n))

    out = {"q_scalar_projection//weights": state[IPA_MOD + "linear_q.weight"].T.reshape(C, H, c),
           "k_scalar_projection//weights": kv[..., :c], "v_scalar_projection//weights": kv[..., c:]}
    for name, pts in (("q", points("linear_q_pts", 0, P, P)),
                      ("k", points("linear_kv_pts", 0, P, P + PV)),
                      ("v", points("linear_kv_pts", P, P + PV, P + PV))):
        out[f"{name}_point_projection/point_projection//weights"] = pts[0]
        out[f"{name}_point_projection/point_projection//bias"] = pts[1]
    return {IPA + k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _block_counts(fused: list[Fused]) -> dict[str, int]:
    """{haiku module path of a stacked array: number of blocks} (AlphaFold's layer_stack axis)."""
    counts: dict[str, int] = {}
    for f in fused:
        counts[f.af2] = max(counts.get(f.af2, 0), f.block + 1)
    return counts


def _model_shapes(cfg: MultimerConfig) -> dict[str, tuple]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in MultimerModel(cfg).state_dict().items()}


def multimer_state_from_arrays(arrays: Mapping[str, np.ndarray], cfg: MultimerConfig,
                               fused_evoformer: bool | None = None) -> dict[str, np.ndarray]:
    """protdp MultimerModel state dict (float32 numpy) from AlphaFold-Multimer arrays. Every
    array's shape is checked against the one `cfg` implies (an error names the array, its
    shape and the expected one); a missing array, or one that no parameter reads, is an error
    naming it. `fused_evoformer`: v3's fused Evoformer triangle projections (default: as the
    arrays have them)."""
    keys = set(arrays.keys())
    if fused_evoformer is None:
        fused_evoformer = _fused(keys, EVO + "evoformer_iteration")
    shapes = _model_shapes(cfg)
    entries, fused = multimer_layout(cfg, shapes, fused_evoformer)
    state = state_from_arrays(arrays, entries)
    reader = _Reader(arrays, _block_counts(fused))
    for f in fused:
        state.update(_fused_from_arrays(reader, f, shapes))
    state.update(_ipa_from_arrays(reader, shapes))
    unused = sorted(keys - reader.used - {e.af2 for e in entries})
    if unused:
        raise InputError("unexpected AlphaFold-Multimer parameter (no protdp parameter reads "
                         f"it with this configuration: {_describe(cfg)})", field=unused[0])
    missing = sorted(set(shapes) - set(state))
    if missing:       # the table covers every parameter; a gap here is a protdp bug
        raise RuntimeError(f"protdp parameter not filled from the AlphaFold arrays: {missing[0]}")
    return state


def multimer_arrays_from_state(state: Mapping[str, np.ndarray], cfg: MultimerConfig, *,
                               fused_evoformer: bool = True) -> dict[str, np.ndarray]:
    """AlphaFold-Multimer arrays (float32, v3 layout unless `fused_evoformer` is False) from a
    MultimerModel state dict; the inverse of `multimer_state_from_arrays`, bit for bit."""
    state = {k: np.asarray(v, dtype=np.float32) for k, v in state.items()}
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    entries, fused = multimer_layout(cfg, shapes, fused_evoformer)
    out = arrays_from_state(state, entries)
    stacked: dict[str, dict[int, np.ndarray]] = {}
    for f in fused:
        for key, value in _fused_to_arrays(state, f).items():
            stacked.setdefault(key, {})[f.block] = value
    out.update({k: np.stack([v[i] for i in range(len(v))]) for k, v in stacked.items()})
    out.update(_ipa_to_arrays(state, shapes))
    return dict(sorted(out.items()))


def _describe(cfg: MultimerConfig) -> str:
    t = cfg.trunk
    return (f"{t.n_blocks} Evoformer / {t.n_extra_blocks} extra-MSA blocks, templates "
            f"{'on (%d blocks)' % cfg.template_blocks if cfg.templates else 'off'}")
