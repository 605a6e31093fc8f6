"""Overfit: the small config trained on one real chain (2p90_A02, 45 residues, single-sequence
MSA) reaches lDDT-Cα >= 0.85 against the experimental structure on CPU.

Input: protdp.data.parse.parse_structure + protdp.data.features.featurize (evaluation mode:
no crop, no BERT masking). Overrides of configs/model/small.yaml, as is usual for an overfit
check: dropout off and unclamped FAPE (AF2 trains 10 % of batches unclamped; clamped FAPE
alone needs far more steps to escape a mirrored-topology minimum on this chain). The full AF2
loss is used otherwise. Training stops as soon as the target is met (checked every 50 steps).
The training itself is `model_fixtures.overfitted_2p90`, run once per session: test_relax
relaxes the same prediction.
"""

import torch

from protdp.metrics import lddt_ca
from protdp.model import build_model
from model_fixtures import OVERFIT_TARGET_LDDT, one_thread, overfitted_2p90  # noqa: F401


def test_small_model_overfits_one_real_chain(data_dir):
    run = overfitted_2p90(data_dir / "structures")
    batch, history = run["batch"], run["history"]
    assert batch["aatype"].shape == (45,)
    print("overfit (step, lddt_ca, rmsd_ca, seconds):", history)
    assert OVERFIT_TARGET_LDDT == 0.85 and history[-1][1] >= OVERFIT_TARGET_LDDT, history
    true_ca, ca_mask = batch["backbone_positions"][:, 1], batch["backbone_mask"][:, 1]
    with torch.no_grad():             # the returned outputs are the trained model's
        pred_ca = run["model"](batch, num_recycles=0)["final_atom_positions"][:, 1]
    assert torch.equal(pred_ca, run["out"]["final_atom_positions"][:, 1])
    assert abs(lddt_ca(pred_ca, true_ca, ca_mask) - history[-1][1]) < 5e-4
    # the untrained model is far from it, so the test can fail
    torch.manual_seed(0)
    untrained = build_model(run["cfg"], verbose=False).eval()
    with torch.no_grad():
        assert lddt_ca(untrained(batch, num_recycles=0)["final_atom_positions"][:, 1], true_ca, ca_mask) < 0.5
