"""Weights read from a user's file, checked at the door (issue 47, "non-finite and mis-shaped
data refused"): every loader of model weights - the monomer model file and training checkpoint
(`protdp.train.checkpointing`), `multimer_model.pt` (`protdp.train.multimer_file`), a training
resume (`protdp.parallel.checkpoint`, the EMA file, DeepSpeed's engine), `protdp weights import`
of AlphaFold `.npz` and OpenFold `.pt` files, and so every ensemble member `predict` loads -
calls `weights_problem` / `check_weights` here, so one rule with one number decides:

* every entry a named, dense tensor (or array);
* floating values finite (a diverged run can save NaN);
* |w| <= `protdp.data.bounds.MAX_WEIGHT_MAGNITUDE` (1e4). Published AlphaFold / OpenFold
  parameters stay below ~ 100 (docs/weights.md, "Checkpoints that are refused",
  benchmarks/results/weight_magnitudes.json); a 1e30 weight is a corrupt or hostile file whose
  forward pass overflows to NaN.

The answer is one line naming the tensor; the caller's InputError adds the file.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from protdp.data.bounds import MAX_WEIGHT_MAGNITUDE
from protdp.errors import InputError


def value_problem(name: str, value) -> str | None:
    """Why one floating tensor / array cannot be a weight (None: it can, or it is not floating:
    integer buffers such as step counters are not weights)."""
    if torch.is_tensor(value):
        if not value.is_floating_point() or value.numel() == 0:
            return None
        finite = bool(torch.isfinite(value).all())
        peak = float(value.detach().abs().max()) if finite else 0.0
    elif isinstance(value, np.ndarray):
        if value.dtype.kind != "f" or value.size == 0:
            return None
        finite = bool(np.isfinite(value).all())
        peak = float(np.abs(value).max()) if finite else 0.0
    else:
        return None
    if not finite:
        return f"non-finite values (NaN/Inf) in weight '{name}'"
    if peak > MAX_WEIGHT_MAGNITUDE:
        return (f"weight '{name}' holds |w| = {peak:.3g} > {MAX_WEIGHT_MAGNITUDE:g} (the "
                "documented bound on weights, protdp.data.bounds.MAX_WEIGHT_MAGNITUDE)")
    return None


def weights_problem(state) -> str | None:
    """Why a state dict cannot be a model's weights (None: it can): a dict of tensors named by
    strings, dense, floating values finite and within MAX_WEIGHT_MAGNITUDE."""
    if not isinstance(state, Mapping):
        return f"weights are a {type(state).__name__}, expected a dict of named tensors"
    for name, value in state.items():
        if not isinstance(name, str) or not (torch.is_tensor(value)
                                             or isinstance(value, np.ndarray)):
            return f"entry {str(name)[:60]!r} is not a named tensor"
        if torch.is_tensor(value) and (value.layout != torch.strided
                                       or value.device.type == "meta"):
            return f"{name} is not a dense tensor"
    for name, value in state.items():
        problem = value_problem(name, value)
        if problem:
            return problem
    return None


def check_weights(state, path, field: str | None = None) -> None:
    """InputError (one line naming the file, the field and the tensor) when `state` cannot be a
    model's weights."""
    problem = weights_problem(state)
    if problem:
        raise InputError(problem, path=path, field=field)
