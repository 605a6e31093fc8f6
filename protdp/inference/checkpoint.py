"""Load model weights for prediction from a training run or a single model file.

Two layouts are understood (AF2 ships the EMA of the weights, supplement 1.11.7, so the EMA is
preferred whenever a checkpoint carries one):

1. A training checkpoint written by `protdp.train.checkpointing` (Megatron `--save` layout):
   the run folder (newest complete `iter_N/` via the tracker file) or one `iter_N/` folder.
   Read: `iter_N/meta.json` (`config.model` = ModelConfig fields, `config.crop_size`,
   `config.max_msa_rows`, `iteration`), `iter_N/engine/model.pt` (`{"model": state_dict}`,
   written by `protdp.parallel.save_checkpoint`) and `iter_N/ema.pt` (`{"shadow": {name:
   fp32 tensor}}` for every floating-point state entry; it overrides the raw weights).
2. A plain model file written by `save_model_checkpoint` (format `protdp-model-v1`): model
   config, state dict, optional EMA shadow and the training crop / MSA depth it was trained on;
   or a folder holding one as `model.pt` (what `protdp weights import` writes).

`sha256` identifies the weights for provenance: the file's SHA-256, or for a training folder the
SHA-256 of "relative path  file sha256" lines over the files read (meta.json, engine/model.pt,
ema.pt), so the same checkpoint always gets the same digest wherever it is stored.
"""

from __future__ import annotations

import hashlib
import json
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

MODEL_FILE_FORMAT = "protdp-model-v1"
IMPORTED_MODEL_FILE = "model.pt"   # a folder written by `protdp weights import` holds this file
_TRACKER = "latest_checkpointed_iteration.txt"   # protdp.train.checkpointing.TRACKER


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


def _files_digest(root: Path, files: list[Path]) -> str:
    lines = [f"{f.relative_to(root).as_posix()}  {sha256_file(f)}\n" for f in files]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


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


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError("checkpoint file not found", path=path) from None
    except Exception as exc:  # corrupt/truncated/foreign pickle: say which file
        raise InputError(f"cannot read checkpoint: {type(exc).__name__}: {exc}", path=path) from None


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
    blob = _torch_load(path)
    if not isinstance(blob, dict) or blob.get("format") != MODEL_FILE_FORMAT:
        raise InputError(f"not a protdp model checkpoint (expected format '{MODEL_FILE_FORMAT}'; "
                         "a training run is given as its folder)", path=path)
    model, weights = _build(blob["model_config"], blob["state_dict"], blob.get("ema_shadow"), path,
                            device)
    return LoadedModel(model, model.config, path, sha256_file(path), "model-file", weights,
                       _positive_int_or_none(blob.get("training_crop")),
                       _positive_int_or_none(blob.get("max_msa_rows")))


def _resolve_training_dir(path: Path) -> Path:
    """An iter_N folder with meta.json: `path` itself or the newest under a run folder."""
    if (path / "meta.json").is_file() and (path / "engine").is_dir():
        return path
    tracker = path / _TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        if text.isdigit() and (path / f"iter_{int(text):07d}" / "meta.json").is_file():
            return path / f"iter_{int(text):07d}"
    done = sorted(p for p in path.glob("iter_[0-9]*") if p.is_dir() and (p / "meta.json").is_file()
                  and p.name[5:].isdigit())
    if not done:
        raise InputError("no complete training checkpoint here (expected iter_N/meta.json)", path=path)
    return done[-1]


def _load_training_dir(path: Path, device: torch.device) -> LoadedModel:
    it_dir = _resolve_training_dir(path)
    meta_path = it_dir / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc}", path=meta_path) from None
    config = meta.get("config") or {}
    if not isinstance(config.get("model"), dict):
        raise InputError("no model config recorded", path=meta_path, field="config.model")
    model_pt = it_dir / "engine" / "model.pt"
    blob = _torch_load(model_pt)
    if not isinstance(blob, dict) or "model" not in blob:
        raise InputError("expected a dict with key 'model'", path=model_pt)
    files = [meta_path, model_pt]
    ema = None
    ema_pt = it_dir / "ema.pt"
    if ema_pt.is_file():
        ema_blob = _torch_load(ema_pt)
        ema = ema_blob.get("shadow") if isinstance(ema_blob, dict) else None
        files.append(ema_pt)
    model, weights = _build(config["model"], blob["model"], ema, it_dir, device)
    it = meta.get("iteration")
    return LoadedModel(model, model.config, it_dir, _files_digest(it_dir, files),
                       "training-checkpoint", weights,
                       _positive_int_or_none(config.get("crop_size")),
                       _positive_int_or_none(config.get("max_msa_rows")),
                       int(it) if isinstance(it, int) else None)


def checkpoint_home(path: str | Path) -> Path:
    """The folder a checkpoint's reports live in (`protdp calibrate` writes calibration.json
    there, `protdp predict` reads it): the resolved iter_N folder of a training run, or the
    folder holding a model file."""
    path = Path(path).resolve()
    if path.is_dir() and (path / IMPORTED_MODEL_FILE).is_file() and not (path / "meta.json").is_file():
        return path
    return _resolve_training_dir(path) if path.is_dir() else path.parent


def load_model_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a model file or a training checkpoint folder (EMA weights preferred), in eval mode."""
    path, device = Path(path).resolve(), torch.device(device)
    if path.is_dir() and (path / IMPORTED_MODEL_FILE).is_file() and not (path / "meta.json").is_file():
        return _load_model_file(path / IMPORTED_MODEL_FILE, device)    # `protdp weights import`
    if path.is_dir():
        return _load_training_dir(path, device)
    if path.is_file():
        return _load_model_file(path, device)
    raise InputError("checkpoint not found", path=path)
