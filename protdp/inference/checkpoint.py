"""Load model weights for prediction from a training run or a single model file.

Two layouts are understood (AF2 ships the EMA of the weights, supplement 1.11.7, so the EMA is
preferred whenever a checkpoint carries one):

1. A training checkpoint (Megatron `--save` layout): the run folder (newest complete `iter_N/`)
   or one `iter_N/` folder, read through `protdp.train.checkpointing.read_weights`, the owner of
   that layout (`config.model` = ModelConfig fields, `config.crop_size`, `config.max_msa_rows`,
   the raw weights and the EMA shadow, which overrides them).
2. A plain model file written by `save_model_checkpoint` (format `protdp-model-v1`, defined by
   the same module): model config, state dict, optional EMA shadow and the training crop / MSA
   depth it was trained on; or a folder holding one as `model.pt` (`protdp weights import`).

`sha256` identifies the weights for provenance: the file's SHA-256, or for a training folder the
digest `read_weights` computes over the files it read, so the same checkpoint always gets the
same digest wherever it is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from protdp.config import load_config, to_dict
from protdp.errors import InputError
from protdp.fileio import sha256_file  # noqa: F401  (re-exported)
from protdp.model.config import ModelConfig
from protdp.model.model import AlphaFoldModel
from protdp.train.checkpointing import (MODEL_FILE_FORMAT, TrainedWeights,  # noqa: F401
                                        is_imported_folder, merged_weights, read_any_weights,
                                        resolve_iteration_dir, save_model_file)
from protdp.train.release_record import MULTIMER_RECORD_KIND


MULTIMER_KIND = MULTIMER_RECORD_KIND          # LoadedModel.kind of a multimer checkpoint
MULTIMER_MODEL_FILE = "multimer_model.pt"      # as `protdp.weights.multimer_checkpoint` writes


def is_multimer_checkpoint(path: str | Path) -> bool:
    """A multimer checkpoint folder (`protdp weights import` of params_model_N_multimer_v3.npz)
    or its model file."""
    path = Path(path)
    return (path / MULTIMER_MODEL_FILE).is_file() or path.name == MULTIMER_MODEL_FILE


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

    @property
    def is_multimer(self) -> bool:
        """An AlphaFold-Multimer model (`protdp weights import` of *_multimer_v3.npz)."""
        return self.kind == MULTIMER_KIND

    @property
    def trunk_config(self) -> ModelConfig:
        """The monomer-shaped config (bins, attention backend): a multimer model's `trunk`."""
        return self.config.trunk if self.is_multimer else self.config

    def describe(self) -> dict:
        return {"path": str(self.path), "sha256": self.sha256, "kind": self.kind,
                "weights": self.weights, "iteration": self.iteration,
                "training_crop": self.training_crop, "max_msa_rows": self.max_msa_rows,
                "num_parameters": sum(p.numel() for p in self.model.parameters())}


def save_model_checkpoint(model: AlphaFoldModel, config: ModelConfig | None, path: str | Path, *,
                          ema_shadow: dict | None = None, training_crop: int | None = None,
                          max_msa_rows: int | None = None) -> Path:
    """Write `model` as a single-file model checkpoint (`protdp.train.checkpointing` format)."""
    config = config if config is not None else model.config
    return save_model_file(path, model_config=to_dict(config), state_dict=model.state_dict(),
                           ema_shadow=ema_shadow, training_crop=training_crop,
                           max_msa_rows=max_msa_rows)


def build_from(trained: TrainedWeights, device: torch.device) -> tuple[AlphaFoldModel, str]:
    """The model of `trained` with its (EMA) weights, in eval mode; ("ema" | "raw")."""
    config = load_config(ModelConfig, trained.model_config)
    model = AlphaFoldModel(config).to(device)
    state, weights = merged_weights(trained)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise InputError(f"weights do not fit the model config: {str(exc).splitlines()[0]}",
                         path=trained.path) from None
    model.eval()
    return model, weights


def checkpoint_home(path: str | Path) -> Path:
    """The folder a checkpoint's reports live in (`protdp calibrate` writes calibration.json
    there, `protdp predict` reads it): the resolved iter_N folder of a training run, or the
    folder holding a model file."""
    path = Path(path).resolve()
    if is_imported_folder(path) or (path / MULTIMER_MODEL_FILE).is_file():   # weights import
        return path
    return resolve_iteration_dir(path) if path.is_dir() else path.parent


def load_model_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a model file or a training checkpoint folder (EMA weights preferred), in eval mode."""
    trained = read_any_weights(path)
    model, weights = build_from(trained, torch.device(device))
    it = trained.meta.get("iteration")
    return LoadedModel(model, model.config, trained.path, trained.sha256, trained.kind, weights,
                       trained.meta_int("crop_size"), trained.meta_int("max_msa_rows"),
                       int(it) if isinstance(it, int) else None)
