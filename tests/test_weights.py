"""Weight import/export (issue 16 D4): AlphaFold npz and OpenFold state dicts <-> protdp, config
inferred from shapes at any size, import -> export -> import bit-identical, both formats giving
identical protdp parameters, clear errors naming the key, template modules mapped (issue 31), and
an imported checkpoint running `protdp predict`."""

import json

import numpy as np
import pytest
import torch

from model_fixtures import af2_reference, one_thread, tiny_config  # noqa: F401
from protdp.errors import InputError
from protdp.inference.checkpoint import load_model_checkpoint
from protdp.model import build_model
from protdp.weights import cli as weights_cli
from protdp.weights import openfold
from protdp.weights.alphafold import infer_config
from protdp.weights.convert import export_arrays, export_openfold, import_params
from protdp.inference.layout import current_prediction

PARAMS = "params/params_model_3_ptm_small.npz"


@pytest.fixture(scope="module")
def fixture_params(af2_reference):  # noqa: F811
    with np.load(af2_reference / PARAMS) as f:
        return {k: f[k] for k in f.files}


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_alphafold_round_trip_is_bit_identical(af2_reference, fixture_params, tmp_path):  # noqa: F811
    first = import_params(af2_reference / PARAMS, "alphafold", sm_layers=2, num_recycles=1)
    arrays = export_arrays(first.model)
    assert arrays.keys() == fixture_params.keys()
    for k, v in fixture_params.items():
        assert arrays[k].dtype == np.float32 and arrays[k].shape == v.shape
        assert np.array_equal(arrays[k].view(np.uint32), v.view(np.uint32)), k
    out = tmp_path / "exported.npz"
    assert weights_cli.main(["import", "--format", "alphafold", str(af2_reference / PARAMS),
                             "--out", str(tmp_path / "ck"), "--sm-layers", "2"]) == 0
    assert weights_cli.main(["export", "--format", "alphafold", str(tmp_path / "ck"), str(out)]) == 0
    second = import_params(out, "alphafold", sm_layers=2, num_recycles=1)
    _same_state(_state(first.model), _state(second.model))
    assert second.config == first.config
    # a folder as the output: one clear error before any work, nothing written beside it
    before = sorted(tmp_path.parent.iterdir())
    with pytest.raises(InputError, match="export is a directory"):
        weights_cli.main(["export", "--format", "alphafold", str(tmp_path / "ck"), str(tmp_path)])
    assert sorted(tmp_path.parent.iterdir()) == before


def test_openfold_round_trip_and_consistency_with_alphafold(af2_reference, tmp_path):  # noqa: F811
    af = import_params(af2_reference / PARAMS, "alphafold", sm_layers=2, num_recycles=1)
    state = export_openfold(af.model)
    # OpenFold's own names (openfold/utils/import_weights.py), e.g. the swapped incoming a/b
    assert "evoformer.blocks.1.pair_stack.tri_mul_in.linear_a_p.weight" in state
    assert "structure_module.ipa.linear_q_points.linear.weight" in state
    assert "aux_heads.tm.linear.weight" in state and "extra_msa_embedder.linear.weight" in state
    assert "evoformer.blocks.0.msa_att_col._msa_att.mha.linear_q.weight" in state
    assert "extra_msa_stack.blocks.0.msa_att_col.global_attention.linear_k.weight" in state
    path = tmp_path / "of.pt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}}, path)   # Lightning layout
    of = import_params(path, "openfold", sm_layers=2, num_recycles=1)
    _same_state(_state(af.model), _state(of.model))          # same weights through both formats
    assert of.config == af.config
    assert weights_cli.main(["import", "--format", "openfold", str(path), "--out", str(tmp_path / "ck"),
                             "--sm-layers", "2"]) == 0
    prov = json.loads((tmp_path / "ck" / "provenance.json").read_text())
    assert set(", ".join(prov["mapped"]).split(", ")) == set(state)   # reported in OpenFold's names
    assert weights_cli.main(["export", "--format", "openfold", str(tmp_path / "ck"), str(tmp_path / "again.pt")]) == 0
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)


@pytest.mark.parametrize("overrides", [
    dict(extra_msa=True, pae_head=True),
    dict(extra_msa=True, pae_head=False, c_ipa_v=3, n_resnet_blocks=3, sm_transition_layers=2,
         transition_n=3, relpos_k=5),
    # issue 31: a structure-module width != the single width (AF2's initial_projection), and
    # a template module of another size
    dict(extra_msa=True, pae_head=True, c_sm=24, templates=True, c_t=6, template_pair_blocks=2,
         template_tri_heads=2, c_hidden_template_tri_att=3, c_hidden_template_tri_mul=5,
         template_att_heads=4, c_hidden_template_att=3, template_transition_n=3),
])
def test_any_size_round_trips_through_both_formats(overrides, tmp_path):
    """A protdp model of another size exports, and its config comes back from the shapes."""
    cfg = tiny_config(**overrides)
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    arrays = export_arrays(model)
    inferred = infer_config({k: v.shape for k, v in arrays.items()}, sm_layers=cfg.sm_layers,
                            num_recycles=cfg.num_recycles)
    for name in ("c_m", "c_z", "c_s", "n_blocks", "msa_heads", "c_hidden_msa_att", "pair_heads",
                 "c_hidden_tri_att", "c_hidden_tri_mul", "c_hidden_opm", "transition_n", "relpos_k",
                 "c_e", "n_extra_blocks", "c_hidden_extra_att", "ipa_heads", "c_ipa",
                 "ipa_qk_points", "ipa_v_points", "sm_transition_layers", "c_resnet",
                 "n_resnet_blocks", "c_plddt", "pae_head", "extra_msa", "sm_channels",
                 "templates", "c_t", "template_pair_blocks", "template_tri_heads",
                 "c_hidden_template_tri_att", "c_hidden_template_tri_mul", "template_att_heads",
                 "c_hidden_template_att", "template_transition_n"):
        assert getattr(inferred, name) == getattr(cfg, name), name
    assert (inferred.c_ipa_v or inferred.c_ipa) == (cfg.c_ipa_v or cfg.c_ipa)
    np.savez(tmp_path / "p.npz", **arrays)
    back = import_params(tmp_path / "p.npz", "alphafold", sm_layers=cfg.sm_layers)
    _same_state(_state(model), _state(back.model))
    torch.save(export_openfold(model), tmp_path / "p.pt")
    _same_state(_state(model), _state(import_params(tmp_path / "p.pt", "openfold", sm_layers=cfg.sm_layers).model))
    from protdp.data.features import collate, featurize_query
    with torch.no_grad():                    # every width runs end to end
        out = back.model(collate([featurize_query("MKVLAAGIVG", None)]), num_recycles=0)
    assert out["sm"]["single"].shape[-1] == cfg.sm_channels and torch.isfinite(out["plddt"]).all()


def _write(tmp_path, arrays, name="p.npz"):
    np.savez(tmp_path / name, **arrays)
    return tmp_path / name


def test_bad_parameter_files_give_one_clear_error(fixture_params, tmp_path):
    key = "alphafold/alphafold_iteration/structure_module/fold_iteration/affine_update//weights"
    missing = {k: v for k, v in fixture_params.items() if k != key}
    with pytest.raises(InputError, match=f"field '{key}': AlphaFold parameter is missing"):
        import_params(_write(tmp_path, missing), "alphafold")
    bad_shape = dict(fixture_params, **{key: fixture_params[key][:, :5]})
    with pytest.raises(InputError, match=f"field '{key}': shape \\(32, 5\\), expected \\(32, 6\\)"):
        import_params(_write(tmp_path, bad_shape), "alphafold")
    stacked = "alphafold/alphafold_iteration/evoformer/evoformer_iteration/msa_transition/transition2//bias"
    with pytest.raises(InputError, match=stacked):
        import_params(_write(tmp_path, dict(fixture_params, **{stacked: fixture_params[stacked][:, :3]})),
                      "alphafold")
    unknown = dict(fixture_params, **{"alphafold/alphafold_iteration/evoformer/~_relative_encoding/"
                                      "position_activations//weights": np.zeros((73, 16), np.float32)})
    with pytest.raises(InputError, match="multimer"):
        import_params(_write(tmp_path, unknown), "alphafold")
    (tmp_path / "trunc.npz").write_bytes(_write(tmp_path, fixture_params).read_bytes()[:5000])
    with pytest.raises(InputError, match="trunc.npz: not a readable .npz"):
        import_params(tmp_path / "trunc.npz", "alphafold")
    with pytest.raises(InputError, match="parameter file not found"):
        import_params(tmp_path / "nope.npz", "alphafold")
    (tmp_path / "folder.npz").mkdir()           # a folder is named as one ('not found' before)
    with pytest.raises(InputError, match="folder.npz: a directory, not an .npz parameter file"):
        import_params(tmp_path / "folder.npz", "alphafold")
    with pytest.raises(InputError, match="folder.npz: a directory, not an OpenFold checkpoint"):
        import_params(tmp_path / "folder.npz", "openfold")
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(InputError, match="junk.pt: not a readable checkpoint"):
        import_params(tmp_path / "junk.pt", "openfold")
    torch.save({"evoformer.blocks.0.msa_att_row.nonsense.weight": torch.zeros(2)}, tmp_path / "odd.pt")
    with pytest.raises(InputError, match="unexpected OpenFold parameter"):
        import_params(tmp_path / "odd.pt", "openfold")
    with pytest.raises(SystemExit):     # argparse: one usage line, exit 2
        weights_cli.main(["import", "--format", "alphafold", "x.npz", "--out", "o", "--sm-layers", "0"])


TEMPLATE_PARAMS = "templates/params/params_model_1_ptm_templates_small.npz"


def test_template_parameters_round_trip_through_both_formats(af2_reference, tmp_path):  # noqa: F811
    """model_1/2-shaped parameters: every template array is mapped (nothing skipped), AF2 ->
    protdp -> AF2 is bit-identical, and OpenFold's v1 and v2 template names give the same model."""
    path = af2_reference / TEMPLATE_PARAMS
    with np.load(path) as f:
        source = {k: f[k] for k in f.files}
    first = import_params(path, "alphafold", sm_layers=2, num_recycles=1)
    assert first.skipped == {} and set(first.mapped) == set(source)
    assert first.config.templates and first.config.template_pair_blocks == 1
    assert first.model.num_parameters() == sum(v.size for v in source.values()) == 101758
    arrays = export_arrays(first.model)
    for k, v in source.items():
        assert np.array_equal(arrays[k].view(np.uint32), v.view(np.uint32)), k
    state = export_openfold(first.model)
    assert "template_pair_stack.blocks.0.tri_att_start.mha.linear_q.weight" in state
    torch.save(state, tmp_path / "v1.pt")
    v2 = {("template_embedder." + k.replace("template_angle_embedder.", "template_single_embedder.")
           if k.startswith("template_") else k): v for k, v in state.items()}
    torch.save(v2, tmp_path / "v2.pt")
    for name in ("v1.pt", "v2.pt"):
        of = import_params(tmp_path / name, "openfold", sm_layers=2, num_recycles=1)
        assert of.skipped == {} and of.config == first.config
        _same_state(_state(first.model), _state(of.model))


def test_incomplete_template_parameters_are_one_clear_error(fixture_params, tmp_path):
    extra = {"alphafold/alphafold_iteration/evoformer/template_single_embedding//weights":
             np.ones((57, 32), np.float32)}
    with pytest.raises(InputError, match="template_single_embedding.*without the rest"):
        import_params(_write(tmp_path, {**fixture_params, **extra}), "alphafold", sm_layers=2)


def test_openfold_names_cover_every_parameter():
    cfg = tiny_config(extra_msa=True, pae_head=True)
    names = [openfold.to_openfold_name(k) for k in build_model(cfg, verbose=False).state_dict()]
    assert len(set(names)) == len(names)


def test_imported_checkpoint_runs_predict(af2_reference, tmp_path):  # noqa: F811
    """An imported checkpoint folder is an ordinary protdp checkpoint: `protdp predict` takes it."""
    from protdp.workflows import predict

    ck = tmp_path / "ck"
    assert weights_cli.main(["import", "--format", "alphafold", str(af2_reference / PARAMS),
                             "--out", str(ck), "--sm-layers", "2", "--num-recycles", "1"]) == 0
    loaded = load_model_checkpoint(ck)
    assert loaded.kind == "model-file" and loaded.config.sm_layers == 2
    seq = (af2_reference / "inputs" / "synthetic_L40.fasta").read_text().split("\n", 1)[1].replace("\n", "")
    fasta = tmp_path / "t.fasta"
    fasta.write_text(f">syn\n{seq}\n")
    msa_dir = tmp_path / "msa"
    msa_dir.mkdir()
    (msa_dir / "syn.a3m").write_bytes((af2_reference / "inputs" / "synthetic_L40.a3m").read_bytes())
    res = predict(ck, fasta, tmp_path / "out", msa_dir=msa_dir, progress=False, release_gate="off")
    row = res.rows[0]
    assert row["status"] == "predicted", row
    pdb = (current_prediction(tmp_path / "out" / "targets" / "syn") / "syn.pdb").read_text()
    assert sum(1 for line in pdb.splitlines() if line.startswith("ATOM")) > 5 * len(seq)


def test_non_finite_parameters_are_refused(fixture_params, tmp_path):
    key = "alphafold/alphafold_iteration/predicted_lddt_head/logits//bias"
    bad = dict(fixture_params, **{key: np.full_like(fixture_params[key], np.nan)})
    with pytest.raises(InputError, match=f"field '{key}': 50 non-finite"):
        import_params(_write(tmp_path, bad), "alphafold")


@pytest.mark.parametrize("kind, reason", [
    ("text", "not a PyTorch checkpoint"), ("empty", "empty, truncated or corrupt"),
    ("truncated", "empty, truncated or corrupt"), ("pickled_object", "argparse.Namespace")])
def test_a_file_torch_cannot_load_is_one_line_naming_it(tmp_path, kind, reason):
    """OpenFold import and every checkpoint reader (predict, release, fine-tune) say in one line
    why torch.load refused the file, never torch's advice to unpickle it with weights_only=False."""
    import argparse

    from protdp.train.checkpointing import read_any_weights
    path = tmp_path / f"{kind}.pt"
    if kind == "text":
        path.write_text(">a\nMKV\n")
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"w": torch.zeros(4096), "args": argparse.Namespace(lr=1)}, path)
        if kind == "truncated":
            path.write_bytes(path.read_bytes()[:2000])
    for read in (lambda: import_params(path, "openfold"), lambda: read_any_weights(path)):
        with pytest.raises(InputError) as err:
            read()
        message = str(err.value)
        assert message.startswith(str(path)) and reason in message, message
        assert "\n" not in message and "weights_only" not in message



def _huge_header_npz(path, good: np.ndarray, key="w"):
    """An .npz whose one member's header declares a 2**40-element shape over few bytes."""
    import io
    import zipfile
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": (1 << 20, 1 << 20)})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(key + ".npy", buf.getvalue() + good.astype("<f4").tobytes())
    return path


def test_hostile_parameter_files_are_one_line_naming_key_and_file(fixture_params, tmp_path):
    """Issue 28: removing any one key of a valid OpenFold export, meta / sparse / integer /
    complex tensors, object or 0-d arrays, a header declaring a huge shape and duplicate zip
    members are each one InputError naming the file and the key (main: KeyError, TypeError,
    accepted, MemoryError, IndexError, silently the last member)."""
    import warnings
    import zipfile
    torch.manual_seed(0)
    cfg = tiny_config()
    state = export_openfold(build_model(cfg, verbose=False))
    pt = tmp_path / "of.pt"
    for i, key in enumerate(sorted(state)):
        if i % 20:                 # every 20th key keeps the test short; all pass the same path
            continue
        torch.save({k: v for k, v in state.items() if k != key}, pt)
        with pytest.raises(InputError) as exc:
            import_params(pt, "openfold", sm_layers=cfg.sm_layers)
        assert str(exc.value).startswith(str(pt)) and "field '" in str(exc.value), str(exc.value)
    victim = sorted(state)[3]
    bad_values = {"meta": torch.empty(state[victim].shape, device="meta"),
                  "sparse": state[victim].to_sparse() if state[victim].dim() else None,
                  "dtype torch.int64": state[victim].long(),
                  "dtype torch.complex64": state[victim].to(torch.complex64)}
    for why, value in bad_values.items():
        torch.save(dict(state, **{victim: value}), pt)
        with pytest.raises(InputError, match=f"{pt}: field '{victim}': .*{why}"):
            import_params(pt, "openfold", sm_layers=cfg.sm_layers)
    key = sorted(fixture_params)[0]
    for why, arrays in (("dtype int32", dict(fixture_params, **{key: fixture_params[key].astype(np.int32)})),
                        ("dtype complex64", dict(fixture_params, **{key: fixture_params[key].astype(np.complex64)})),
                        ("0-d", dict(fixture_params, **{key: np.float32(1.0)}))):
        with pytest.raises(InputError, match=f"field '{key}': .*{why}"):
            import_params(_write(tmp_path, arrays), "alphafold")
    buf = tmp_path / "obj.npz"
    np.savez(buf, **{key: np.array([{"a": 1}], dtype=object)})
    with pytest.raises(InputError, match=f"obj.npz: field '{key}': dtype object"):
        import_params(buf, "alphafold")
    huge = _huge_header_npz(tmp_path / "huge.npz", np.zeros(4))
    with pytest.raises(InputError, match="huge.npz: field 'w': header declares shape"):
        import_params(huge, "alphafold")
    dup = _write(tmp_path, fixture_params, "dup.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # zipfile: "Duplicate name"
        with zipfile.ZipFile(dup, "a") as zf:
            zf.writestr(key + ".npy", zf.read(key + ".npy"))
    with pytest.raises(InputError, match=f"dup.npz: field '{key}': .*twice"):
        import_params(dup, "alphafold")
