"""Import AlphaFold2 / OpenFold parameters into a protdp model and export them back.

`import_params` builds the model from the configuration the arrays describe (any size), maps
every parameter (or lists it as skipped with the reason) and returns an `Imported`;
`write_imported` turns it into an ordinary protdp checkpoint folder. Export reads any protdp
checkpoint and writes AlphaFold's npz or an OpenFold state dict; import -> export -> import is
bit-identical (float32 throughout, reshapes and transposes only).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from protdp import __version__
from protdp.config import read_yaml, to_dict
from protdp.errors import InputError
from protdp.fileio import sha256_file
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.model.config import LossConfig, ModelConfig
from protdp.model.model import AlphaFoldModel
from protdp.resources import config_file
from protdp.weights import alphafold, openfold, validate
from protdp.weights.store import PROVENANCE_FILE, LazyNpz, model_file, write_json

FORMATS = ("alphafold", "openfold")
FINETUNE_LOSS = "model/af2_finetune_loss.yaml"


@dataclass
class Imported:
    """A model with imported weights and the record of how each source parameter was used."""

    model: AlphaFoldModel
    config: ModelConfig
    fmt: str
    source: Path
    mapped: dict[str, list[str]] = field(default_factory=dict)   # source key -> protdp keys
    skipped: dict[str, str] = field(default_factory=dict)        # source key -> reason
    source_parameters: int = 0

    def provenance(self) -> dict:
        return {
            "format": self.fmt, "source": str(self.source), "source_sha256": sha256_file(self.source),
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "protdp_version": __version__, "model_config": to_dict(self.config),
            "source_parameters": self.source_parameters,
            "protdp_parameters": self.model.num_parameters(),
            "mapped": self.mapped, "skipped": self.skipped,
            "templates": (alphafold.TEMPLATES_USED if self.config.templates
                          else alphafold.TEMPLATES_ABSENT),
            "loss": f"AlphaFold fine-tuning weights ({FINETUNE_LOSS})",
        }


def finetune_loss() -> LossConfig:
    """AF2's fine-tuning loss weights (packaged `configs/model/af2_finetune_loss.yaml`)."""
    return LossConfig(**read_yaml(config_file(FINETUNE_LOSS))["loss"])


def _model_from_state(cfg: ModelConfig, state: dict[str, np.ndarray]) -> AlphaFoldModel:
    """The model built on the meta device and given the converted arrays as its parameters (no
    random initialisation, no copy: import memory stays near one copy of the weights)."""
    with torch.device("meta"):
        model = AlphaFoldModel(cfg)
    missing = sorted(set(model.state_dict()) - set(state))
    if missing:       # the tables cover every parameter; a gap here is a protdp bug
        raise RuntimeError(f"no source for protdp parameters {missing[:5]}")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
                           for k, v in state.items()}, assign=True)
    return model.eval()


def import_params(path: str | Path, fmt: str, *, sm_layers: int = 8,
                  num_recycles: int = 3, overrides: dict | None = None) -> Imported:
    """Read AF2 npz (`fmt` "alphafold") or an OpenFold .pt state dict ("openfold").
    `overrides`: ModelConfig sizes from AlphaFold's config JSON
    (`protdp.weights.alphafold_config.monomer_overrides`); the arrays must agree with them (the
    first that does not is one error naming it, its shape and the shape the config implies)."""
    path = Path(path)
    if fmt == "alphafold":
        arrays = LazyNpz(path)
        shapes = arrays.shapes
    elif fmt == "openfold":
        with validate.naming(path):     # a missing key names the file as well as the key
            arrays = openfold.to_alphafold_arrays(openfold.read_state_dict(path))
        shapes = {k: v.shape for k, v in arrays.items()}
    else:
        raise InputError(f"unknown format '{fmt}'; expected one of {FORMATS}")
    try:
        cfg = alphafold.infer_config(shapes, sm_layers=sm_layers, num_recycles=num_recycles)
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
    except ValueError as exc:
        raise InputError(f"the AlphaFold config describes no valid model: {exc}", path=path) from None
    except InputError as exc:
        raise InputError(exc.reason, path=path, field=exc.field) from None
    cfg.loss = finetune_loss()
    with torch.device("meta"):
        model_shapes = {k: tuple(v.shape) for k, v in AlphaFoldModel(cfg).state_dict().items()}
    entries = alphafold.alphafold_entries(cfg, model_shapes)
    skipped = alphafold.classify_keys(shapes.keys(), entries)
    try:
        with validate.naming(path):
            state = alphafold.state_from_arrays(arrays, entries)
    finally:
        if isinstance(arrays, LazyNpz):
            arrays.close()
    mapped: dict[str, list[str]] = {}
    for e in entries:
        mapped.setdefault(e.af2, []).append(e.torch)
    if fmt == "openfold":   # report in the source's own names
        names = openfold.openfold_names(cfg, list(mapped) + list(skipped))
        mapped = {names[k]: v for k, v in mapped.items()}
        skipped = {names[k]: v for k, v in skipped.items()}
    return Imported(_model_from_state(cfg, state), cfg, fmt, path, mapped, skipped,
                    alphafold.parameter_count(shapes))


# What AlphaFold's (and OpenFold's) published weights were last trained on (AF2 supplement
# 1.11.3, Table 4, fine-tuning stage): the gate flags longer targets, as for any checkpoint.
AF2_TRAINING_CROP = 384
AF2_MSA_CLUSTERS = 512


def write_imported(imported: Imported, out_dir: str | Path) -> Path:
    """An ordinary protdp checkpoint folder: model.pt + provenance.json. Returns the folder."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("--out exists and is not a folder", path=out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_model_checkpoint(imported.model, imported.config, model_file(out),
                              training_crop=AF2_TRAINING_CROP, max_msa_rows=AF2_MSA_CLUSTERS)
        write_json(out / PROVENANCE_FILE, imported.provenance())
    except (OSError, RuntimeError) as exc:     # torch reports unwritable paths as RuntimeError
        raise InputError(f"cannot write ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                         path=out) from None
    return out


def export_arrays(model: AlphaFoldModel) -> dict[str, np.ndarray]:
    """AlphaFold npz arrays (float32) of a protdp model."""
    cfg = model.config
    state = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    entries = alphafold.alphafold_entries(cfg, {k: v.shape for k, v in state.items()})
    return alphafold.arrays_from_state(state, entries)


def export_openfold(model: AlphaFoldModel) -> dict[str, torch.Tensor]:
    """An OpenFold state dict (float32 tensors) of a protdp model."""
    return openfold.from_alphafold_arrays(export_arrays(model), model.config)
