"""AlphaFold-Multimer model pieces without templates: the relative position + chain encoding
(protdp.model.multimer.embedders) and the complex confidence read-outs pTM, ipTM, ranking
confidence and the chain-pair ipTM matrix (protdp.model.multimer.heads), against DeepMind's JAX
AlphaFold v2.3.2 fixture (its PAE logits -> its pTM / ipTM / ranking confidence) and against the
formulas written out here in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protdp.model.multimer.embedders import (RelativeChainEncoding, relative_chain_dim,
                                             relative_chain_features)
from protdp.model.multimer.heads import (chain_pair_iptm, complex_confidence, predicted_tm,
                                         ranking_confidence)
from test_complex_pairing import CASES, FIXTURE

PARAM = "alphafold/alphafold_iteration/evoformer/~_relative_encoding/position_activations//"


def _centres(breaks: np.ndarray) -> torch.Tensor:
    step = breaks[1] - breaks[0]
    c = breaks + step / 2
    return torch.from_numpy(np.concatenate([c, [c[-1] + step]]))


def _tm_numpy(logits, centres, weights, asym=None):
    """Eq. 40 / AF-Multimer ipTM written out directly (float64)."""
    centres = np.asarray(centres, np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    n = max(int(weights.sum()), 19)
    d0 = 1.24 * (n - 15) ** (1 / 3) - 1.8
    term = (p / (1 + (centres / d0) ** 2)).sum(-1)                  # [L, L]
    pw = np.outer(weights, weights)
    if asym is not None:
        pw = pw * (asym[:, None] != asym[None, :])
    best = -1.0
    for i in np.nonzero(weights)[0]:
        best = max(best, (term[i] * pw[i]).sum() / (pw[i].sum() + 1e-8))
    return best


@pytest.fixture(scope="module", params=sorted(CASES))
def outputs(request):
    z = np.load(FIXTURE / f"outputs_{request.param}.npz")
    return {k: z[k] for k in z.files}


def test_ptm_iptm_ranking_match_alphafold(outputs):
    logits = torch.from_numpy(outputs["predicted_aligned_error/logits"])        # float32
    centres = _centres(outputs["predicted_aligned_error/breaks"])
    asym = torch.from_numpy(outputs["predicted_aligned_error/asym_id"])
    conf = complex_confidence(logits, centres, asym)
    for key in ("ptm", "iptm", "ranking_confidence"):
        assert abs(float(conf[key]) - float(outputs[f"confidence/{key}"])) < 1e-6, key
    pae = outputs["confidence/predicted_aligned_error"]
    assert np.abs(conf["pae"].numpy() - pae).max() < 1e-4
    a = asym.numpy()
    cross = a[:, None] != a[None, :]
    assert abs(float(conf["interface_pae"]) - pae[cross].mean()) < 1e-4
    for i, ci in enumerate((1.0, 2.0)):
        for j, cj in enumerate((1.0, 2.0)):
            block = pae[np.ix_(a == ci, a == cj)]
            assert abs(float(conf["chain_pair_pae"][i, j]) - block.mean()) < 1e-4
    # the tolerance holds in bf16 logits too (read-outs run in float32)
    bf = complex_confidence(logits.to(torch.bfloat16), centres, asym)
    assert abs(float(bf["iptm"]) - float(outputs["confidence/iptm"])) < 1e-2
    assert bf["iptm"].dtype == torch.float32


def test_chain_pair_iptm_matrix(outputs):
    logits = outputs["predicted_aligned_error/logits"].astype(np.float64)
    centres = _centres(outputs["predicted_aligned_error/breaks"])
    asym = outputs["predicted_aligned_error/asym_id"]
    m, chains = chain_pair_iptm(torch.from_numpy(logits), centres, torch.from_numpy(asym))
    assert chains.tolist() == [1.0, 2.0] and torch.equal(m, m.T)
    # a dimer's only chain pair is the whole interface: AlphaFold's ipTM
    assert abs(float(m[0, 1]) - float(outputs["confidence/iptm"])) < 1e-6
    for a, cid in enumerate((1.0, 2.0)):               # the diagonal: pTM of the chain alone
        w = (asym == cid).astype(np.float64)
        assert abs(float(m[a, a]) - _tm_numpy(logits, centres.numpy(), w)) < 1e-9


def test_chain_pair_iptm_three_chains_against_the_formula():
    g = torch.Generator().manual_seed(0)
    asym = torch.tensor([1] * 7 + [2] * 9 + [3] * 6, dtype=torch.float64)
    logits = torch.randn(22, 22, 64, generator=g, dtype=torch.float64) * 3
    centres = _centres(np.linspace(0, 31, 63))
    m, _ = chain_pair_iptm(logits, centres, asym)
    a = asym.numpy()
    for i, ci in enumerate((1, 2, 3)):
        for j, cj in enumerate((1, 2, 3)):
            w = ((a == ci) | (a == cj)).astype(np.float64)
            ref = _tm_numpy(logits.numpy(), centres.numpy(), w, None if i == j else a)
            assert abs(float(m[i, j]) - ref) < 1e-9, (i, j)
    # the complex scores: written out the same way
    assert abs(float(predicted_tm(logits, centres)) -
               _tm_numpy(logits.numpy(), centres.numpy(), np.ones(22))) < 1e-9
    iptm = predicted_tm(logits, centres, asym_id=asym)
    assert abs(float(iptm) - _tm_numpy(logits.numpy(), centres.numpy(), np.ones(22), a)) < 1e-9
    rc = ranking_confidence(torch.tensor(0.5, dtype=torch.float64),
                            torch.tensor(0.25, dtype=torch.float64))
    assert abs(float(rc) - (0.8 * 0.5 + 0.2 * 0.25)) < 1e-12


def test_relative_chain_features_by_hand():
    # A, B: two copies of entity 1 (sym 1, 2), 3 residues; C: entity 2, 2 residues; the last
    # residue of A is numbered 100 (a gap in numbering, clipped at +-32)
    ri = torch.tensor([0, 1, 100, 0, 1, 2, 0, 1])
    asym = torch.tensor([1, 1, 1, 2, 2, 2, 3, 3])
    ent = torch.tensor([1, 1, 1, 1, 1, 1, 2, 2])
    sym = torch.tensor([1, 1, 1, 2, 2, 2, 1, 1])
    f = relative_chain_features(ri, asym, ent, sym)
    assert f.shape == (8, 8, 73) and relative_chain_dim() == 73
    assert torch.all(f.sum(-1) == 2 + ent[:, None].eq(ent[None, :]))   # two one-hots + flag
    pos, same, chain = f[..., :66], f[..., 66], f[..., 67:]
    hot = lambda v: int(torch.nonzero(v)[0, 0])                          # noqa: E731
    assert hot(pos[0, 1]) == 32 - 1 and hot(pos[1, 0]) == 33          # r_i - r_j + 32
    assert hot(pos[0, 2]) == 0 and hot(pos[2, 0]) == 64                # clipped at -32 / +32
    assert hot(pos[0, 3]) == 65 and hot(pos[0, 6]) == 65               # other chain: bin 2k+1
    assert same[0, 3] == 1 and same[0, 6] == 0 and same[6, 7] == 1
    assert hot(chain[0, 1]) == 2 and hot(chain[0, 3]) == 1 and hot(chain[3, 0]) == 3
    assert hot(chain[0, 6]) == 5                                       # other entity: 2c+1


def test_relative_chain_encoding_loads_alphafold_parameters():
    p = np.load(FIXTURE / "params" / "params_model_1_multimer_v3_small.npz")
    w, b = p[PARAM + "weights"], p[PARAM + "bias"]                     # [73, 16], [16]
    feats = np.load(FIXTURE / "features_4hhb_hbA1-36_hbB1-40.npz")
    enc = RelativeChainEncoding(c_z=w.shape[1])
    with torch.no_grad():
        enc.linear.weight.copy_(torch.from_numpy(w.T))
        enc.linear.bias.copy_(torch.from_numpy(b))
    ids = {k: torch.from_numpy(feats[k]) for k in ("residue_index", "asym_id", "entity_id",
                                                   "sym_id")}
    z = enc(ids["residue_index"], ids["asym_id"], ids["entity_id"], ids["sym_id"])
    f = relative_chain_features(*ids.values()).numpy()
    assert z.shape == (76, 76, 16)
    assert np.allclose(z.detach().numpy(), f @ w + b, atol=1e-6)
    # heterodimer: chains differ in entity, so every cross-chain pair reads the same row sum
    cross = f[0, 40]
    assert cross[65] == 1 and cross[66] == 0 and cross[72] == 1


def test_monomer_config_refuses_multimer_parameters():
    from protdp.errors import InputError
    from protdp.weights.alphafold import infer_config

    p = np.load(FIXTURE / "params" / "params_model_1_multimer_v3_small.npz")
    with pytest.raises(InputError, match="AlphaFold-Multimer parameters .* multimer model"):
        infer_config({k: p[k].shape for k in p.files})


def test_multimer_input_embedder_with_alphafold_parameters():
    """AlphaFold's arrays load by name; m / z / extra activations are the linear maps of
    one_hot(aatype, 21), the recorded msa_feat and the relative encoding, written out here."""
    from protdp.model.multimer.embedders import MultimerInputEmbedder
    from protdp.model.multimer.msa import extra_msa_feat

    p = np.load(FIXTURE / "params" / "params_model_1_multimer_v3_small.npz")
    f = np.load(FIXTURE / "features_4hhb_hbA1-36_hbB1-40.npz")
    rec = np.load(FIXTURE / "sampled_msa_4hhb_hbA1-36_hbB1-40.npz")
    arrays = {k: p[k] for k in p.files}
    emb = MultimerInputEmbedder(c_m=32, c_z=16, c_e=8)
    emb.load_alphafold(arrays)
    ids = [torch.from_numpy(f[k]) for k in ("residue_index", "asym_id", "entity_id", "sym_id")]
    order = rec["index_order"][0]
    ef, _ = extra_msa_feat(torch.from_numpy(f["msa"][order[16:]]),
                           torch.from_numpy(f["deletion_matrix"][order[16:]]),
                           torch.from_numpy(f["msa_mask"][order[16:]]), 32)
    m, z, e = emb(torch.from_numpy(f["aatype"]), *ids, torch.from_numpy(rec["msa_feat"][0]), ef)
    E = "alphafold/alphafold_iteration/evoformer/"
    lin = lambda name, x: x @ arrays[E + name + "//weights"] + arrays[E + name + "//bias"]  # noqa: E731
    tf = np.eye(21, dtype=np.float32)[f["aatype"]]
    assert np.allclose(m.detach().numpy(), lin("preprocess_1d", tf)[None] +
                       lin("preprocess_msa", rec["msa_feat"][0]), atol=1e-5)
    rel = relative_chain_features(*ids).numpy()
    z_ref = (lin("left_single", tf)[:, None] + lin("right_single", tf)[None] +
             lin("~_relative_encoding/position_activations", rel))
    assert np.allclose(z.detach().numpy(), z_ref, atol=1e-5)
    assert np.allclose(e.detach().numpy(), lin("extra_msa_activations", ef.numpy()), atol=1e-5)
    arrays[E + "left_single//weights"] = arrays[E + "left_single//weights"][:20]
    with pytest.raises(ValueError, match="left_single: shape"):
        emb.load_alphafold(arrays)
