"""Template embedding gives AlphaFold's own answers (issue 31 D3): the DeepMind JAX fixture's
random `model_1_ptm`-shaped parameters (template pair stack, pointwise attention, torsion rows)
imported with `protdp weights import`, run with `protdp weights compare` on AlphaFold's
processed features with templates (4 templates incl. a gapped one, 1 template, AlphaFold's
all-zero placeholder when none is found) against AlphaFold's outputs."""

import json

import numpy as np
import pytest
import torch

from model_fixtures import af2_reference, one_thread  # noqa: F401
from protdp.model.template import _r3_torsion_sin_cos, template_torsion_angles
from protdp.weights import cli as weights_cli

ROOT = "templates"
PARAMS = "templates/params/params_model_1_ptm_templates_small.npz"
CASES = ("4hhb_A_1-64", "4hhb_B_1-61", "2q2k_A")


@pytest.fixture(scope="module")
def imported(af2_reference, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("af2t") / "ckpt"
    assert weights_cli.main(["import", "--format", "alphafold", str(af2_reference / PARAMS), "--out",
                             str(out), "--alphafold-config",
                             str(af2_reference / ROOT / "config_model_1_ptm_templates_small.json")]) == 0
    return out


def _compare(capsys, ckpt, root, case, dtype="float32"):
    rc = weights_cli.main(["compare", "--checkpoint", str(ckpt), "--features",
                           str(root / f"features_{case}.npz"), "--reference",
                           str(root / f"outputs_{case}.npz"), "--dtype", dtype])
    return rc, json.loads(capsys.readouterr().out)


def test_import_maps_every_template_parameter(imported):
    prov = json.loads((imported / "provenance.json").read_text())
    assert prov["skipped"] == {} and prov["protdp_parameters"] == prov["source_parameters"] == 101758
    cfg = prov["model_config"]
    assert cfg["templates"] and cfg["template_torsion_angles"] and not cfg["template_unit_vector"]
    assert (cfg["c_t"], cfg["template_pair_blocks"], cfg["template_tri_heads"],
            cfg["c_hidden_template_tri_att"], cfg["template_att_heads"],
            cfg["c_hidden_template_att"], cfg["template_transition_n"]) == (8, 1, 2, 4, 4, 4, 2)


@pytest.mark.parametrize("case", CASES)
def test_outputs_with_templates_match_alphafold(imported, af2_reference, capsys, case):  # noqa: F811
    rc, result = _compare(capsys, imported, af2_reference / ROOT, case)
    d = result["max_abs_diff"]
    with capsys.disabled():
        print(f"\n{case}: positions {d['final_atom_positions']:.1e} Å, pLDDT {d['plddt']:.1e}, "
              f"pTM {d['ptm']:.1e}")
    assert rc == 0 and result["within_tolerance"], result["failed"]
    assert result["not_compared"] == []
    # the targets: 1e-3 Å, 0.01, 1e-4; measured ~5e-5 / 2e-5 / 4e-8
    assert d["final_atom_positions"] < 2e-4 and d["plddt"] < 1e-3 and d["ptm"] < 1e-5
    assert max(result["max_rel_diff"].values()) < 1e-5


def test_float64_model_keeps_alphafold_float32_torsion_features(imported, af2_reference, capsys):  # noqa: F811
    rc, result = _compare(capsys, imported, af2_reference / ROOT, "4hhb_B_1-61", "float64")
    assert rc == 0 and result["max_abs_diff"]["final_atom_positions"] < 2e-4


def test_torsions_match_the_dihedral_definition_and_degenerate_ones_follow_af2_rounding(af2_reference):  # noqa: F811
    """Real torsions equal the textbook dihedral; a torsion after a gap (previous residue all
    zeros) is rounding noise whose direction AlphaFold's fused float32 arithmetic fixes: plain
    float32 (no fused multiply-add) gives another direction (that is what broke the outputs)."""
    f = np.load(af2_reference / ROOT / "features_4hhb_B_1-61.npz")
    aatype = torch.tensor(f["template_aatype"][0, :1]).long()
    pos = torch.tensor(f["template_all_atom_positions"][0, :1])
    mask = torch.tensor(f["template_all_atom_masks"][0, :1])
    tors = template_torsion_angles(aatype, pos, mask)
    p = pos[0].double().numpy()

    def dihedral(a, b, c, d):
        b1 = (c - b) / np.linalg.norm(c - b)
        v, w = (a - b) - np.dot(a - b, b1) * b1, (d - c) - np.dot(d - c, b1) * b1
        return np.arctan2(np.dot(np.cross(b1, v), w), np.dot(v, w))

    for i in range(6, 40):
        phi = dihedral(p[i - 1, 2], p[i, 0], p[i, 1], p[i, 2])
        assert np.allclose(tors["sin_cos"][0, i, 1].numpy(), [np.sin(phi), np.cos(phi)], atol=1e-5)
    # residue 4 follows a gap: omega is masked but its (noise) value enters the features
    assert tors["mask"][0, 4, 0] == 0
    atoms = torch.stack([torch.zeros(3), torch.zeros(3), pos[0, 4, 0], pos[0, 4, 1]])
    fused = _r3_torsion_sin_cos(atoms[None])[0]
    plain = _r3_torsion_sin_cos(atoms[None].double())[0]           # no fused rounding
    assert torch.allclose(fused, tors["sin_cos"][0, 4, 0])
    assert (fused.double() - plain).abs().max() > 1e-2


def test_full_size_template_module_has_alphafold_parameter_count():
    """AF2's model_1/2 template arrays hold 329,408 values (full-size defaults); the planner's
    count (modules built on the meta device) follows."""
    from protdp.model.config import ModelConfig
    from protdp.model.template import TemplateEmbedder
    with torch.device("meta"):
        module = TemplateEmbedder(ModelConfig(extra_msa=True, templates=True))
    assert sum(p.numel() for p in module.parameters()) == 329408
