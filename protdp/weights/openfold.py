"""OpenFold checkpoints (`.pt` state dicts, monomer AlphaFold2 architecture) <-> protdp.

OpenFold stores every tensor in the layout protdp uses (torch Linear [out, in], attention
projections flattened (head, channel), IPA points (xyz, head, point), the incoming triangle
update's a/b already swapped: `openfold/utils/import_weights.py` shows the same reshapes from
AlphaFold's arrays), so the two differ by parameter names only. `PREFIXES` pairs protdp name
prefixes with OpenFold's; the first matching pair renames a key, in either direction. Head
counts are read back from the pair-bias / head-weight shapes, so an OpenFold file needs no
separate config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from protdp.errors import InputError
from protdp.model.config import ModelConfig
from protdp.train.checkpointing import load_cpu
from protdp.weights import alphafold, validate

_STACK_COMMON = [
    ("msa_row.norm_m.", "msa_att_row.layer_norm_m."), ("msa_row.norm_z.", "msa_att_row.layer_norm_z."),
    ("msa_row.linear_b.", "msa_att_row.linear_z."), ("msa_row.attention.", "msa_att_row.mha."),
    ("msa_transition.norm.", "msa_transition.layer_norm."), ("msa_transition.", "msa_transition."),
    ("opm.norm.", "outer_product_mean.layer_norm."), ("opm.linear_a.", "outer_product_mean.linear_1."),
    ("opm.linear_b.", "outer_product_mean.linear_2."), ("opm.linear_out.", "outer_product_mean.linear_out."),
]
for _t in ("tri_mul_out", "tri_mul_in"):
    _STACK_COMMON += [(f"{_t}.norm_in.", f"pair_stack.{_t}.layer_norm_in."),
                      (f"{_t}.norm_out.", f"pair_stack.{_t}.layer_norm_out."),
                      (f"{_t}.", f"pair_stack.{_t}.")]
for _t in ("tri_att_start", "tri_att_end"):
    _STACK_COMMON += [(f"{_t}.norm.", f"pair_stack.{_t}.layer_norm."),
                      (f"{_t}.linear_b.", f"pair_stack.{_t}.linear."),
                      (f"{_t}.attention.", f"pair_stack.{_t}.mha.")]
_STACK_COMMON += [("pair_transition.norm.", "pair_stack.pair_transition.layer_norm."),
                  ("pair_transition.", "pair_stack.pair_transition.")]

_EVO, _EXTRA = "evoformer.blocks.{i}.", "extra_msa_stack.blocks.{i}."
PREFIXES: list[tuple[str, str]] = (
    [(_EVO + "msa_col.norm.", _EVO + "msa_att_col._msa_att.layer_norm_m."),
     (_EVO + "msa_col.attention.", _EVO + "msa_att_col._msa_att.mha."),
     (_EXTRA + "msa_col.norm.", _EXTRA + "msa_att_col.layer_norm_m."),
     (_EXTRA + "msa_col.", _EXTRA + "msa_att_col.global_attention.")]
    + [(_EVO + p, _EVO + o) for p, o in _STACK_COMMON]
    + [(_EXTRA + p, _EXTRA + o) for p, o in _STACK_COMMON]
    + [("input_embedder.", "input_embedder."),
       ("recycling_embedder.norm_m.", "recycling_embedder.layer_norm_m."),
       ("recycling_embedder.norm_z.", "recycling_embedder.layer_norm_z."),
       ("recycling_embedder.linear_d.", "recycling_embedder.linear."),
       ("extra_msa_embedder.", "extra_msa_embedder.linear."),
       ("evoformer.linear_s.", "evoformer.linear."),
       ("structure_module.norm_s.", "structure_module.layer_norm_s."),
       ("structure_module.norm_z.", "structure_module.layer_norm_z."),
       ("structure_module.linear_in.", "structure_module.linear_in."),
       ("structure_module.ipa.linear_q_pts.", "structure_module.ipa.linear_q_points.linear."),
       ("structure_module.ipa.linear_kv_pts.", "structure_module.ipa.linear_kv_points.linear."),
       ("structure_module.ipa.", "structure_module.ipa."),
       ("structure_module.norm_ipa.", "structure_module.layer_norm_ipa.")]
    + [(f"structure_module.transition.layers.{k}.", f"structure_module.transition.layers.0.linear_{k + 1}.")
       for k in range(3)]                      # OpenFold: one transition layer of 3 linears
    + [("structure_module.transition.norm.", "structure_module.transition.layer_norm."),
       ("structure_module.backbone_update.linear.", "structure_module.bb_update.linear."),
       ("structure_module.angle_resnet.blocks.{i}.0.", "structure_module.angle_resnet.layers.{i}.linear_1."),
       ("structure_module.angle_resnet.blocks.{i}.1.", "structure_module.angle_resnet.layers.{i}.linear_2."),
       ("structure_module.angle_resnet.", "structure_module.angle_resnet."),
       ("distogram_head.linear.", "aux_heads.distogram.linear."),
       ("masked_msa_head.linear.", "aux_heads.masked_msa.linear."),
       ("plddt_head.norm.", "aux_heads.plddt.layer_norm."),
       ("plddt_head.", "aux_heads.plddt."),
       ("experimentally_resolved_head.linear.", "aux_heads.experimentally_resolved.linear."),
       ("pae_head.linear.", "aux_heads.tm.linear.")])
# templates, in OpenFold v1's top-level names (OpenFold >= 2 nests them under
# `template_embedder.` and calls the angle embedder `template_single_embedder`: `_v1_name`)
_TEMPLATE_BLOCK = [(p, o.replace("pair_stack.", "")) for p, o in _STACK_COMMON
                   if p.startswith(("tri_", "pair_transition"))]
PREFIXES += (
    [("template_embedder.embedding2d.", "template_pair_embedder.linear."),
     ("template_embedder.norm.", "template_pair_stack.layer_norm."),
     ("template_embedder.pointwise.", "template_pointwise_att.mha."),
     ("template_embedder.linear_single.", "template_angle_embedder.linear_1."),
     ("template_embedder.linear_projection.", "template_angle_embedder.linear_2.")]
    + [("template_embedder.blocks.{i}." + p, "template_pair_stack.blocks.{i}." + o)
       for p, o in _TEMPLATE_BLOCK])
TEMPLATE_POINTWISE_HEADS = 4   # OpenFold's template_pointwise_attention.no_heads (no per-head tensor)


def _v1_name(key: str) -> str:
    """OpenFold >= 2 template names -> OpenFold v1's."""
    if key.startswith("template_embedder."):
        key = key[len("template_embedder."):]
        if key.startswith("template_single_embedder."):
            key = "template_angle_embedder." + key[len("template_single_embedder."):]
    return key


def _compile(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)"))


_FORWARD = [(_compile(p), o) for p, o in PREFIXES]
_BACKWARD = [(_compile(o), p) for p, o in PREFIXES]


def _rename(key: str, table) -> str | None:
    for pattern, target in table:
        m = pattern.match(key)
        if m:
            prefix = target.format(**m.groupdict()) if m.groupdict() else target
            return prefix + key[m.end():]
    return None


def to_openfold_name(key: str) -> str:
    """protdp state-dict key -> OpenFold's."""
    name = _rename(key, _FORWARD)
    if name is None:
        raise KeyError(f"no OpenFold name for protdp parameter {key}")
    return name


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """An OpenFold checkpoint's model tensors: a plain state dict, a Lightning checkpoint
    ('state_dict', keys prefixed 'model.') or an EMA file ('ema' -> 'params')."""
    path = Path(path)
    if path.is_dir():
        raise InputError("a directory, not an OpenFold checkpoint file (.pt)", path=path)
    if not path.is_file():
        raise InputError("OpenFold checkpoint not found", path=path)
    blob = load_cpu(path)          # truncated, foreign, pickled code: one clear line
    if isinstance(blob, dict) and isinstance(blob.get("ema"), dict) and "params" in blob["ema"]:
        blob = blob["ema"]["params"]
    elif isinstance(blob, dict) and isinstance(blob.get("state_dict"), dict):
        blob = blob["state_dict"]
    if not isinstance(blob, dict):
        raise InputError("expected a state dict of tensors", path=path)
    validate.check_tensors(blob, path)     # meta, sparse, integer, complex: one line naming it
    return {(k[len("model."):] if k.startswith("model.") else k): v for k, v in blob.items()}


def _skeleton_config(state: Mapping[str, torch.Tensor]) -> ModelConfig:
    """The config fields the parameter table needs (block counts, head counts, present heads),
    read from protdp-named tensor shapes."""
    def count(prefix):
        return len({int(m.group(1)) for k in state for m in [re.match(prefix + r"(\d+)\.", k)] if m})

    def shape(key):
        if key not in state:
            raise InputError("OpenFold parameter is missing", field=to_openfold_name(key))
        return tuple(state[key].shape)

    n_extra = count(r"extra_msa_stack\.blocks\.")
    msa_heads = shape("evoformer.blocks.0.msa_row.linear_b.weight")[0]
    pair_heads = shape("evoformer.blocks.0.tri_att_start.linear_b.weight")[0]
    _same_heads(state, msa_heads, "extra_msa_stack.blocks.{i}.msa_row.linear_b.weight", n_extra,
                "MSA stack")
    _same_heads(state, pair_heads, "evoformer.blocks.{i}.tri_att_end.linear_b.weight",
                count(r"evoformer\.blocks\."), "starting-node triangle attention")
    templates = {}
    if "template_embedder.embedding2d.weight" in state:
        c_t, n_feat = shape("template_embedder.embedding2d.weight")
        q = shape("template_embedder.pointwise.linear_q.weight")[0]
        heads = TEMPLATE_POINTWISE_HEADS
        templates = dict(
            templates=True, c_t=c_t, template_dgram_bins=n_feat - 49,
            template_pair_blocks=count(r"template_embedder\.blocks\."),
            template_tri_heads=shape("template_embedder.blocks.0.tri_att_start.linear_b.weight")[0],
            template_att_heads=heads, c_hidden_template_att=q // heads,
            template_torsion_angles="template_embedder.linear_single.weight" in state)
    return ModelConfig(**templates,
        n_blocks=count(r"evoformer\.blocks\."), n_extra_blocks=n_extra, extra_msa=n_extra > 0,
        msa_heads=msa_heads, pair_heads=pair_heads,
        c_z=shape("evoformer.blocks.0.opm.linear_out.weight")[0],
        c_hidden_opm=shape("evoformer.blocks.0.opm.linear_a.weight")[0],
        pae_head="pae_head.linear.weight" in state,
        sm_transition_layers=count(r"structure_module\.transition\.layers\."),
        n_resnet_blocks=count(r"structure_module\.angle_resnet\.blocks\."))


def _same_heads(state: Mapping, heads: int, key: str, blocks: int, other: str) -> None:
    """protdp shares one head count where OpenFold's file could hold two (extra-MSA vs MSA
    attention, ending- vs starting-node triangle attention): a file that differs is one line
    naming the tensor, instead of a silent re-split of its heads."""
    for i in range(blocks):
        name = key.format(i=i)
        if name in state and tuple(state[name].shape)[0] != heads:
            raise InputError(f"shape {tuple(state[name].shape)}: {state[name].shape[0]} heads, "
                             f"the {other} has {heads}; protdp uses one count",
                             field=to_openfold_name(name))


def to_alphafold_arrays(openfold_state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """OpenFold state dict -> AlphaFold npz arrays (templates kept under a marker name so the
    AlphaFold import lists them as skipped); an unknown key is one clear error."""
    state = {}
    for key, value in openfold_state.items():
        name = _rename(_v1_name(key), _BACKWARD)
        if name is None:
            raise InputError("unexpected OpenFold parameter: not part of the AF2 monomer model "
                             "(multimer and other variants are not supported)", field=key)
        state[name] = value.detach().float().numpy()
    cfg = _skeleton_config(state)
    validate.check_complete(state, _meta_model(cfg).state_dict(), to_openfold_name)
    entries = alphafold.alphafold_entries(cfg, {k: v.shape for k, v in state.items()})
    unused = sorted(set(state) - {e.torch for e in entries})
    if unused:
        raise InputError("unexpected OpenFold parameter", field=to_openfold_name(unused[0]))
    missing = [e.torch for e in entries if e.torch not in state]
    if missing:
        raise InputError("OpenFold parameter is missing", field=to_openfold_name(missing[0]))
    return alphafold.arrays_from_state(state, entries)


def openfold_names(cfg: ModelConfig, af2_keys) -> dict[str, str]:
    """AF2 key -> the OpenFold key(s) it came from (joined by ', ' where AF2 stacks blocks),
    for reports in the source's own names."""
    shapes = {k: tuple(v.shape) for k, v in _meta_model(cfg).state_dict().items()}
    out: dict[str, list[str]] = {}
    for e in alphafold.alphafold_entries(cfg, shapes):
        out.setdefault(e.af2, []).append(to_openfold_name(e.torch))
    names = {k: ", ".join(v) for k, v in out.items()}
    return {k: names.get(k, k) for k in af2_keys}


def _meta_model(cfg: ModelConfig):
    """The model on the meta device: parameter names and shapes without memory."""
    from protdp.model.model import AlphaFoldModel
    with torch.device("meta"):
        return AlphaFoldModel(cfg)


def from_alphafold_arrays(arrays: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """AlphaFold arrays of a protdp model (`cfg`) -> OpenFold state dict (float32)."""
    shapes = {k: tuple(v.shape) for k, v in _meta_model(cfg).state_dict().items()}
    entries = alphafold.alphafold_entries(cfg, shapes)
    state = alphafold.state_from_arrays(arrays, entries)
    return {to_openfold_name(k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
