"""Loading a multimer checkpoint for prediction and for its release checks: a folder holding
`multimer_model.pt` (`protdp weights import` of params_model_N_multimer_v3.npz, or the EMA
weights a run fine-tuned on complexes writes, `protdp.train.complex`). `protdp predict` and
`protdp release` load it here, so the release record binds to the digest predict checks
(the sha256 of multimer_model.pt) and both refuse NaN/Inf weights alike."""

from __future__ import annotations

from pathlib import Path

import torch

from protdp.errors import InputError
from protdp.fileio import sha256_file
from protdp.inference.checkpoint import MULTIMER_KIND, MULTIMER_MODEL_FILE, LoadedModel
from protdp.model.multimer.model import MultimerModel
from protdp.train.checkpointing import TrainedWeights, merged_weights
from protdp.train.complex import read_multimer_checkpoint


def load_multimer_checkpoint(path: str | Path, device: str | torch.device = "cpu"
                             ) -> LoadedModel:
    """The folder (or its model file) -> LoadedModel in eval mode on `device`."""
    path = Path(path).resolve()
    folder = path if path.is_dir() else path.parent
    file = folder / MULTIMER_MODEL_FILE
    cfg, state = read_multimer_checkpoint(folder)
    merged, _ = merged_weights(TrainedWeights(file, {}, state, None, ""))   # NaN/Inf refused
    model = MultimerModel(cfg)
    try:
        model.load_state_dict(merged, strict=True)
    except RuntimeError as exc:
        raise InputError(f"weights do not fit the config: {str(exc).splitlines()[0]}",
                         path=file) from None
    return LoadedModel(model.to(device).eval(), cfg, folder, sha256_file(file), MULTIMER_KIND,
                       "imported", None, None)
