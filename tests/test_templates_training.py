"""Templates in training (issue 31 D5): template hits stored per family (optional, versioned
group), sampled per example as AlphaFold's training pipeline does (shuffle, uniform start in
[0, T], at most max_templates), cut to the example's residue crop, padded by collate, and a
training step with them reaches every template parameter."""

import datetime as dt

import h5py
import numpy as np
import pytest
import torch

from data_fixtures import build_pairs_store
from model_fixtures import af2_reference, one_thread, tiny_config  # noqa: F401
from protdp.data.features import collate, featurize
from protdp.data.store import FamilyStore
from protdp.model import build_model
from protdp.model.losses import compute_loss
from protdp.templates.featurize import Featurizer
from protdp.templates.hits import parse_hits
from protdp.templates.training import (collate_templates, sample_templates, with_templates,
                                       write_family_templates)

FAMILY = "4hhb_B"


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir, af2_reference):  # noqa: F811
    """A store whose 4hhb_B family carries template hits featurized for its own sequence."""
    path = build_pairs_store(data_dir, {FAMILY, "2q2k_A"}, tmp_path_factory.mktemp("tplstore"))
    raw = af2_reference / "templates" / "raw_inputs"
    with FamilyStore(path) as s:
        seq = str(s.read(FAMILY)["sequence"])
    from protdp.templates.run import a3m_to_search_stockholm
    from protdp.templates.search import search_templates
    msa = tmp_path_factory.mktemp("q") / "q.sto"
    msa.write_text(a3m_to_search_stockholm(f">q\n{seq}\n"))
    hits = parse_hits(search_templates(msa, raw / "pdb_seqres.txt"), seq)
    result = Featurizer(raw / "mmcif", dt.date(2021, 11, 1)).get_templates(seq, hits)
    assert len(result.used) >= 2
    with h5py.File(path, "a") as h5:
        write_family_templates(h5, FAMILY, result.features)
    return path, result


def test_store_keeps_template_hits(store):
    path, result = store
    with FamilyStore(path) as s:
        fam, other = s.read(FAMILY), s.read("2q2k_A")
    t = fam["templates"]
    assert "templates" not in other
    assert t["aatype"].shape == result.features["template_aatype"].shape[:2]
    assert np.array_equal(t["all_atom_positions"], result.features["template_all_atom_positions"])
    with h5py.File(path) as h5:
        assert h5[f"families/{FAMILY}/templates"].attrs["format_version"] == 1


def test_af2_training_sampling_distribution():
    rng = np.random.default_rng(0)
    counts = np.bincount([len(sample_templates(6, 4, rng, True)) for _ in range(4000)], minlength=5)
    # start ~ U{0..6}: 0 templates for start 6, 1 for 5, 2 for 4, 3 for 3, 4 for starts 0-2
    assert np.allclose(counts / 4000, [1 / 7, 1 / 7, 1 / 7, 1 / 7, 3 / 7], atol=0.03)
    assert list(sample_templates(6, 4, rng, False)) == [0, 1, 2, 3]
    assert len(sample_templates(0, 4, rng, True)) == 0


def test_examples_carry_cropped_templates_and_train(store):
    path, _ = store
    torch.manual_seed(0)
    cfg = tiny_config(templates=True, c_t=8, template_pair_blocks=1, template_tri_heads=2,
                      c_hidden_template_tri_att=4, c_hidden_template_tri_mul=8,
                      template_att_heads=2, c_hidden_template_att=4)
    feat, coll = with_templates(featurize, cfg.max_templates), collate_templates(collate)
    with FamilyStore(path) as s:
        fam, other = s.read(FAMILY), s.read("2q2k_A")
    seen = set()
    for seed in range(12):
        ex = feat(fam, crop_size=40, max_msa_rows=8, seed=seed, training=True)
        if "template_mask" not in ex:
            seen.add(0)
            continue
        T = int(ex["template_mask"].shape[0])
        seen.add(T)
        assert ex["template_aatype"].shape == (T, 40) and T <= cfg.max_templates
        # the crop is the example's own: each row is one stored template cut to its window
        start = int(np.flatnonzero(np.asarray(fam["residue_index"]) == int(ex["residue_index"][0]))[0])
        full = fam["templates"]["all_atom_positions"][:, start:start + 40]
        for row in ex["template_all_atom_positions"].numpy():
            assert any(np.array_equal(row, f) for f in full)
    assert len(seen) >= 3                                   # 0..T templates are drawn
    batch = coll([feat(fam, crop_size=40, max_msa_rows=8, seed=3, training=True),
                  feat(other, crop_size=40, max_msa_rows=8, seed=3, training=True)])
    assert batch["template_mask"].shape[0] == 2 and batch["template_mask"][1].tolist()[0] == 1.0
    model = build_model(cfg, verbose=False).train()
    with torch.no_grad():     # off the zero-initialised ("final") outputs, so gradients flow
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = model(batch, num_recycles=0)
    loss, _ = compute_loss(out, batch, model.config)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if n.startswith("template_embedder")}
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["template_embedder.embedding2d.weight"].abs().sum() > 0
    assert grads["template_embedder.linear_single.weight"].abs().sum() > 0


def test_cli_puts_searched_hits_into_the_store(tmp_path, data_dir, af2_reference, capsys):  # noqa: F811
    """`protdp templates store-fasta` names the families; the hits `msa search` would write for
    them (`search_target`) go into the store with `add-to-store`; a file that does not cover its
    family is named and skipped, and the store is replaced only as a whole."""
    from protdp.cli import main
    from protdp.templates.run import search_target

    (tmp_path / "s").mkdir()
    path = build_pairs_store(data_dir, {FAMILY, "2q2k_A"}, tmp_path / "s")
    fasta = tmp_path / "families.fasta"
    assert main(["templates", "store-fasta", "--store", str(path), "--out", str(fasta)]) == 0
    seqs = dict(zip(*[iter(x.lstrip(">") for x in fasta.read_text().split())] * 2))
    with FamilyStore(path) as s:
        assert seqs == {f: str(s.read(f)["sequence"]) for f in s.family_ids}
    raw = af2_reference / "templates" / "raw_inputs"
    good = tmp_path / "msas" / FAMILY
    good.mkdir(parents=True)
    (good / "q.a3m").write_text(f">q\n{seqs[FAMILY]}\n")
    search_target(seqs[FAMILY], good / "q.a3m", raw / "pdb_seqres.txt",
                  Featurizer(raw / "mmcif", dt.date(2021, 11, 1)), good)
    (tmp_path / "msas" / "2q2k_A").mkdir()
    (tmp_path / "msas" / "2q2k_A" / "templates.npz").write_bytes((good / "templates.npz").read_bytes())
    assert main(["templates", "add-to-store", "--store", str(path),       # a typo: one line
                 "--msa-dir", str(tmp_path / "msa")]) == 2
    assert f"{tmp_path / 'msa'}: not a folder" in capsys.readouterr().err
    assert main(["templates", "add-to-store", "--store", str(path),
                 "--msa-dir", str(tmp_path / "msas")]) == 0
    err = capsys.readouterr().err
    assert "2q2k_A" in err and "residues, the family has" in err
    with FamilyStore(path) as s, np.load(good / "templates.npz") as f:
        fam = s.read(FAMILY)
        assert np.array_equal(fam["templates"]["all_atom_positions"],
                              f["template_all_atom_positions"])
        assert len(fam["templates"]["aatype"]) == len(f["template_aatype"]) >= 2
        assert "templates" not in s.read("2q2k_A")
    assert not list(path.parent.glob(".*.tmp"))
