"""Features per docs/batch_format.md: crop, MSA sampling, BERT masking, deletion features,
collate padding, determinism, inference features without structure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from data_fixtures import build_pairs_store
from protdp.data.features import collate, featurize, featurize_query, msa_profile
from protdp.data.parse import parse_msa
from protdp.data.residues import MASK_ID, sequence_to_ids
from protdp.data.store import FamilyStore
from protdp.errors import InputError

CONTRACT = {  # key -> (dtype, number of dims unbatched)
    "aatype": (torch.int64, 1), "residue_index": (torch.int64, 1), "seq_mask": (torch.float32, 1),
    "msa": (torch.int64, 2), "msa_mask": (torch.float32, 2), "has_deletion": (torch.float32, 2),
    "deletion_value": (torch.float32, 2), "true_msa": (torch.int64, 2),
    "bert_mask": (torch.float32, 2), "backbone_positions": (torch.float32, 3),
    "backbone_mask": (torch.float32, 2), "resolution": (torch.float32, 0),
    "num_residues": (torch.int64, 0),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir):
    ids = {"2q2k_A", "5awl_A", "2p90_A02", "4hhb_B"}
    tmp = tmp_path_factory.mktemp("feat")
    return FamilyStore(build_pairs_store(data_dir, ids, tmp))


def test_contract_keys_dtypes_shapes(store):
    ex = featurize(store.read("2q2k_A"), crop_size=32, max_msa_rows=8, seed=0)
    assert set(ex) == set(CONTRACT) | {"family_id"} and ex["family_id"] == "2q2k_A"
    for key, (dtype, ndim) in CONTRACT.items():
        assert ex[key].dtype == dtype and ex[key].dim() == ndim, key
    L, N = 32, 8
    assert ex["aatype"].shape == (L,) and ex["msa"].shape == (N, L)
    assert ex["backbone_positions"].shape == (L, 5, 3) and ex["num_residues"].item() == L


def test_crop_is_contiguous_and_matches_store(store):
    fam = store.read("4hhb_B")
    starts = set()
    for seed in range(8):
        ex = featurize(fam, crop_size=40, max_msa_rows=16, seed=seed)
        ri = ex["residue_index"].numpy()
        s = int(ri[0])
        starts.add(s)
        np.testing.assert_array_equal(ri, np.arange(s, s + 40))
        np.testing.assert_array_equal(ex["backbone_positions"].numpy(),
                                      fam["backbone_positions"][s:s + 40])
        np.testing.assert_array_equal(ex["backbone_mask"].numpy(), fam["backbone_mask"][s:s + 40])
        np.testing.assert_array_equal(ex["aatype"].numpy(),
                                      sequence_to_ids(fam["sequence"][s:s + 40]))
        np.testing.assert_array_equal(ex["true_msa"][0].numpy(), fam["msa"][0, s:s + 40])
        # every sampled row is a row of the cropped MSA
        rows = {r.tobytes() for r in fam["msa"][:, s:s + 40]}
        assert all(r.astype(np.uint8).tobytes() in rows for r in ex["true_msa"].numpy())
    assert len(starts) > 1                                     # random crop start


def test_deterministic_given_seed(store):
    fam = store.read("4hhb_B")
    a = featurize(fam, crop_size=64, max_msa_rows=32, seed=7)
    b = featurize(fam, crop_size=64, max_msa_rows=32, seed=7)
    c = featurize(fam, crop_size=64, max_msa_rows=32, seed=8)
    for k in CONTRACT:
        assert torch.equal(a[k], b[k]) or (k == "resolution" and a[k].isnan() and b[k].isnan())
    assert not torch.equal(a["msa"], c["msa"])


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


def test_deletion_features_follow_formula(store):
    fam = store.read("2p90_A02")
    ex = featurize(fam, crop_size=None, max_msa_rows=10_000, seed=0, training=False)
    d = fam["deletion_matrix"].astype(np.float64)
    np.testing.assert_allclose(ex["deletion_value"].numpy(), 2 / np.pi * np.arctan(d / 3),
                               atol=1e-6)
    np.testing.assert_array_equal(ex["has_deletion"].numpy(), (d > 0).astype(np.float32))
    assert ex["bert_mask"].sum() == 0 and torch.equal(ex["msa"], ex["true_msa"])


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
    assert batch["seq_mask"][0, :10].all() and not batch["seq_mask"][0, 10:].any()
    assert batch["msa_mask"][0, :1, :10].all() and batch["msa_mask"][0].sum() == 10
    assert (batch["aatype"][0, 10:] == 0).all() and (batch["msa"][0, 1:] == 0).all()
    assert batch["num_residues"].tolist() == [10, 64] and batch["family_id"] == ["5awl_A",
                                                                                 "2q2k_A"]
    assert torch.equal(batch["msa"][1], b["msa"])


def test_featurize_query_without_structure(data_dir):
    msa = parse_msa(data_dir / "msa/2q2k_A.uniprot.sto")
    ex = featurize_query(msa.query, msa, max_msa_rows=8)
    assert ex["backbone_mask"].sum() == 0 and ex["backbone_positions"].abs().sum() == 0
    assert ex["msa"].shape == (min(8, msa.depth), 70) and torch.isnan(ex["resolution"])
    assert ex["bert_mask"].sum() == 0
    single = featurize_query("mqif vktl")
    assert single["aatype"].tolist() == sequence_to_ids("MQIFVKTL").tolist()
    with pytest.raises(InputError, match="non-letter"):
        featurize_query("MQ1F")
    with pytest.raises(InputError, match="does not match"):
        featurize_query("W" + msa.query[1:], msa)
