"""`protdp weights compare` on AlphaFold-Multimer checkpoints (protdp.weights.compare_multimer,
issue 46 D4), against DeepMind's AlphaFold v2.3.2 multimer fixture (`af2_reference/multimer`):
the imported checkpoint, AlphaFold's np_example, AlphaFold's recorded in-model MSA sampling and
AlphaFold's outputs must agree within the project's float32 targets (compare.CHECKS: atoms
1e-3 Å, pLDDT 0.01, pTM / ipTM 1e-4); a perturbed checkpoint or reference must fail naming the
output; the same check passes from a ColabFold complex a3m of the fixture's rows."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from model_fixtures import one_thread  # noqa: F401
from protdp.cli import main as protdp_main
from protdp.complex.colabfold_a3m import (chain_inputs_from_a3m, complex_a3m_from_chains,
                                           read_complex_a3m, write_complex_a3m)
from protdp.complex.features import complex_features
from protdp.complex.pair_modes import apply_pair_mode
from protdp.weights.compare_multimer import MULTIMER_CHECKS
from test_multimer_model import CONFIG, PARAMS, UNIT_DIAGONAL
from test_complex_pairing import CASES, FIXTURE, _chain


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("mmcompare") / "ckpt"
    assert protdp_main(["weights", "import", "--format", "alphafold", str(PARAMS), "--out",
                        str(out), "--alphafold-config", str(CONFIG)]) == 0
    return out


def _sampling(name, tmp_path, with_diagonal=True):
    """AlphaFold's recorded sampling of the case, plus (as fixture B records it in the same
    file) AlphaFold's template unit-vector diagonal of the same run (tests/data)."""
    rec = np.load(FIXTURE / f"sampled_msa_{name}.npz")
    arrays = {"index_order": rec["index_order"]}
    if with_diagonal:
        arrays["template_unit_diagonal"] = np.load(UNIT_DIAGONAL)[name]
    path = tmp_path / f"sampled_{name}.npz"
    np.savez(path, **arrays)
    return path


def _compare(capsys, checkpoint, features, reference, sampled=None):
    argv = ["weights", "compare", "--checkpoint", str(checkpoint), "--features", str(features),
            "--reference", str(reference)]
    if sampled is not None:
        argv += ["--sampled-msa", str(sampled)]
    capsys.readouterr()
    rc = protdp_main(argv)
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc in (0, 1) else out.err)


def test_targets_are_the_monomer_compare_definition():
    tol = {c.name: c.tolerance for c in MULTIMER_CHECKS}
    assert (tol["final_atom_positions"], tol["plddt"], tol["ptm"], tol["iptm"]) == \
        (1e-3, 0.01, 1e-4, 1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compare_passes_on_every_shared_multimer_case(checkpoint, name, tmp_path, capsys):
    rc, report = _compare(capsys, checkpoint, FIXTURE / f"features_{name}.npz",
                          FIXTURE / f"outputs_{name}.npz", _sampling(name, tmp_path))
    assert rc == 0 and report["within_tolerance"] and report["failed"] == [], report["failed"]
    assert report["kind"] == "alphafold_multimer" and report["not_compared"] == []
    diff = report["max_abs_diff"]
    assert diff["final_atom_positions"] < 1e-3 and diff["plddt"] < 0.01
    assert diff["ptm"] < 1e-4 and diff["iptm"] < 1e-4
    assert report["recycles_run"] == 1 and report["template_unit_diagonal"] == "replayed"


def test_without_alphafold_template_noise_the_atoms_fail_and_the_report_says_why(
        checkpoint, tmp_path, capsys):
    name = "4hhb_hbA1-36_hbB1-40"
    rc, report = _compare(capsys, checkpoint, FIXTURE / f"features_{name}.npz",
                          FIXTURE / f"outputs_{name}.npz",
                          _sampling(name, tmp_path, with_diagonal=False))
    assert rc == 1 and "final_atom_positions" in report["failed"]
    assert report["max_abs_diff"]["final_atom_positions"] > 0.1
    assert "template_unit_diagonal" in report["note"]


def test_without_recorded_sampling_compare_refuses_naming_the_flag(checkpoint, capsys):
    name = "2p90_A02_x2"
    rc, err = _compare(capsys, checkpoint, FIXTURE / f"features_{name}.npz",
                       FIXTURE / f"outputs_{name}.npz")
    assert rc == 2 and "--sampled-msa" in err and len(err.strip().splitlines()) == 1


def test_perturbed_reference_fails_naming_the_key(checkpoint, tmp_path, capsys):
    name = "2p90_A02_x2"
    ref = dict(np.load(FIXTURE / f"outputs_{name}.npz"))
    ref["structure_module/final_atom_positions"][5, 1, 0] += 2e-3      # CA, over 1e-3 Å
    ref["confidence/iptm"] = ref["confidence/iptm"] + 2e-4
    np.savez(tmp_path / "outputs.npz", **ref)
    rc, report = _compare(capsys, checkpoint, FIXTURE / f"features_{name}.npz",
                          tmp_path / "outputs.npz", _sampling(name, tmp_path))
    assert rc == 1 and not report["within_tolerance"]
    assert sorted(report["failed"]) == ["final_atom_positions", "iptm"]


def test_perturbed_checkpoint_fails(checkpoint, tmp_path, capsys):
    name = "4hhb_hbA1-36_hbB1-40"
    bad = tmp_path / "ckpt"
    shutil.copytree(checkpoint, bad)
    blob = torch.load(bad / "multimer_model.pt", weights_only=True)
    key = next(k for k in blob["state_dict"] if "structure_module" in k and k.endswith("weight"))
    blob["state_dict"][key] = blob["state_dict"][key] * 1.01
    torch.save(blob, bad / "multimer_model.pt")
    rc, report = _compare(capsys, bad, FIXTURE / f"features_{name}.npz",
                          FIXTURE / f"outputs_{name}.npz", _sampling(name, tmp_path))
    assert rc == 1 and "final_atom_positions" in report["failed"], key


def test_bad_sampling_file_is_one_line_naming_the_field(checkpoint, tmp_path, capsys):
    name = "2p90_A02_x2"
    order = np.load(FIXTURE / f"sampled_msa_{name}.npz")["index_order"].copy()
    order[1, 3] = order[1, 4]                                          # not a permutation
    np.savez(tmp_path / "bad.npz", index_order=order)
    rc, err = _compare(capsys, checkpoint, FIXTURE / f"features_{name}.npz",
                       FIXTURE / f"outputs_{name}.npz", tmp_path / "bad.npz")
    assert rc == 2 and "index_order" in err and "pass 1 is not a permutation" in err


def test_compare_passes_from_a_colabfold_a3m_of_the_fixture_rows(checkpoint, tmp_path, capsys):
    """Issue 46 D4: the fixture's paired + unpaired rows (AlphaFold's pairing) written as a
    ColabFold complex a3m, read back (templates added back: an a3m holds none) -> features ->
    `weights compare` against AlphaFold's outputs."""
    name = "4hhb_hbA1-36_hbB1-40"
    chains = [_chain(cid, n, uni) for cid, (n, uni) in zip("AB", CASES[name])]
    a3m = write_complex_a3m(tmp_path / f"{name}.a3m", complex_a3m_from_chains(chains))
    assert read_complex_a3m(a3m).paired                              # the paired block is there
    got = chain_inputs_from_a3m(read_complex_a3m(a3m), [(c.chain_id, c.sequence) for c in chains])
    got = [replace(g, templates=c.templates) for g, c in zip(got, chains)]
    features = complex_features(apply_pair_mode(got, "unpaired_paired")).features
    np.savez(tmp_path / "features.npz", **features)
    rc, report = _compare(capsys, checkpoint, tmp_path / "features.npz",
                          FIXTURE / f"outputs_{name}.npz", _sampling(name, tmp_path))
    assert rc == 0 and report["failed"] == [] and report["max_abs_diff"]["iptm"] < 1e-4


@pytest.mark.parametrize("name", ["A2B_hbA1-36x2_hbB1-40", "2p90_A02_x2_no_templates"])
def test_compare_passes_on_fixture_b_with_its_own_sampling_file(name, tmp_path, capsys):
    """Fixture B (every width distinct; a heterotrimer with a repeated chain, a homodimer with
    no templates) records the template diagonal in its sampling file: used as it is."""
    from test_multimer_fixture_b import CONFIG as CONFIG_B, FIXTURE as FIXTURE_B, PARAMS as PARAMS_B

    ckpt = tmp_path / "ckpt_b"
    assert protdp_main(["weights", "import", "--format", "alphafold", str(PARAMS_B), "--out",
                        str(ckpt), "--alphafold-config", str(CONFIG_B)]) == 0
    rc, report = _compare(capsys, ckpt, FIXTURE_B / f"features_{name}.npz",
                          FIXTURE_B / f"outputs_{name}.npz", FIXTURE_B / f"sampled_msa_{name}.npz")
    assert rc == 0 and report["failed"] == [] and report["max_abs_diff"]["iptm"] < 1e-4
    assert "note" not in report


def test_monomer_features_on_a_multimer_checkpoint_name_the_missing_field(checkpoint, tmp_path,
                                                                          capsys):
    name = "2p90_A02_x2"
    feats = dict(np.load(FIXTURE / f"features_{name}.npz"))
    del feats["asym_id"]
    np.savez(tmp_path / "features.npz", **feats)
    rc, err = _compare(capsys, checkpoint, tmp_path / "features.npz",
                       FIXTURE / f"outputs_{name}.npz", _sampling(name, tmp_path))
    assert rc == 2 and "features.npz" in err and "asym_id" in err
    assert "not an AlphaFold-Multimer feature dict" in err
