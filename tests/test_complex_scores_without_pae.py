"""`complexes.complex_scores` (scores.json's complex keys) no longer rounds the [L, L] PAE one
value at a time only to drop it (it is not in COMPLEX_SCORE_KEYS): `confidence_json(...,
with_pae=False)` never reads it, every score key is unchanged, and the written complex
confidence JSON still holds the rounded PAE."""

from __future__ import annotations

import numpy as np
import torch

from protdp.complex.outputs import confidence_json
from protdp.inference.complexes import COMPLEX_SCORE_KEYS, complex_scores

CHAINS = [("A", "MKV"), ("B", "GSWL")]
L = 7


class Untouchable:
    """A PAE that fails the test when anything reads it."""

    def __getattr__(self, name):
        raise AssertionError(f"the PAE was read ({name})")

    def __iter__(self):
        raise AssertionError("the PAE was iterated")


def _top(pae):
    rng = np.random.default_rng(3)
    return {"plddt": torch.from_numpy(rng.uniform(30, 95, L)), "ptm": torch.tensor(0.61),
            "iptm": torch.tensor(0.47), "chain_pair_iptm": torch.from_numpy(rng.random((2, 2))),
            "interface_pae": torch.tensor(7.123456),
            "chain_pair_pae": torch.from_numpy(rng.uniform(1, 20, (2, 2))), "pae": pae,
            "interface_scores": [{"type": "max", "chain_1": "A", "chain_2": "B", "ipsae": 0.3,
                                  "pdockq2": 0.2}]}


def test_complex_scores_never_read_the_pae_and_keep_every_key():
    pae = np.random.default_rng(5).uniform(0, 31.75, (L, L))
    top = _top(torch.from_numpy(pae))
    full = confidence_json(CHAINS, top["plddt"], {**top, "ranking_confidence":
                                                  0.8 * top["iptm"] + 0.2 * top["ptm"]})
    assert np.abs(np.array(full["pae"]) - pae).max() <= 0.005 + 1e-12     # still written
    scores = complex_scores(CHAINS, _top(Untouchable()))
    assert list(scores) == list(COMPLEX_SCORE_KEYS)
    for key in COMPLEX_SCORE_KEYS:
        if key not in ("interface_scores", "best_interface"):
            assert scores[key] == full[key], key
    assert scores["best_interface"] == {"chain_1": "A", "chain_2": "B", "ipsae": 0.3,
                                        "pdockq2": 0.2}
    lean = confidence_json(CHAINS, top["plddt"], {**_top(Untouchable()), "ranking_confidence":
                                                  0.5}, with_pae=False)
    assert "pae" not in lean and lean["chains"] == full["chains"]
