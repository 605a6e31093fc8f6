"""Sizes from AlphaFold's model config (a `ConfigDict.to_dict()` dump as JSON, bare or the
fixtures' {"config": ...} wrapper) as protdp config fields, so an import can check the arrays
against the config the user gave: every width, head count and block count here overrides the
value inferred from the arrays, and the importer's shape check then names the first array that
disagrees, its shape and the shape the config implies (issue 42).

Per-head widths follow AlphaFold's `Attention`: key_dim (default: the input channels) // heads.
"""

from __future__ import annotations

from typing import Mapping


def _get(d: Mapping, path: str):
    for part in path.split("."):
        if not isinstance(d, Mapping) or part not in d:
            return None
        d = d[part]
    return d


def _per_head(node: Mapping | None, channels: int | None) -> tuple[int | None, int | None]:
    """(heads, per-head key width) of an AlphaFold attention config node."""
    heads = _get(node or {}, "num_head")
    key_dim = _get(node or {}, "key_dim") or channels
    if heads is None or key_dim is None:
        return heads, None
    return heads, key_dim // heads


def _drop_none(d: dict) -> dict:
    return {k: int(v) for k, v in d.items() if v is not None}


def trunk_overrides(model: Mapping) -> dict:
    """ModelConfig sizes of the Evoformer, extra-MSA stack, structure module and heads from
    AlphaFold's `model` config (monomer and multimer name them alike; only those it states)."""
    e = _get(model, "embeddings_and_evoformer") or {}
    evo = _get(e, "evoformer") or {}
    sm = _get(model, "heads.structure_module") or {}
    c_m, c_z, c_e = e.get("msa_channel"), e.get("pair_channel"), e.get("extra_msa_channel")
    msa_heads, c_hidden_msa = _per_head(evo.get("msa_row_attention_with_pair_bias"), c_m)
    pair_heads, c_hidden_tri = _per_head(evo.get("triangle_attention_starting_node"), c_z)
    factor = _get(evo, "msa_transition.num_intermediate_factor")
    trunk = _drop_none(dict(
        c_m=c_m, c_z=c_z, c_s=e.get("seq_channel"), c_e=c_e,
        n_blocks=e.get("evoformer_num_block"), n_extra_blocks=e.get("extra_msa_stack_num_block"),
        msa_heads=msa_heads, c_hidden_msa_att=c_hidden_msa, pair_heads=pair_heads,
        c_hidden_tri_att=c_hidden_tri,
        c_hidden_extra_att=None if c_e is None or msa_heads is None else c_e // msa_heads,
        c_hidden_tri_mul=_get(evo, "triangle_multiplication_outgoing.num_intermediate_channel"),
        c_hidden_opm=_get(evo, "outer_product_mean.num_outer_channel"), transition_n=factor,
        c_sm=sm.get("num_channel"), ipa_heads=sm.get("num_head"), c_ipa=sm.get("num_scalar_qk"),
        c_ipa_v=sm.get("num_scalar_v"), ipa_qk_points=sm.get("num_point_qk"),
        ipa_v_points=sm.get("num_point_v"),
        sm_transition_layers=sm.get("num_layer_in_transition"),
        c_resnet=_get(sm, "sidechain.num_channel"),
        n_resnet_blocks=_get(sm, "sidechain.num_residual_block"),
        c_plddt=_get(model, "heads.predicted_lddt.num_channels"),
        plddt_bins=_get(model, "heads.predicted_lddt.num_bins"),
        distogram_bins=_get(model, "heads.distogram.num_bins"),
        pae_bins=_get(model, "heads.predicted_aligned_error.num_bins")))
    if trunk.get("c_sm") is not None and trunk.get("c_sm") == trunk.get("c_s"):
        trunk["c_sm"] = None                            # one width: ModelConfig's null
    return trunk


def monomer_overrides(model: Mapping) -> dict:
    """ModelConfig fields from AlphaFold2's (monomer) `model` config: the trunk sizes, the
    relative-position clip and the template module's (Alg. 16-17) sizes."""
    fields = trunk_overrides(model)
    e = _get(model, "embeddings_and_evoformer") or {}
    if e.get("max_relative_feature") is not None:
        fields["relpos_k"] = int(e["max_relative_feature"])
    t = e.get("template") or {}
    stack = t.get("template_pair_stack") or {}
    if t.get("enabled") and stack:
        c_t = _get(stack, "triangle_attention_ending_node.value_dim")
        tri_heads, c_tri = _per_head(stack.get("triangle_attention_starting_node"), c_t)
        att_heads, c_att = _per_head(t.get("attention"), None)
        fields.update(_drop_none(dict(
            c_t=c_t, template_pair_blocks=stack.get("num_block"), template_tri_heads=tri_heads,
            c_hidden_template_tri_att=c_tri,
            c_hidden_template_tri_mul=_get(stack, "triangle_multiplication_outgoing."
                                                  "num_intermediate_channel"),
            template_transition_n=_get(stack, "pair_transition.num_intermediate_factor"),
            template_att_heads=att_heads, c_hidden_template_att=c_att)))
    return fields


def multimer_overrides(model: Mapping) -> dict:
    """{"trunk": ModelConfig fields, "multimer": MultimerConfig fields} from AlphaFold-Multimer's
    `model` config (only the sizes it states)."""
    e = _get(model, "embeddings_and_evoformer") or {}
    trunk, multimer = trunk_overrides(model), {}
    t = _get(e, "template") or {}
    if t.get("enabled", True) and "num_channels" in t:
        c_t = t["num_channels"]
        stack = t.get("template_pair_stack") or {}
        heads, c_att = _per_head(stack.get("triangle_attention_starting_node"), c_t)
        multimer = _drop_none(dict(
            c_t=c_t, template_blocks=stack.get("num_block"), template_heads=heads,
            c_hidden_template_att=c_att,
            c_hidden_template_mul=_get(stack, "triangle_multiplication_outgoing."
                                              "num_intermediate_channel"),
            template_transition_n=_get(stack, "pair_transition.num_intermediate_factor")))
    return {"trunk": trunk, "multimer": multimer}
