"""protdp runs AlphaFold2's own parameters and gives AlphaFold2's own answers (issue 16 D7):
the DeepMind JAX fixture's random `model_3_ptm` (small) imported with `protdp weights import`,
run with `protdp weights compare` on AlphaFold's processed features, in float32 and float64,
against AlphaFold's outputs (all-atom positions, pLDDT, PAE, pTM, every logits tensor, single /
pair / MSA representations). The max differences are printed (pytest -s shows them)."""

import json

import numpy as np
import pytest
import torch

from model_fixtures import AF2_CASES, af2_reference, one_thread  # noqa: F401
from protdp.errors import InputError
from protdp.weights import cli as weights_cli

PARAMS = "params/params_model_3_ptm_small.npz"


@pytest.fixture(scope="module")
def imported(af2_reference, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("af2") / "ckpt"
    rc = weights_cli.main(["import", "--format", "alphafold", str(af2_reference / PARAMS), "--out",
                           str(out), "--alphafold-config",
                           str(af2_reference / "config_model_3_ptm_small.json")])
    assert rc == 0
    return out


def _compare(capsys, ckpt, root, case, dtype, reference=None):
    rc = weights_cli.main(["compare", "--checkpoint", str(ckpt), "--features",
                           str(root / f"features_{case}.npz"), "--reference",
                           str(reference or root / f"outputs_{case}.npz"), "--dtype", dtype])
    result = json.loads(capsys.readouterr().out)
    return rc, result


def test_import_maps_every_parameter(imported, af2_reference):  # noqa: F811
    prov = json.loads((imported / "provenance.json").read_text())
    with np.load(af2_reference / PARAMS) as params:
        keys, values = set(params.files), sum(params[k].size for k in params.files)
    assert set(prov["mapped"]) == keys and prov["skipped"] == {}
    assert prov["protdp_parameters"] == prov["source_parameters"] == values == 95374
    cfg = prov["model_config"]
    assert (cfg["c_m"], cfg["c_z"], cfg["c_s"], cfg["n_blocks"], cfg["n_extra_blocks"]) == (32, 16, 32, 2, 1)
    assert (cfg["c_ipa"], cfg["c_ipa_v"], cfg["ipa_qk_points"], cfg["ipa_v_points"]) == (8, 6, 2, 3)
    assert cfg["sm_layers"] == 2 and cfg["num_recycles"] == 1 and cfg["pae_head"]
    assert "template-free" in prov["templates"] and not cfg["templates"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", AF2_CASES)
def test_outputs_match_alphafold(imported, af2_reference, capsys, case, dtype):  # noqa: F811
    rc, result = _compare(capsys, imported, af2_reference, case, dtype)
    with capsys.disabled():
        print(f"\n{case} {dtype}: " + ", ".join(f"{k} {v:.2e}" for k, v in sorted(result["max_abs_diff"].items())))
    assert rc == 0 and result["within_tolerance"], result["failed"]
    assert result["not_compared"] == [] and result["num_recycles"] == 1 and result["msa_samples"] == 2
    diffs = result["max_abs_diff"]
    # the targets (fp32): atoms <= 1e-3 Å, pLDDT <= 0.01, pTM <= 1e-4, representations
    # <= 1e-4 relative; measured well inside them, so keep a margin that still catches drift
    assert diffs["final_atom_positions"] < 2e-4 and diffs["plddt"] < 1e-3 and diffs["ptm"] < 1e-5
    assert max(result["max_rel_diff"].values()) < 1e-5


def test_compare_fails_on_a_perturbed_weight(imported, af2_reference, capsys, tmp_path):  # noqa: F811
    """The check can fail: one structure-module weight moved by 1e-2 breaks the positions."""
    blob = torch.load(imported / "model.pt", weights_only=True)
    blob["state_dict"]["structure_module.backbone_update.linear.weight"] += 1e-2
    bad = tmp_path / "bad.pt"
    torch.save(blob, bad)
    rc, result = _compare(capsys, bad, af2_reference, "2p90_A02", "float32")
    assert rc == 1 and not result["within_tolerance"]
    assert "final_atom_positions" in result["failed"]


def test_compare_rejects_bad_inputs(imported, af2_reference, tmp_path):  # noqa: F811
    with np.load(af2_reference / "features_2p90_A02.npz") as f:
        feats = {k: f[k] for k in f.files if k != "msa_feat"}
    np.savez(tmp_path / "nofeat.npz", **feats)
    with pytest.raises(InputError, match=r"nofeat.npz.*msa_feat"):
        weights_cli.main(["compare", "--checkpoint", str(imported), "--features",
                          str(tmp_path / "nofeat.npz"), "--reference",
                          str(af2_reference / "outputs_2p90_A02.npz")])
    (tmp_path / "junk.npz").write_bytes(b"\0" * 100)
    with pytest.raises(InputError, match="junk.npz: not an .npz features file") as exc:
        weights_cli.main(["compare", "--checkpoint", str(imported), "--features",
                          str(tmp_path / "junk.npz"), "--reference", str(tmp_path / "junk.npz")])
    assert "pickle" not in str(exc.value)     # np.load's advice to unpickle it is not passed on
    np.save(tmp_path / "plain.npy", np.zeros(3))   # one .npy named .npz: was a TypeError
    (tmp_path / "plain.npy").rename(tmp_path / "plain.npz")
    ref = str(af2_reference / "outputs_2p90_A02.npz")
    for bad, why in (("plain.npz", "not an .npz features file"),
                     ("", "a directory, not an .npz features file"),
                     ("nope.npz", "features file not found")):
        with pytest.raises(InputError, match=why):
            weights_cli.main(["compare", "--checkpoint", str(imported), "--features",
                              str(tmp_path / bad), "--reference", ref])
    feats_ok = str(af2_reference / "features_2p90_A02.npz")
    with pytest.raises(InputError, match="plain.npz: not an .npz reference outputs file"):
        weights_cli.main(["compare", "--checkpoint", str(imported), "--features", feats_ok,
                          "--reference", str(tmp_path / "plain.npz")])
    with pytest.raises(InputError, match="--sampled-msa is for AlphaFold-Multimer checkpoints"):
        weights_cli.main(["compare", "--checkpoint", str(imported), "--features", feats_ok,
                          "--reference", ref, "--sampled-msa", feats_ok])


def test_protdp_features_from_raw_inputs_reproduce_alphafold(imported, af2_reference):  # noqa: F811
    """End to end through protdp's own feature pipeline: the synthetic case's raw MSA (5 rows:
    all cluster centres, so the only randomness left is the order of rows 1-4, to which the
    model is equivariant) featurized by protdp, run by the imported model, gives AlphaFold's
    outputs; the masked-MSA logits match row by row once rows are matched by content."""
    from protdp.data.features import featurize
    from protdp.data.residues import HHBLITS_TO_ID
    from protdp.inference.checkpoint import load_model_checkpoint

    raw = np.load(af2_reference / "raw_features_synthetic_L40.npz")
    ref = np.load(af2_reference / "outputs_synthetic_L40.npz")
    feats = np.load(af2_reference / "features_synthetic_L40.npz")
    L = raw["aatype"].shape[0]
    family = {"msa": HHBLITS_TO_ID[raw["msa"]], "deletion_matrix": raw["deletion_matrix_int"],
              "residue_index": raw["residue_index"], "sequence": raw["sequence"][0].decode(),
              "all_atom_positions": np.zeros((L, 37, 3), np.float32),
              "all_atom_mask": np.zeros((L, 37), np.float32), "family_id": "synthetic_L40"}
    ex = featurize(family, crop_size=None, max_msa_rows=16, seed=0, training=False,
                   max_extra_msa_rows=32, msa_samples=2)
    model = load_model_checkpoint(imported).model
    with torch.no_grad():
        out = model(ex, num_recycles=1)
    mask = ref["structure_module/final_atom_mask"][..., None]
    assert np.abs((out["final_atom_positions"].numpy() - ref["structure_module/final_atom_positions"]) * mask).max() < 2e-4
    assert np.abs(out["plddt"].numpy() - ref["confidence/plddt"]).max() < 1e-3
    assert abs(float(out["ptm"]) - float(ref["confidence/ptm"])) < 1e-5
    for ours, theirs in (("pair", "representations/pair"), ("single", "representations/single")):
        assert np.abs(out[ours].numpy() - ref[theirs]).max() < 1e-4 * np.abs(ref[theirs]).max()
    theirs = {feats["true_msa"][1, r].tobytes(): r for r in range(5)}
    for r, row in enumerate(ex["true_msa"][1].numpy().astype(np.int32)):
        diff = out["masked_msa_logits"][r].numpy() - ref["masked_msa/logits"][theirs[row.tobytes()]]
        assert np.abs(diff).max() < 1e-4
