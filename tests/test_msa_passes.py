"""Per-pass MSA samples built when the pass asks for them (`protdp.data.msa_passes`, issue 47
"memory per recycle is bounded"): each pass bit for bit the up-front layout's sample, the
model's outputs and losses identical, and no tensor with a pass axis ever built."""

import pickle

import numpy as np
import pytest
import torch

from model_fixtures import one_thread, tiny_config  # noqa: F401
from protdp.data.features import MSA_KEYS, PASSES_KEY, collate, featurize, featurize_query
from protdp.data.msa_passes import MsaPasses, featurize_passes, query_features
from protdp.data.parse import Msa
from protdp.errors import InputError
from protdp.model import build_model
from protdp.model.inputs import check_batch, num_passes, select_pass
from protdp.model.losses import compute_loss

AA = list("ACDEFGHIKLMNPQRSTVWY")
KW = dict(max_msa_rows=8, max_extra_msa_rows=40, masked_msa_fraction=0.15)


def deep_msa(L: int = 30, N: int = 120, seed: int = 0) -> tuple[str, Msa]:
    """A synthetic MSA deeper than the cluster and extra caps (so every step samples)."""
    rng = np.random.default_rng(seed)
    seq = "".join(rng.choice(AA, L))
    rows = [seq] + ["".join(c if rng.random() < 0.6 else rng.choice(AA + ["-"]) for c in seq)
                    for _ in range(N - 1)]
    dels = rng.integers(0, 5, (N, L)).astype(np.uint8) * (rng.random((N, L)) < 0.2)
    return seq, Msa(rows, dels.astype(np.uint8), [f"r{i}" for i in range(N)])


def tensor_bytes(feats: dict) -> int:
    """Bytes of every tensor and pass-source array an example / batch holds."""
    total = sum(v.numel() * v.element_size() for v in feats.values() if torch.is_tensor(v))
    sources = feats.get(PASSES_KEY)
    for s in ([] if sources is None else getattr(sources, "sources", [sources])):
        total += sum(a.nbytes for a in (s.msa, s.deletions, s.profile) if a is not None)
    return total


def test_each_pass_is_the_up_front_sample_bit_for_bit():
    seq, msa = deep_msa()
    P = 6
    full = featurize_query(seq, msa, seed=7, msa_samples=P, **KW)
    lazy = query_features(seq, msa, seed=7, msa_samples=P, **KW)
    source = lazy[PASSES_KEY]
    shipped = pickle.loads(pickle.dumps(source))          # prefetch workers / DAP broadcast
    assert shipped.produced == [] and source.produced == [0]
    for i in reversed(range(P)):                            # any order: each its own stream
        for got in (source.sample(i), shipped.sample(i)):
            for k in MSA_KEYS:
                assert got[k].dtype == full[k].dtype and torch.equal(got[k], full[k][i]), (i, k)
    assert any(not torch.equal(full["msa"][0], full["msa"][i]) for i in range(1, P))
    for k in MSA_KEYS:                                      # the example's own keys: pass 0
        assert torch.equal(lazy[k], full[k][0])
    for k in set(full) - set(MSA_KEYS) - {"family_id"}:
        assert torch.equal(lazy[k], full[k]) or k == "resolution" and lazy[k].isnan(), k
    with pytest.raises(IndexError):
        source.sample(P)


def test_training_crop_and_one_sample_match_featurize():
    """A cropped training example (shared crop, BERT 0.15) and P = 1 (no source at all)."""
    seq, msa = deep_msa(L=50, N=90, seed=3)
    family = {"family_id": "x", "msa": msa.tokens(), "deletion_matrix": msa.deletion_matrix,
              "all_atom_positions": np.ones((50, 37, 3), np.float32),
              "all_atom_mask": np.ones((50, 37), np.float32),
              "residue_index": np.arange(50), "sequence": seq, "resolution": 2.0}
    kw = dict(crop_size=32, max_msa_rows=8, seed=11, max_extra_msa_rows=30)
    full = featurize(family, msa_samples=3, **kw)
    lazy = featurize_passes(family, msa_samples=3, **kw)
    for i in range(3):
        got = lazy[PASSES_KEY].sample(i)
        assert all(torch.equal(got[k], full[k][i]) for k in MSA_KEYS)
    one = featurize_passes(family, msa_samples=1, **kw)
    assert PASSES_KEY not in one
    single = featurize(family, msa_samples=1, **kw)
    assert all(torch.equal(one[k], single[k]) for k in single if torch.is_tensor(single[k]))


def test_held_memory_does_not_grow_with_passes():
    seq, msa = deep_msa()
    sizes = {P: tensor_bytes(query_features(seq, msa, msa_samples=P, **KW)) for P in (2, 201)}
    assert sizes[2] == sizes[201]
    up_front = tensor_bytes(featurize_query(seq, msa, msa_samples=21, **KW))
    assert up_front > 10 * sizes[2]                        # what the layout it replaces held


def test_model_reads_each_pass_once_with_no_pass_axis():
    """Two seeds batched (`ensemble.model_batch` collates them): outputs and losses equal the
    up-front layout's; the model is handed [B, N, L] per pass and each pass is built once."""
    seq, msa = deep_msa()
    torch.manual_seed(0)
    model = build_model(tiny_config(), verbose=False).eval()
    P, n = 4, 3
    full = collate([featurize_query(seq, msa, seed=s, msa_samples=P, **KW) for s in (1, 2)])
    lazy = collate([query_features(seq, msa, seed=s, msa_samples=P, **KW) for s in (1, 2)])
    assert num_passes(lazy) == num_passes(full) == P
    shapes, iteration = [], model.iteration

    def spy(batch, prev):
        shapes.append({k: tuple(batch[k].shape) for k in MSA_KEYS})
        assert PASSES_KEY not in batch
        return iteration(batch, prev)

    with torch.no_grad():
        ref = model(full, num_recycles=n)
        model.iteration = spy
        out = model(lazy, num_recycles=n)
    for k in ("final_atom_positions", "plddt", "distogram_logits", "masked_msa_logits"):
        assert torch.equal(out[k], ref[k]), k
    assert shapes == [{k: tuple(full[k].shape[:1] + full[k].shape[2:]) for k in MSA_KEYS}] * (n + 1)
    assert [s.produced for s in lazy[PASSES_KEY].sources] == [[0, 1, 2, 3]] * 2
    assert out["msa_sample"] == ref["msa_sample"] == 3
    # the losses read the last pass's sample (training's consumer of select_pass)
    model.train()
    out_full = model(full, num_recycles=1)
    torch.manual_seed(0)
    loss_ref, _ = compute_loss(out_full, full, model.config)
    loss_lazy, _ = compute_loss(out_full, lazy, model.config)
    assert torch.equal(loss_ref, loss_lazy)


def test_passes_beyond_the_samples_read_the_last_and_bad_batches_are_refused():
    seq, msa = deep_msa()
    lazy = collate([query_features(seq, msa, msa_samples=3, **KW)])
    full = collate([featurize_query(seq, msa, msa_samples=3, **KW)])
    late, ref = select_pass(lazy, 9), select_pass(full, 9)
    assert all(torch.equal(late[k], ref[k]) for k in MSA_KEYS) and PASSES_KEY not in late
    with pytest.raises(InputError, match=PASSES_KEY):
        check_batch({**full, PASSES_KEY: lazy[PASSES_KEY]})
    one = query_features(seq, msa, msa_samples=1, **KW)
    with pytest.raises(ValueError, match=PASSES_KEY):
        collate([query_features(seq, msa, msa_samples=3, **KW), one])
    with pytest.raises(ValueError, match="number of MSA samples"):
        collate([query_features(seq, msa, msa_samples=3, **KW),
                 query_features(seq, msa, msa_samples=4, **KW)])
    assert isinstance(lazy[PASSES_KEY].sources[0], MsaPasses)


def test_predictor_features_are_per_pass_and_shippable():
    """`Predictor.features` (what `ensemble` and the prefetch workers hand the model): pass 0's
    keys and a picklable source of 1 + num_recycles samples, each the up-front sample."""
    from types import SimpleNamespace

    from protdp.inference.predictor import PredictConfig, Predictor

    seq, msa = deep_msa()
    config = PredictConfig(num_recycles=4, max_msa_rows=8, max_extra_msa_rows=40, seed=5)
    feats = Predictor.features(SimpleNamespace(config=config, loaded=None), seq, msa, "t")
    full = featurize_query(seq, msa, seed=5, msa_samples=5, family_id="t", **KW)
    source = pickle.loads(pickle.dumps(feats[PASSES_KEY]))
    assert source.num_passes == 5
    assert all(feats[k].dim() == full[k].dim() - 1 for k in MSA_KEYS)     # no pass axis
    got = source.sample(4)
    assert all(torch.equal(got[k], full[k][4]) for k in MSA_KEYS)
