"""Custom templates in `protdp predict` (issue 31 D4): `--template FILE.cif[:CHAIN]` reaches the
model (the prediction changes and equals a direct model run with the same template inputs),
provenance.json lists each template (id, chain, release date, aligned residues, identity), a
template that cannot be used is an error naming it and the batch goes on, and a template-free
checkpoint refuses --template."""

import json

import numpy as np
import pytest
import torch

from model_fixtures import af2_reference, one_thread  # noqa: F401
from protdp.errors import ConfigError
from protdp.inference.layout import current_prediction
from protdp.weights import cli as weights_cli
from protdp.workflows import predict

PARAMS = "templates/params/params_model_1_ptm_templates_small.npz"


@pytest.fixture(scope="module")
def ckpt(af2_reference, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("tpl") / "ckpt"
    assert weights_cli.main(["import", "--format", "alphafold", str(af2_reference / PARAMS),
                             "--out", str(out), "--sm-layers", "2", "--num-recycles", "0"]) == 0
    return out


def _run(ckpt, fasta, out, templates=()):
    return predict(ckpt, fasta, out, templates=tuple(templates), release_gate="review",
                   device="cpu", progress=False)


def test_custom_template_is_used_and_recorded(ckpt, af2_reference, tmp_path):  # noqa: F811
    raw = af2_reference / "templates" / "raw_inputs"
    fasta = tmp_path / "t.fasta"
    fasta.write_text((raw / "4hhb_B_1-61.fasta").read_text() + ">short\nMKV\n")
    cif = raw / "mmcif" / "4hhb.cif"
    res = _run(ckpt, fasta, tmp_path / "with", [f"{cif}:A"])
    rows = {r["target"]: r for r in res.rows}
    prov = json.loads((current_prediction(tmp_path / "with" / "targets" / rows["4hhb_B_1-61"]["file_name"]) / "provenance.json").read_text())
    [used] = prov["templates"]["templates"]
    assert (used["id"], used["chain"], used["release_date"]) == ("4hhb", "A", "1984-07-17")
    assert 40 <= used["aligned_residues"] <= 61 and 0.2 < used["identity"] < 0.7
    # too short to align (kalign needs 6 residues): that target is rejected naming the file
    assert rows["short"]["route"] == "rejected" and "4hhb.cif" in rows["short"]["detail"]
    # the gate uses it (D6): no MSA here, so shallow; with the template that is the only reason
    assert "shallow_msa" in rows["4hhb_B_1-61"]["reasons"]
    assert "shallow_msa_no_template" not in rows["4hhb_B_1-61"]["reasons"]
    assert "4hhb_A" in prov["gate"]["details"]["shallow_msa"]
    without = _run(ckpt, fasta, tmp_path / "without")
    assert "shallow_msa_no_template" in {r["target"]: r for r in without.rows}["4hhb_B_1-61"]["reasons"]
    a = json.loads((current_prediction(tmp_path / "with" / "targets" / rows["4hhb_B_1-61"]["file_name"]) / "scores.json").read_text())["plddt"]
    b = json.loads((current_prediction(tmp_path / "without" / "targets" / rows["4hhb_B_1-61"]["file_name"]) / "scores.json").read_text())["plddt"]
    assert np.abs(np.array(a) - np.array(b)).max() > 0.01       # the template reached the model


def test_unusable_templates_are_clear_errors(ckpt, af2_reference, tmp_path):  # noqa: F811
    raw = af2_reference / "templates" / "raw_inputs"
    fasta = tmp_path / "t.fasta"
    fasta.write_text((raw / "2q2k_A.fasta").read_text())
    junk = tmp_path / "junk.cif"
    junk.write_text("not a structure\n")
    for spec, match in ((str(junk), "junk.cif: not a readable mmCIF"),
                        (f"{raw / 'mmcif' / '2q2k.cif'}:Z", "chain 'Z' is not a protein chain"),
                        (str(tmp_path / "missing.cif"), "missing.cif: template file not found")):
        res = _run(ckpt, fasta, tmp_path / "o", [spec])
        [row] = res.rows
        assert row["route"] == "rejected" and match in row["detail"], row["detail"]


def test_template_free_checkpoint_refuses_template(af2_reference, tmp_path):  # noqa: F811
    out = tmp_path / "m3"
    assert weights_cli.main(["import", "--format", "alphafold",
                             str(af2_reference / "params/params_model_3_ptm_small.npz"),
                             "--out", str(out), "--sm-layers", "2"]) == 0
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">a\nMKVLAAGIVGLLLAAQ\n")
    with pytest.raises(ConfigError, match="no template module"):
        _run(out, fasta, tmp_path / "o", [str(af2_reference / "templates/raw_inputs/mmcif/4hhb.cif")])


def test_predict_uses_the_templates_msa_search_wrote(ckpt, af2_reference, tmp_path):  # noqa: F811
    from protdp.msa import cli as msa_cli
    raw = af2_reference / "templates" / "raw_inputs"
    fasta = tmp_path / "t.fasta"
    fasta.write_text((raw / "4hhb_A_1-64.fasta").read_text())
    msas = tmp_path / "msas"
    assert msa_cli.main(["search", "--fasta", str(fasta), "--db", str(raw / "pdb_seqres.txt"),
                         "--out", str(msas), "--no-progress", "--templates-db",
                         str(raw / "pdb_seqres.txt"), "--mmcif-dir", str(raw / "mmcif"),
                         "--max-template-date", "2021-11-01"]) == 0
    res = predict(ckpt, fasta, tmp_path / "o", msa_dir=msas, release_gate="review",
                  device="cpu", progress=False)
    [row] = res.rows
    prov = json.loads((current_prediction(tmp_path / "o" / "targets" / row["file_name"]) / "provenance.json").read_text())
    assert prov["templates"]["source"].endswith("templates.npz")
    recorded = json.loads((msas / row["file_name"] / "templates.json").read_text())["templates"]
    assert prov["templates"]["templates"] == recorded[:4] and len(recorded) >= 1
    # the template files are part of the prediction's identity, digests of the bytes parsed
    import hashlib
    files = {f["path"]: f["sha256"] for f in prov["templates"]["files"]}
    assert files == {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
                     for p in (msas / row["file_name"] / "templates.npz",
                               msas / row["file_name"] / "templates.json")}
    again = predict(ckpt, fasta, tmp_path / "o", msa_dir=msas, release_gate="review",
                    device="cpu", progress=False)
    assert again.rows[0]["status"] == "skipped"
    record = msas / row["file_name"] / "templates.json"          # new templates: a new prediction
    record.write_text(json.dumps({**json.loads(record.read_text()), "note": "re-searched"}))
    third = predict(ckpt, fasta, tmp_path / "o", msa_dir=msas, release_gate="review",
                    device="cpu", progress=False)
    assert third.rows[0]["status"] != "skipped"
    assert third.rows[0]["prediction_id"] != row["prediction_id"]


def test_a_template_file_changed_between_identity_and_parse_is_refused(tmp_path):
    from protdp.errors import InputError
    from protdp.inference.predictor import check_template_files
    hashed = [{"path": str(tmp_path / "templates.npz"), "sha256": "a" * 64}]
    check_template_files(hashed, {"files": hashed})
    for parsed in ([{"path": hashed[0]["path"], "sha256": "b" * 64}], [],
                   hashed + [{"path": str(tmp_path / "templates.json"), "sha256": "c" * 64}]):
        with pytest.raises(InputError, match="changed since this target's identity"):
            check_template_files(hashed, {"files": parsed})


def test_template_bytes_read_once_are_the_bytes_every_target_parses(af2_reference, tmp_path,
                                                                    monkeypatch):  # noqa: F811
    """The --template file is read once when the run starts: its sha256 (the prediction's
    identity) is of those bytes and a file replaced mid-run changes no later target."""
    import hashlib
    import shutil

    from protdp.errors import InputError
    from protdp.templates import inputs

    raw = af2_reference / "templates" / "raw_inputs"
    cif = tmp_path / "4hhb.cif"
    shutil.copy(raw / "mmcif" / "4hhb.cif", cif)
    original = hashlib.sha256(cif.read_bytes()).hexdigest()
    query = "".join(l.strip() for l in (raw / "4hhb_B_1-61.fasta").read_text().splitlines()[1:])
    provider = inputs.TemplateProvider(4, (f"{cif}:A",))
    [f] = provider.files
    assert f.sha256 == original
    first, record = provider.for_target(query, None, "t")
    cif.write_text("not a structure\n")                      # replaced after the run started
    again, record2 = provider.for_target(query, None, "t")
    assert record2 == record
    assert all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(InputError, match="not a readable mmCIF"):   # a new run reads the new bytes
        inputs.TemplateProvider(4, (f"{cif}:A",)).for_target(query, None, "t")
    monkeypatch.setattr(inputs, "MAX_TEMPLATE_FILE_BYTES", 8)
    with pytest.raises(InputError, match="4hhb.cif: template file larger than 8 bytes"):
        inputs.TemplateProvider(4, (f"{cif}:A",))
