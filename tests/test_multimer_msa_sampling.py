"""AlphaFold-Multimer's in-model MSA sampling, masking and clustering
(protdp.model.multimer.msa) against DeepMind's JAX run: given the merged features and the row
order JAX's RNG drew in each recycling iteration (recorded in the fixture), msa_feat and the
extra-MSA mask equal AlphaFold's; the random order itself keeps each chain's query first and
padded rows last."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protdp.model.multimer.msa import MaskedMsaConfig, gumbel_order, sample_msa_features
from test_complex_pairing import CASES, FIXTURE

NO_MASKING = MaskedMsaConfig(replace_fraction=0.0)     # the fixture's config (README)


def _features(name):
    f = np.load(FIXTURE / f"features_{name}.npz")
    return {k: torch.from_numpy(np.asarray(f[k])) for k in
            ("msa", "deletion_matrix", "msa_mask", "cluster_bias_mask", "bert_mask")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_msa_feat_equals_alphafold_per_recycling_iteration(name):
    f = _features(name)
    rec = np.load(FIXTURE / f"sampled_msa_{name}.npz")
    for it in range(rec["index_order"].shape[0]):
        out = sample_msa_features(f["msa"], f["deletion_matrix"], f["msa_mask"],
                                  f["cluster_bias_mask"].float(), f["bert_mask"], num_msa=16,
                                  num_extra_msa=32, masking=NO_MASKING,
                                  order=torch.from_numpy(rec["index_order"][it]).long())
        want = rec["msa_feat"][it]
        got = out["msa_feat"].numpy()
        assert got.shape == want.shape == (16, f["msa"].shape[1], 49)
        assert np.abs(got - want).max() < 1e-6, (it, np.abs(got - want).max())
        assert np.array_equal(out["extra_msa_mask"].numpy(), rec["extra_msa_mask"][it])
        assert out["extra_msa_feat"].shape == (32, f["msa"].shape[1], 25)
        assert float(out["bert_mask"].sum()) == 0.0                  # nothing replaced


def test_random_order_keeps_queries_first_and_padding_last():
    f = _features("4hhb_hbA1-36_hbB1-40")
    g = torch.Generator().manual_seed(0)
    orders = [gumbel_order(f["msa_mask"], f["cluster_bias_mask"].float(), g) for _ in range(3)]
    real = int((f["msa_mask"].sum(-1) > 0).sum())                      # 323 rows
    for o in orders:
        assert sorted(o.tolist()) == list(range(512))
        assert o[0] == 0                                              # the paired query row
        assert set(o[:real].tolist()) == set(range(real))             # padding never sampled
    assert not torch.equal(orders[0], orders[1])


def test_bert_masking_replaces_only_unpadded_positions():
    f = _features("2p90_A02_x2")
    g = torch.Generator().manual_seed(1)
    out = sample_msa_features(f["msa"], f["deletion_matrix"], f["msa_mask"],
                              f["cluster_bias_mask"].float(), num_msa=64, num_extra_msa=32,
                              masking=MaskedMsaConfig(replace_fraction=0.5), generator=g)
    replaced = out["bert_mask"] > 0
    frac = float(replaced.float().mean())
    assert 0.4 < frac < 0.6
    assert torch.all(out["msa_mask"][replaced] > 0)
    changed = out["msa_feat"][..., :23].argmax(-1) != out["true_msa"]
    assert torch.all(replaced[changed])                                # only replaced differ
