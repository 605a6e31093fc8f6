"""AlphaFold-Multimer fixture B (`tests/data/af2_multimer_b`, issue 42): DeepMind's JAX
AlphaFold v2.3.2 with every width distinct (structure-module num_channel 32 beside seq_channel
40, MSA 24, pair 20, extra MSA 12, template 10, 3 MSA heads, IPA 3 heads x 5 / 7 scalars and
2 / 4 points, ...), on a heterotrimer with a repeated chain (A2B) and a homodimer with zero
templates. protdp imports it with `protdp weights import`, exports it back bit for bit, and
reproduces AlphaFold's atoms, pLDDT, pTM and ipTM within the float32 targets (final atoms
1e-3 Å, pLDDT 0.01, pTM / ipTM 1e-4) driven by AlphaFold's recorded MSA sampling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model_fixtures import one_thread  # noqa: F401
from protdp.weights import cli as weights_cli
from protdp.weights.multimer_checkpoint import load_multimer
from protdp.weights.store import read_npz

FIXTURE = Path(__file__).parent / "data" / "af2_multimer_b"
PARAMS = FIXTURE / "params" / "params_model_1_multimer_v3_small_b.npz"
CONFIG = FIXTURE / "config_model_1_multimer_v3_small_b.json"
TRIMER, NO_TEMPLATES = "A2B_hbA1-36x2_hbB1-40", "2p90_A02_x2_no_templates"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("mmb") / "ckpt"
    assert weights_cli.main(["import", "--format", "alphafold", str(PARAMS), "--out", str(out),
                             "--alphafold-config", str(CONFIG)]) == 0
    return out, load_multimer(out)


def _case(name):
    f = {k: torch.from_numpy(np.asarray(v)) for k, v in np.load(FIXTURE / f"features_{name}.npz").items()}
    rec = np.load(FIXTURE / f"sampled_msa_{name}.npz")
    return f, rec, np.load(FIXTURE / f"outputs_{name}.npz")


def _diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def test_every_width_is_read_from_its_own_array(model):
    cfg = model[1].config
    t = cfg.trunk
    assert (t.c_s, t.sm_channels) == (40, 32)                    # the two widths
    assert (t.c_m, t.c_z, t.c_e, t.c_hidden_opm, t.c_hidden_tri_mul) == (24, 20, 12, 6, 14)
    assert (t.msa_heads, t.c_hidden_msa_att, t.c_hidden_extra_att) == (3, 8, 4)
    assert (t.ipa_heads, t.c_ipa, t.c_ipa_v, t.ipa_qk_points, t.ipa_v_points) == (3, 5, 7, 2, 4)
    assert (t.c_resnet, t.c_plddt, t.sm_layers, t.num_recycles) == (18, 22, 2, 1)
    assert (cfg.c_t, cfg.c_hidden_template_mul, cfg.template_heads) == (10, 6, 2)


def test_npz_round_trip_is_bit_identical(model, tmp_path):
    ckpt, _ = model
    out = tmp_path / "exported.npz"
    assert weights_cli.main(["export", "--format", "alphafold", str(ckpt), str(out)]) == 0
    source, again = read_npz(PARAMS), read_npz(out)
    assert sorted(source) == sorted(again)
    for k, v in source.items():
        assert again[k].dtype == v.dtype == np.float32 and again[k].shape == v.shape, k
        assert np.array_equal(again[k].view(np.uint32), v.view(np.uint32)), k


def _replay_unit_diagonal(monkeypatch, f, diag):
    """AlphaFold's rounding noise on the diagonal of the template backbone unit vectors,
    recorded in the same run (see tests/test_multimer_model.py `_alphafold_unit_diagonal`)."""
    from protdp.model.multimer import template as multimer_template
    from protdp.weights.compare_multimer import with_unit_diagonal

    monkeypatch.setattr(multimer_template, "backbone_unit_vectors", with_unit_diagonal(
        multimer_template.backbone_unit_vectors, diag, f["template_all_atom_positions"]))


@pytest.mark.parametrize("name", [TRIMER, NO_TEMPLATES])
def test_alphafold_outputs_within_the_float32_targets(model, name, monkeypatch):
    f, rec, ref = _case(name)
    chains = sorted(set(f["asym_id"].tolist()))
    templates = int((f["template_all_atom_mask"].sum((1, 2)) > 0).sum())
    if name == TRIMER:     # three chains, two of them copies of one entity; real templates
        assert len(chains) == 3 and sorted(set(f["entity_id"].tolist())) == [1.0, 2.0]
        assert templates == 4 and float(np.linalg.norm(rec["template_unit_diagonal"], axis=-1).max()) > 0.5
        _replay_unit_diagonal(monkeypatch, f, rec["template_unit_diagonal"])
    else:                  # zero templates: AlphaFold's all-masked placeholders only
        assert len(chains) == 2 and templates == 0
        assert float(np.abs(rec["template_unit_diagonal"]).max()) == 0.0
    orders = [torch.from_numpy(o).long() for o in rec["index_order"]]
    with torch.no_grad():
        out = model[1](f, orders=orders)
    assert out["num_recycles"] == int(ref["num_recycles"]) == 1
    assert _diff(out["final_atom_positions"], ref["structure_module/final_atom_positions"]) < 1e-3
    assert _diff(out["plddt"], ref["confidence/plddt"]) < 1e-2
    assert _diff(out["ptm"], ref["confidence/ptm"]) < 1e-4
    assert _diff(out["iptm"], ref["confidence/iptm"]) < 1e-4
    assert _diff(out["single"], ref["representations/single"]) < 1e-3
    assert _diff(out["sm"]["single"], ref["representations/structure_module"]) < 1e-3
