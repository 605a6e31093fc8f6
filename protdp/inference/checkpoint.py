"""Load model weights for prediction from a training run or a single model file.

Two layouts are understood (AF2 ships the EMA of the weights, supplement 1.11.7, so the EMA is
preferred whenever a checkpoint carries one):

1. A training checkpoint (Megatron `--save` layout): the run folder (newest complete `iter_N/`)
   or one `iter_N/` folder, read through `protdp.train.checkpointing.read_weights`, the owner of
   that layout (`config.model` = ModelConfig fields, `config.crop_size`, `config.max_msa_rows`,
   the raw weights and the EMA shadow, which overrides them).
2. A plain model file written by `save_model_checkpoint` (format `protdp-model-v1`): model
   config, state dict, optional EMA shadow and the training crop / MSA depth it was trained on.

`sha256` identifies the weights for provenance: the file's SHA-256, or for a training folder the
digest `read_weights` computes over the files it read, so the same checkpoint always gets the
same digest wherever it is stored.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from protdp.config import load_config, to_dict
from protdp.errors import InputError
from protdp.model.config import ModelConfig
from protdp.model.model import AlphaFoldModel
from protdp.fileio import sha256_file  # noqa: F401  (re-exported)
from protdp.train.checkpointing import load_cpu, read_weights, resolve_iteration_dir

MODEL_FILE_FORMAT = "protdp-model-v1"


@dataclass
class LoadedModel:
    """A model ready for inference plus what provenance and the gate need to know about it."""

    model: AlphaFoldModel
    config: ModelConfig
    path: Path                   # the file or iter_N folder actually read
    sha256: str
    kind: str                    # "model-file" | "training-checkpoint"
    weights: str                 # "ema" | "raw"
    training_crop: int | None    # longest crop seen in training (gate: length_beyond_training_crop)
    max_msa_rows: int | None     # MSA rows per example in training (None = unknown)
    iteration: int | None = None

    def describe(self) -> dict:
        return {"path": str(self.path), "sha256": self.sha256, "kind": self.kind,
                "weights": self.weights, "iteration": self.iteration,
                "training_crop": self.training_crop, "max_msa_rows": self.max_msa_rows,
                "num_parameters": self.model.num_parameters()}


def save_model_checkpoint(model: AlphaFoldModel, config: ModelConfig | None, path: str | Path, *,
                          ema_shadow: dict | None = None, training_crop: int | None = None,
                          max_msa_rows: int | None = None) -> Path:
    """Write a single-file model checkpoint (atomic: temp file + rename). Returns the path."""
    config = config if config is not None else model.config
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"format": MODEL_FILE_FORMAT, "model_config": to_dict(config),
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "ema_shadow": None if ema_shadow is None else {k: v.detach().cpu().float()
                                                           for k, v in ema_shadow.items()},
            "training_crop": training_crop, "max_msa_rows": max_msa_rows}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    return path


def _check_finite(state: dict, source: Path) -> None:
    """A diverged run can save NaN/Inf weights; refuse them before they produce predictions."""
    for name, value in state.items():
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise InputError(f"non-finite values (NaN/Inf) in weight '{name}'", path=source)


def _build(config_dict: dict, state: dict, ema: dict | None, source: Path,
           device: torch.device) -> tuple[AlphaFoldModel, str]:
    config = load_config(ModelConfig, config_dict)
    model = AlphaFoldModel(config).to(device)
    merged = dict(state)
    weights = "raw"
    if ema:
        unknown = sorted(set(ema) - set(merged))
        if unknown:
            raise InputError(f"EMA has entries the model lacks: {unknown[:3]}", path=source)
        merged.update({k: v.to(merged[k].dtype) for k, v in ema.items()})
        weights = "ema"
    _check_finite(merged, source)
    try:
        model.load_state_dict(merged, strict=True)
    except RuntimeError as exc:
        raise InputError(f"weights do not fit the model config: {str(exc).splitlines()[0]}",
                         path=source) from None
    model.eval()
    return model, weights


def _positive_int_or_none(value) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return int(value)
    return None


def _load_model_file(path: Path, device: torch.device) -> LoadedModel:
    blob = load_cpu(path)
    if not isinstance(blob, dict) or blob.get("format") != MODEL_FILE_FORMAT:
        raise InputError(f"not a protdp model checkpoint (expected format '{MODEL_FILE_FORMAT}'; "
                         "a training run is given as its folder)", path=path)
    model, weights = _build(blob["model_config"], blob["state_dict"], blob.get("ema_shadow"), path,
                            device)
    return LoadedModel(model, model.config, path, sha256_file(path), "model-file", weights,
                       _positive_int_or_none(blob.get("training_crop")),
                       _positive_int_or_none(blob.get("max_msa_rows")))


def _load_training_dir(path: Path, device: torch.device) -> LoadedModel:
    trained = read_weights(path)
    config = trained.meta["config"]
    model, weights = _build(config["model"], trained.state_dict, trained.ema_shadow, trained.path,
                            device)
    it = trained.meta.get("iteration")
    return LoadedModel(model, model.config, trained.path, trained.sha256, "training-checkpoint",
                       weights, _positive_int_or_none(config.get("crop_size")),
                       _positive_int_or_none(config.get("max_msa_rows")),
                       int(it) if isinstance(it, int) else None)


def checkpoint_home(path: str | Path) -> Path:
    """The folder a checkpoint's reports live in (`protdp calibrate` writes calibration.json
    there, `protdp predict` reads it): the resolved iter_N folder of a training run, or the
    folder holding a model file."""
    path = Path(path).resolve()
    return resolve_iteration_dir(path) if path.is_dir() else path.parent


def load_model_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a model file or a training checkpoint folder (EMA weights preferred), in eval mode."""
    path, device = Path(path).resolve(), torch.device(device)
    if path.is_dir():
        return _load_training_dir(path, device)
    if path.is_file():
        return _load_model_file(path, device)
    raise InputError("checkpoint not found", path=path)
