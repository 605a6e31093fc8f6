"""`protdp weights import` when AlphaFold's config and the arrays disagree (issue 42 D4): one
line naming the array, the shape it has and the shape the config implies; a missing or unread
array is one error naming it. AlphaFold-Multimer and AlphaFold2 (with templates) fixtures."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from model_fixtures import af2_reference  # noqa: F401
from protdp.errors import InputError
from protdp.weights import cli as weights_cli
from protdp.weights.store import write_npz

EVO = "alphafold/alphafold_iteration/evoformer/"


def _config(src, tmp_path, edit) -> str:
    data = json.loads(src.read_text())
    edit(data["config"]["model"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def _import(params, tmp_path, config) -> None:
    weights_cli.main(["import", "--format", "alphafold", str(params), "--out",
                      str(tmp_path / "ckpt"), "--alphafold-config", config])


def _set(path: str, value):
    def edit(model):
        node = model
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


MULTIMER_CASES = [
    # (config key, value, the array named, its shape, the shape the config implies)
    ("heads.structure_module.num_channel", 40,
     "structure_module/initial_projection//weights", (32, 32), (32, 40)),
    ("embeddings_and_evoformer.seq_channel", 24,
     "evoformer/single_activations//weights", (32, 32), (32, 24)),
    ("embeddings_and_evoformer.evoformer_num_block", 3,
     "evoformer_iteration/msa_row_attention_with_pair_bias/query_norm//scale", (2, 32), (3, 32)),
    ("embeddings_and_evoformer.evoformer.msa_row_attention_with_pair_bias.num_head", 2,
     "extra_msa_stack/msa_row_attention_with_pair_bias//feat_2d_weights", (1, 16, 4), (1, 16, 2)),
    ("embeddings_and_evoformer.evoformer.triangle_multiplication_outgoing"
     ".num_intermediate_channel", 10,
     "extra_msa_stack/triangle_multiplication_outgoing/center_norm//scale", (1, 12), (1, 10)),
    ("heads.structure_module.num_point_v", 5,
     "invariant_point_attention/output_projection//weights", (136, 32), (168, 32)),
    ("embeddings_and_evoformer.template.num_channels", 6,
     "single_template_embedding/template_pair_embedding_0//weights", (39, 8), (39, 6)),
]


@pytest.mark.parametrize("key,value,array,has,implied", MULTIMER_CASES,
                         ids=[c[0].rsplit(".", 1)[-1] for c in MULTIMER_CASES])
def test_multimer_config_that_disagrees_names_array_and_both_shapes(af2_reference, tmp_path,  # noqa: F811
                                                                    key, value, array, has, implied):
    fixture = af2_reference / "multimer"
    params = fixture / "params" / "params_model_1_multimer_v3_small.npz"
    config = _config(fixture / "config_model_1_multimer_v3_small.json", tmp_path, _set(key, value))
    with pytest.raises(InputError) as err:
        _import(params, tmp_path, config)
    msg = str(err.value)
    assert re.search(re.escape(array) + r"'?: shape " + re.escape(str(has)) + r", expected "
                     + re.escape(str(implied)) + " from the configuration", msg), msg
    assert str(params) in msg and "\n" not in msg
    assert not (tmp_path / "ckpt").exists()


def test_multimer_missing_and_unread_arrays_are_one_error_naming_them(af2_reference, tmp_path):  # noqa: F811
    fixture = af2_reference / "multimer"
    with np.load(fixture / "params" / "params_model_1_multimer_v3_small.npz") as f:
        arrays = {k: f[k] for k in f.files}
    config = str(fixture / "config_model_1_multimer_v3_small.json")
    ipa = "alphafold/alphafold_iteration/structure_module/fold_iteration/invariant_point_attention/"
    for edit, pattern in (
            (lambda a: a.pop(ipa + "v_scalar_projection//weights"),
             r"v_scalar_projection//weights'?: AlphaFold parameter is missing"),
            (lambda a: a.pop(EVO + "template_embedding/single_template_embedding/"
                                   "template_embedding_iteration/triangle_multiplication_incoming/"
                                   "gate//bias"),
             r"triangle_multiplication_incoming/gate//bias'?: AlphaFold parameter is missing"),
            (lambda a: a.__setitem__(EVO + "evoformer_iteration/extra//weights",
                                     np.ones((2, 3), np.float32)),
             r"evoformer_iteration/extra//weights'?: unexpected AlphaFold-Multimer parameter")):
        changed = dict(arrays)
        edit(changed)
        path = tmp_path / "p.npz"
        write_npz(path, changed)
        with pytest.raises(InputError, match=pattern):
            _import(path, tmp_path, config)
    # a fused projection of the wrong width, no config given: the array and both shapes
    bad = dict(arrays)
    key = EVO + "extra_msa_stack/triangle_multiplication_outgoing/projection//weights"
    bad[key] = bad[key][..., :20]
    write_npz(tmp_path / "p.npz", bad)
    with pytest.raises(InputError, match=re.escape(key) + r"'?: shape \(1, 16, 20\), expected "
                                         r"\(1, 16, 24\)"):
        weights_cli.main(["import", "--format", "alphafold", str(tmp_path / "p.npz"), "--out",
                          str(tmp_path / "ckpt")])


def test_monomer_config_that_disagrees_names_array_and_both_shapes(af2_reference, tmp_path):  # noqa: F811
    fixture = af2_reference / "templates"
    params = fixture / "params" / "params_model_1_ptm_templates_small.npz"
    src = fixture / "config_model_1_ptm_templates_small.json"
    for key, value, array, has, implied in (
            ("heads.structure_module.num_channel", 24,
             "structure_module/initial_projection//weights", (32, 32), (32, 24)),
            ("embeddings_and_evoformer.template.attention.num_head", 2,
             "template_embedding/attention//query_w", (16, 4, 4), (16, 2, 8)),
            ("embeddings_and_evoformer.template.template_pair_stack.num_block", 2,
             "triangle_attention_starting_node/query_norm//scale", (1, 8), (2, 8))):
        with pytest.raises(InputError) as err:
            _import(params, tmp_path, _config(src, tmp_path, _set(key, value)))
        assert re.search(re.escape(array) + r"'?: shape " + re.escape(str(has)) + ", expected "
                         + re.escape(str(implied)), str(err.value)), str(err.value)
    # the config that made the file agrees with it
    weights_cli.main(["import", "--format", "alphafold", str(params), "--out",
                      str(tmp_path / "ok"), "--alphafold-config", str(src)])
    assert (tmp_path / "ok" / "provenance.json").is_file()


def test_openfold_head_counts_protdp_cannot_hold_are_named(tmp_path):
    """An OpenFold file whose extra-MSA (or ending-node triangle) attention has another head
    count than the MSA (starting-node) attention: one line naming the OpenFold tensor, not a
    silent re-split of the heads."""
    import torch

    from model_fixtures import tiny_config
    from protdp.model.model import AlphaFoldModel
    from protdp.weights.convert import export_openfold, import_params

    state = export_openfold(AlphaFoldModel(tiny_config(extra_msa=True)))
    for key in ("extra_msa_stack.blocks.0.msa_att_row.linear_z.weight",
                "evoformer.blocks.1.pair_stack.tri_att_end.linear.weight"):
        bad = dict(state)
        bad[key] = torch.zeros(3, bad[key].shape[1])
        torch.save(bad, tmp_path / "of.pt")
        with pytest.raises(InputError, match=re.escape(key) + r"'?: shape \(3, 8\): 3 heads, the "):
            import_params(tmp_path / "of.pt", "openfold")
