"""Hostile template inputs (issue 47 D2/D3/D6): a `--template` mmCIF with a non-numeric or
non-finite field, all atoms in model 2, and broken `templates.npz` / `templates.json` files are
one line naming the file and the field; in a batch the bad target is a rejected summary row and
the good one is predicted. Reference for "accepted": the untouched file's parse, array for
array. The fuzz test corrupts random fields of the real 4hhb.cif and inflates declared sizes:
each variant is accepted with the same output as the reference or refused with one line."""

from __future__ import annotations

import json
import random
import resource
import time

import gemmi
import numpy as np
import pytest

from model_fixtures import af2_reference, one_thread  # noqa: F401
from protdp.errors import InputError
from protdp.templates.featurize import placeholder
from protdp.templates.inputs import custom_template
from protdp.templates.mmcif import atom_positions, read_structure
from protdp.templates.validate import feature_problem, read_features, read_record, real_templates
from test_templates_predict import _run, ckpt  # noqa: F401  (fixture)

QUERY = "VLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHFDLSHGSAQVKGHGKKV"


@pytest.fixture(scope="module")
def cif(af2_reference):  # noqa: F811
    return af2_reference / "templates" / "raw_inputs" / "mmcif" / "4hhb.cif"


def _edit(src, dst, category, tag, value, row=0):
    """dst: src with `category`.`tag` of row `row` set to `value` (raw CIF text)."""
    doc = gemmi.cif.read(str(src))
    block = doc.sole_block()
    table = block.find_mmcif_category(category)
    tags = [t.removeprefix(category) for t in table.tags]
    rows = [list(r) for r in table]
    rows[row][tags.index(tag)] = value
    block.set_mmcif_category(category, {t: [r[i] for r in rows] for i, t in enumerate(tags)},
                             raw=True)
    doc.write_file(str(dst))
    return dst


@pytest.mark.parametrize("category,tag,value", [
    ("_atom_site.", "auth_seq_id", "?"), ("_atom_site.", "label_seq_id", "?"),
    ("_atom_site.", "Cartn_x", "?"), ("_atom_site.", "Cartn_y", "nan"),
    ("_atom_site.", "Cartn_z", "inf"), ("_atom_site.", "Cartn_x", "1e30"),
    ("_atom_site.", "occupancy", "abc"), ("_entity_poly_seq.", "num", "abc")])
def test_non_numeric_mmcif_field_is_one_line(cif, tmp_path, category, tag, value):
    bad = _edit(cif, tmp_path / "bad.cif", category, tag, value)
    with pytest.raises(InputError) as exc:
        read_structure(bad)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(bad)) and f"{category}{tag}" in msg, msg
    assert (repr(value) if value != "?" else "unknown ('?'") in msg


def test_all_atoms_in_model_2_read_as_the_first_model(cif, tmp_path):
    doc = gemmi.cif.read(str(cif))
    block = doc.sole_block()
    table = block.find_mmcif_category("_atom_site.")
    tags = [t.removeprefix("_atom_site.") for t in table.tags]
    rows = [list(r) for r in table]
    for r in rows:
        r[tags.index("pdbx_PDB_model_num")] = "2"
    block.set_mmcif_category("_atom_site.", {t: [r[i] for r in rows] for i, t in enumerate(tags)},
                             raw=True)
    doc.write_file(str(tmp_path / "m2.cif"))
    ref, got = read_structure(cif), read_structure(tmp_path / "m2.cif", file_id="4hhb")
    assert got.chain_to_seqres == ref.chain_to_seqres
    for a, b in zip(atom_positions(ref, "A"), atom_positions(got, "A")):
        np.testing.assert_array_equal(a, b)
    feats, rec = custom_template(QUERY, str(tmp_path / "m2.cif"))      # no :CHAIN given
    want, _ = custom_template(QUERY, str(cif))
    np.testing.assert_array_equal(feats["template_all_atom_positions"],
                                  want["template_all_atom_positions"])


def test_no_protein_coordinates_is_one_line(cif, tmp_path):
    doc = gemmi.cif.read(str(cif))
    block = doc.sole_block()
    table = block.find_mmcif_category("_atom_site.")
    tags = [t.removeprefix("_atom_site.") for t in table.tags]
    rows = [list(r) for r in table if r[tags.index("group_PDB")] == "HETATM"]
    block.set_mmcif_category("_atom_site.", {t: [r[i] for r in rows] for i, t in enumerate(tags)},
                             raw=True)
    doc.write_file(str(tmp_path / "het.cif"))
    with pytest.raises(InputError, match="no protein chain with coordinates"):
        custom_template(QUERY, str(tmp_path / "het.cif"))


def _good(L, T=2, seed=0):
    rng = np.random.default_rng(seed)
    f = placeholder(L)
    f = {k: np.repeat(v, T, axis=0) for k, v in f.items() if k.startswith("template_a")}
    f["template_all_atom_masks"][:, :, :5] = 1
    f["template_all_atom_positions"][:, :, :5] = rng.normal(size=(T, L, 5, 3)) * 10
    f["template_aatype"][:, :, 0] = 1
    return f


def _broken_npz_cases(L):
    good = _good(L)
    yield "missing key", {k: v for k, v in good.items() if k != "template_all_atom_masks"}
    yield "1-D aatype", {**good, "template_aatype": np.zeros(L, np.float32)}
    yield "too few residues", {k: v[:, :10] for k, v in good.items()}
    yield "NaN positions", {**good, "template_all_atom_positions": np.where(
        good["template_all_atom_masks"][..., None] > 0, np.nan, 0).astype(np.float32)}
    yield "mask width 5", {**good, "template_all_atom_masks": good["template_all_atom_masks"][..., :5]}
    yield "0 templates", {k: v[:0] for k, v in good.items()}
    yield "mask 7", {**good, "template_all_atom_masks": good["template_all_atom_masks"] * 7}
    yield "template counts disagree", {**good, "template_aatype": good["template_aatype"][:1]}


def test_broken_templates_npz_is_one_line(tmp_path):
    L = 30
    assert feature_problem(_good(L), L) is None
    for name, feats in _broken_npz_cases(L):
        path = tmp_path / f"{name.replace(' ', '_')}.npz"
        np.savez(path, **feats)
        with pytest.raises(InputError) as exc:
            read_features(path, L)
        assert str(exc.value).startswith(str(path)) and "\n" not in str(exc.value), name
    path = tmp_path / "pickled.npz"
    np.savez(path, **_good(L), template_domain_names=np.array([object()], dtype=object))
    np.savez(path, template_aatype=np.array([object()], dtype=object))
    with pytest.raises(InputError, match="unreadable|not a numeric|Python objects"):
        read_features(path, L)


@pytest.mark.parametrize("text,match", [("[1, 2]", "a JSON list"),
                                        ('{"templates": {"id": "x"}}', "must be a list"),
                                        ('{"templates": [3]}', "must be a list"),
                                        ("{", "invalid JSON")])
def test_broken_templates_json_is_one_line(tmp_path, text, match):
    path = tmp_path / "templates.json"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        read_record(path)


def test_placeholder_is_not_counted_as_a_template():
    assert real_templates(placeholder(12)) == 0 and real_templates(_good(12, T=3)) == 3


def test_broken_template_folder_rejects_its_target_and_the_batch_goes_on(ckpt, tmp_path):  # noqa: F811
    fasta = tmp_path / "t.fasta"
    seqs = {"bad1": QUERY[:40], "bad2": QUERY[:41], "good": QUERY[:42]}
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    msas = tmp_path / "msas"
    cases = {"bad1": ({**_good(40), "template_all_atom_positions": np.full((2, 40, 37, 3), np.nan,
                                                                           np.float32)}, "{}"),
             "bad2": (_good(41), "[]"), "good": (_good(42), '{"templates": []}')}
    for name, (feats, record) in cases.items():
        (msas / name).mkdir(parents=True)
        np.savez(msas / name / "templates.npz", **feats)
        (msas / name / "templates.json").write_text(record)
    from protdp.workflows import predict
    res = predict(ckpt, fasta, tmp_path / "o", msa_dir=msas, release_gate="review",
                  device="cpu", progress=False)
    rows = {r["target"]: r for r in res.rows}
    assert rows["bad1"]["route"] == "rejected" and "NaN" in rows["bad1"]["detail"]
    assert "templates.npz" in rows["bad1"]["detail"]
    assert rows["bad2"]["route"] == "rejected" and "templates.json" in rows["bad2"]["detail"]
    assert rows["good"]["route"] != "rejected", rows["good"]
    assert (tmp_path / "o" / "summary.csv").is_file() or res.summary_path is not None


def test_fuzz_template_mmcif(cif, tmp_path):
    """Random field corruptions of 4hhb.cif's atom and sequence loops: each variant parses to the
    reference's chain A atoms or is refused with one InputError line naming the file; every
    case within 10 s and 1 GiB of extra peak memory."""
    rng = random.Random(47)
    ref = atom_positions(read_structure(cif), "A")
    doc = gemmi.cif.read(str(cif))
    n_atoms = len(doc.sole_block().find_mmcif_category("_atom_site."))
    junk = ["?", ".", "abc", "nan", "-inf", "1e300", "", "9" * 40, "1.5", "-3", "0x10", "\u00e9"]
    outcomes = {"same": 0, "refused": 0, "changed": 0}
    for k in range(24):
        tag = rng.choice(["auth_seq_id", "label_seq_id", "Cartn_x", "Cartn_y", "occupancy",
                          "pdbx_PDB_model_num", "label_asym_id", "label_atom_id"])
        value = rng.choice(junk)
        if value == "":
            value = "''"
        path = _edit(cif, tmp_path / f"f{k}.cif", "_atom_site.", tag, value,
                     row=rng.randrange(n_atoms))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        try:
            got = atom_positions(read_structure(path, file_id="4hhb"), "A")
        except InputError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
            outcomes["refused"] += 1
        except (KeyError, ValueError) as exc:       # atom_positions' own CA-CA refusal
            assert "CA-CA" in str(exc) or "'A'" in str(exc), (tag, value, exc)
            outcomes["refused"] += 1
        else:
            same = all(np.array_equal(a, b) for a, b in zip(ref, got))
            outcomes["same" if same else "changed"] += 1
            assert np.isfinite(got[0]).all()
        assert time.perf_counter() - t0 < 10
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20   # KiB
    assert outcomes["refused"] > 0, outcomes


def test_fuzz_templates_npz(tmp_path):
    """Random corruptions of a valid templates.npz (a key dropped, an axis cut or inflated, a
    value made NaN/huge, a dtype changed): accepted with the same arrays or refused in one line."""
    rng = np.random.default_rng(47)
    L = 25
    good = _good(L)
    for k in range(40):
        feats = {key: v.copy() for key, v in good.items()}
        key = list(feats)[int(rng.integers(3))]
        kind = int(rng.integers(5))
        if kind == 0:
            del feats[key]
        elif kind == 1:
            axis = int(rng.integers(feats[key].ndim))
            feats[key] = np.take(feats[key], range(int(rng.integers(0, 3)) if axis else 0), axis)
        elif kind == 2:
            feats[key].flat[int(rng.integers(feats[key].size))] = rng.choice([np.nan, np.inf, 1e9])
        elif kind == 3:
            feats[key] = feats[key].astype(rng.choice(["U3", "complex64", "int8"]))
        else:
            feats[key] = np.repeat(feats[key], 40, axis=0)     # 80 templates declared
        path = tmp_path / f"f{k}.npz"
        np.savez(path, **feats)
        try:
            got = read_features(path, L)
        except InputError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
            continue
        for name in good:
            assert np.array_equal(np.asarray(got[name], np.float64),
                                  np.asarray(good[name], np.float64)), (k, kind, name)


def test_fuzz_templates_json(tmp_path):
    """Random JSON values in place of a valid templates.json's parts: each read gives the same
    record or is refused in one line naming the file."""
    rng = random.Random(47)
    good = {"templates": [{"id": "4hhb", "chain": "A", "release_date": "1984-07-17"}],
            "warnings": [], "errors": []}
    values = [None, 1, 1.5, "x", [], {}, [1], {"id": 3}, True, float("nan")]
    for k in range(40):
        record = json.loads(json.dumps(good))
        where = rng.choice(["root", "templates", "entry", "id", "chain"])
        value = rng.choice(values)
        if where == "root":
            record = value
        elif where == "templates":
            record["templates"] = value
        elif where == "entry":
            record["templates"][0] = value
        else:
            record["templates"][0][where] = value
        path = tmp_path / f"t{k}.json"
        path.write_text(json.dumps(record))
        try:
            got = read_record(path)
        except InputError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
            continue
        assert got == record and isinstance(got.get("templates", []), list)
        assert all(isinstance(t["id"], str) and isinstance(t["chain"], str)
                   for t in got.get("templates", []))
