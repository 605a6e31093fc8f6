"""Features per docs/batch_format.md, AlphaFold's input pipeline: crop, cluster centres (query
first), BERT masking, nearest-neighbour clustering and cluster summaries (checked against
explicit loops and against DeepMind's own features for the reference fixture), extra MSA, per-
pass MSA samples, atom37 truth (store v2 and v1 dicts), collate padding, inference features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from data_fixtures import build_pairs_store
from model_fixtures import AF2_CASES, af2_reference  # noqa: F401
from protdp.data import residue_constants as rc
from protdp.data.features import (cluster_assignment, collate, deletion_value, featurize,
                                  featurize_query, msa_profile, summarize_clusters)
from protdp.data.parse import parse_msa
from protdp.data.residues import (BACKBONE_ATOMS, HHBLITS_TO_ID, MASK_ID, RESTYPES, msa_row_to_ids,
                                  sequence_to_ids)
from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.model.inputs import target_feat

CONTRACT = {  # key -> (dtype, number of dims unbatched)
    "aatype": (torch.int64, 1), "residue_index": (torch.int64, 1), "seq_mask": (torch.float32, 1),
    "between_segment_residues": (torch.float32, 1),
    "msa": (torch.int64, 2), "msa_mask": (torch.float32, 2), "has_deletion": (torch.float32, 2),
    "deletion_value": (torch.float32, 2), "cluster_profile": (torch.float32, 3),
    "deletion_mean_value": (torch.float32, 2), "true_msa": (torch.int64, 2),
    "bert_mask": (torch.float32, 2), "extra_msa": (torch.int64, 2),
    "extra_msa_mask": (torch.float32, 2), "extra_has_deletion": (torch.float32, 2),
    "extra_deletion_value": (torch.float32, 2),
    "all_atom_positions": (torch.float32, 3), "all_atom_mask": (torch.float32, 2),
    "backbone_positions": (torch.float32, 3), "backbone_mask": (torch.float32, 2),
    "resolution": (torch.float32, 0), "num_residues": (torch.int64, 0),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir):
    ids = {"2q2k_A", "5awl_A", "2p90_A02", "4hhb_B"}
    tmp = tmp_path_factory.mktemp("feat")
    return FamilyStore(build_pairs_store(data_dir, ids, tmp))


def _row_index(msa: np.ndarray) -> dict:
    return {r.astype(np.uint8).tobytes(): i for i, r in enumerate(msa)}


def test_contract_keys_dtypes_shapes(store):
    ex = featurize(store.read("2q2k_A"), crop_size=32, max_msa_rows=8, seed=0, max_extra_msa_rows=20)
    assert set(ex) == set(CONTRACT) | {"family_id"} and ex["family_id"] == "2q2k_A"
    for key, (dtype, ndim) in CONTRACT.items():
        assert ex[key].dtype == dtype and ex[key].dim() == ndim, key
    L, N = 32, 8
    assert ex["aatype"].shape == (L,) and ex["msa"].shape == (N, L)
    assert ex["cluster_profile"].shape == (N, L, 23) and ex["extra_msa"].shape[1] == L
    assert 0 < ex["extra_msa"].shape[0] <= 20
    assert ex["all_atom_positions"].shape == (L, 37, 3) and ex["num_residues"].item() == L
    assert torch.allclose(ex["cluster_profile"].sum(-1), torch.ones(N, L), atol=1e-5)


def test_crop_is_contiguous_and_matches_store(store):
    fam = store.read("4hhb_B")
    starts = set()
    for seed in range(8):
        ex = featurize(fam, crop_size=40, max_msa_rows=16, seed=seed)
        ri = ex["residue_index"].numpy()
        s = int(np.nonzero(np.asarray(fam["residue_index"]) == ri[0])[0][0])
        starts.add(s)
        np.testing.assert_array_equal(ri, np.asarray(fam["residue_index"])[s:s + 40])
        np.testing.assert_array_equal(ex["backbone_positions"].numpy(), fam["backbone_positions"][s:s + 40])
        np.testing.assert_array_equal(ex["backbone_mask"].numpy(), fam["backbone_mask"][s:s + 40])
        np.testing.assert_array_equal(ex["aatype"].numpy(), sequence_to_ids(fam["sequence"][s:s + 40]))
        np.testing.assert_array_equal(ex["true_msa"][0].numpy(), fam["msa"][0, s:s + 40])
        # every centre and extra row is a row of the cropped MSA
        rows = {r.tobytes() for r in fam["msa"][:, s:s + 40]}
        for key in ("true_msa", "extra_msa"):
            assert all(r.astype(np.uint8).tobytes() in rows for r in ex[key].numpy())
    assert len(starts) > 1                                     # random crop start


def test_atom37_truth_from_v1_backbone_dicts(store):
    fam = store.read("2q2k_A")
    v1 = {k: v for k, v in fam.items() if k not in ("all_atom_positions", "all_atom_mask")}
    ex = featurize(v1, crop_size=None, max_msa_rows=4, seed=0, training=False)
    pos, mask = ex["all_atom_positions"], ex["all_atom_mask"]
    for j, slot in enumerate(rc.BACKBONE_ATOM37_SLOTS):
        expect = fam["backbone_mask"][:, j].astype(np.float32)
        if BACKBONE_ATOMS[j] == "CB":                  # glycine has no CB in atom37
            expect = expect * (ex["aatype"].numpy() != RESTYPES.index("G"))
        np.testing.assert_array_equal(mask[:, slot].numpy(), expect)
    assert mask.sum() == mask[:, list(rc.BACKBONE_ATOM37_SLOTS)].sum()
    on = mask[:, 1] > 0
    assert torch.equal(pos[on, 1], torch.from_numpy(fam["backbone_positions"][:, 1])[on])


def test_deterministic_given_seed_and_per_pass_samples(store):
    fam = store.read("4hhb_B")
    a = featurize(fam, crop_size=64, max_msa_rows=32, seed=7)
    b = featurize(fam, crop_size=64, max_msa_rows=32, seed=7)
    c = featurize(fam, crop_size=64, max_msa_rows=32, seed=8)
    for k in CONTRACT:
        assert torch.equal(a[k], b[k]) or (k == "resolution" and a[k].isnan() and b[k].isnan())
    assert not torch.equal(a["msa"], c["msa"])
    multi = featurize(fam, crop_size=64, max_msa_rows=32, seed=7, msa_samples=3)
    assert multi["msa"].shape == (3, 32, 64) and multi["cluster_profile"].shape == (3, 32, 64, 23)
    assert torch.equal(multi["msa"][0], a["msa"]) and torch.equal(multi["extra_msa"][0], a["extra_msa"])
    assert not torch.equal(multi["true_msa"][1], multi["true_msa"][2])   # its own sample each
    assert torch.equal(multi["aatype"], a["aatype"])                       # one crop for all


def test_bert_masking_statistics(store):
    fam = store.read("4hhb_B")                                  # 4577 rows x 147
    ex = featurize(fam, crop_size=None, max_msa_rows=512, seed=3)
    sel = ex["bert_mask"].bool()
    frac = sel.float().mean().item()
    assert abs(frac - 0.15) < 0.01
    unchanged = ~sel
    assert torch.equal(ex["msa"][unchanged], ex["true_msa"][unchanged])
    n = sel.sum().item()
    masked = (ex["msa"][sel] == MASK_ID).float().mean().item()
    assert abs(masked - 0.7) < 4 * math.sqrt(0.21 / n)
    # 10 % same + part of uniform/profile draws land on the true token: >= 10 % identical
    same = (ex["msa"][sel] == ex["true_msa"][sel]).float().mean().item()
    assert 0.10 < same < 0.30
    assert ex["msa"].max().item() <= MASK_ID
    # the centres' own (corrupted) tokens are in their profiles: masked positions have mass there
    mask_mass = ex["cluster_profile"][..., MASK_ID][sel & (ex["msa"] == MASK_ID)]
    assert torch.all(mask_mass > 0)


def test_deletion_features_follow_formula(store):
    fam = store.read("2p90_A02")
    ex = featurize(fam, crop_size=None, max_msa_rows=10_000, seed=0, training=False)
    rows = _row_index(fam["msa"])
    idx = [rows[r.astype(np.uint8).tobytes()] for r in ex["true_msa"].numpy()]
    assert idx[0] == 0 and sorted(idx) == list(range(len(fam["msa"])))   # query first, all rows
    d = fam["deletion_matrix"][idx].astype(np.float64)
    np.testing.assert_allclose(ex["deletion_value"].numpy(), 2 / np.pi * np.arctan(d / 3), atol=1e-6)
    np.testing.assert_array_equal(ex["has_deletion"].numpy(), (d > 0).astype(np.float32))
    assert ex["bert_mask"].sum() == 0 and torch.equal(ex["msa"], ex["true_msa"])
    # every row is a centre: one padding extra row, masked, and each profile is its own row
    assert ex["extra_msa"].shape[0] == 1 and ex["extra_msa_mask"].sum() == 0
    one_hot = torch.nn.functional.one_hot(ex["msa"], 23).float()
    assert torch.allclose(ex["cluster_profile"], one_hot, atol=1e-5)


def test_clustering_matches_explicit_loops():
    rng = np.random.default_rng(0)
    centres = rng.integers(0, 23, (5, 12))
    extra = rng.integers(0, 22, (40, 12))
    extra[3] = centres[2]                              # an exact copy joins that centre
    extra[4, :] = 21                                   # all gaps: agrees with nobody -> first
    dels_c, dels_e = rng.integers(0, 5, (5, 12)), rng.integers(0, 5, (40, 12))
    got = cluster_assignment(centres, extra)
    for e in range(40):
        score = [sum(1 for j in range(12) if extra[e, j] == centres[c, j] and extra[e, j] <= 20)
                 for c in range(5)]
        assert got[e] == score.index(max(score))
    assert got[3] == 2 and got[4] == 0
    profile, mean = summarize_clusters(centres, dels_c, extra, dels_e, got)
    for c in range(5):
        members = [centres[c]] + [extra[e] for e in range(40) if got[e] == c]
        member_dels = [dels_c[c]] + [dels_e[e] for e in range(40) if got[e] == c]
        ref = np.stack([np.eye(23)[m] for m in members]).sum(0) / (len(members) + 1e-6)
        np.testing.assert_allclose(profile[c], ref, atol=1e-6)
        np.testing.assert_allclose(mean[c], np.sum(member_dels, 0) / (len(members) + 1e-6), atol=1e-5)


@pytest.mark.parametrize("case", AF2_CASES)
def test_cluster_features_equal_alphafold(af2_reference, case):  # noqa: F811
    """Given AlphaFold's selected centres (the fixture's true_msa rows) and the remaining rows
    of its raw MSA, protdp's assignment and summaries give AlphaFold's msa_feat (profile,
    deletion mean, has_deletion, deletion_value) and target_feat within 1e-6."""
    raw = np.load(af2_reference / f"raw_features_{case}.npz")
    feats = np.load(af2_reference / f"features_{case}.npz")
    msa, dels = HHBLITS_TO_ID[raw["msa"]].astype(np.int64), raw["deletion_matrix_int"]
    rows = _row_index(msa)
    for p in range(feats["aatype"].shape[0]):
        n = int(feats["msa_row_mask"][p].sum())
        idx = np.array([rows[r.astype(np.uint8).tobytes()] for r in feats["true_msa"][p, :n]])
        assert idx[0] == 0
        others = np.setdiff1d(np.arange(len(msa)), idx)
        assignment = cluster_assignment(msa[idx], msa[others])
        profile, mean = summarize_clusters(msa[idx], dels[idx], msa[others], dels[others], assignment)
        ref = feats["msa_feat"][p, :n]
        assert np.abs(profile - ref[..., 25:48]).max() <= 1e-6
        assert np.abs(deletion_value(mean) - ref[..., 48]).max() <= 1e-6
        assert np.abs(deletion_value(dels[idx]) - ref[..., 24]).max() <= 1e-6
        assert np.array_equal((dels[idx] > 0).astype(np.float32), ref[..., 23])
        assert np.array_equal(np.eye(23, dtype=np.float32)[msa[idx]], ref[..., :23])
        # extra rows: AF2's deletion features of the rows it kept
        n_extra = int(feats["extra_msa_row_mask"][p].sum())
        for e in range(n_extra):
            i = rows[feats["extra_msa"][p, e].astype(np.uint8).tobytes()]
            assert i in set(others)
            assert np.abs(deletion_value(dels[i]) - feats["extra_deletion_value"][p, e]).max() <= 1e-6
    aatype = torch.from_numpy(raw["aatype"].argmax(-1))
    tf = target_feat({"aatype": aatype}, torch.float32).numpy()
    assert np.array_equal(tf, feats["target_feat"][0])


def test_msa_letters_follow_hhblits():
    assert msa_row_to_ids("BZUJO-a").tolist() == [3, 6, 4, 20, 20, 21, 0]      # D E C X X - A
    assert sequence_to_ids("BZU").tolist() == [20, 20, 20]                     # aatype: X


def test_msa_profile_counts():
    msa = np.array([[0, 1], [0, 21], [2, 1], [0, 1]], np.uint8)
    p = msa_profile(msa)
    assert p.shape == (2, 23)
    assert p[0, 0] == 0.75 and p[0, 2] == 0.25 and p[1, 1] == 0.75 and p[1, 21] == 0.25


def test_collate_pads_with_zero_masks(store):
    a = featurize(store.read("5awl_A"), crop_size=64, max_msa_rows=8, seed=0)   # L=10, N=1
    b = featurize(store.read("2q2k_A"), crop_size=64, max_msa_rows=8, seed=0)   # L=64, N=8
    batch = collate([a, b])
    assert batch["msa"].shape == (2, 8, 64) and batch["backbone_positions"].shape == (2, 64, 5, 3)
    assert batch["all_atom_positions"].shape == (2, 64, 37, 3)
    assert batch["seq_mask"][0, :10].all() and not batch["seq_mask"][0, 10:].any()
    assert batch["msa_mask"][0, :1, :10].all() and batch["msa_mask"][0].sum() == 10
    assert (batch["aatype"][0, 10:] == 0).all() and (batch["msa"][0, 1:] == 0).all()
    assert batch["num_residues"].tolist() == [10, 64] and batch["family_id"] == ["5awl_A", "2q2k_A"]
    assert torch.equal(batch["msa"][1], b["msa"])
    passes = collate([featurize(store.read(f), crop_size=64, max_msa_rows=8, seed=0, msa_samples=2)
                      for f in ("5awl_A", "2q2k_A")])
    assert passes["msa"].shape == (2, 2, 8, 64) and passes["cluster_profile"].shape == (2, 2, 8, 64, 23)
    with pytest.raises(ValueError, match="rank"):
        collate([a, featurize(store.read("2q2k_A"), crop_size=64, max_msa_rows=8, seed=0, msa_samples=2)])


def test_featurize_query_without_structure(data_dir):
    msa = parse_msa(data_dir / "msa/2q2k_A.uniprot.sto")
    ex = featurize_query(msa.query, msa, max_msa_rows=8)
    assert ex["backbone_mask"].sum() == 0 and ex["all_atom_mask"].sum() == 0
    assert ex["msa"].shape == (min(8, msa.depth), 70) and torch.isnan(ex["resolution"])
    assert ex["bert_mask"].sum() == 0 and ex["extra_msa"].shape[0] == max(1, min(1024, msa.depth - 8))
    single = featurize_query("mqif vktl")
    assert single["aatype"].tolist() == sequence_to_ids("MQIFVKTL").tolist()
    with pytest.raises(InputError, match="non-letter"):
        featurize_query("MQ1F")
    with pytest.raises(InputError, match="does not match"):
        featurize_query("W" + msa.query[1:], msa)
