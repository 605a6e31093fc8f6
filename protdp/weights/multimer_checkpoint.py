"""`protdp weights import` of AlphaFold-Multimer parameters (`params_model_{1..5}_multimer_v3.npz`
and v2) into a multimer checkpoint folder, and loading it back.

The folder holds `multimer_model.pt` ({"kind": "alphafold_multimer", "multimer_config": plain
dict, "state_dict": tensors}; read with `torch.load(weights_only=True)`) and
`provenance.json`. Settings the arrays do not carry (structure-module depth, recycles, the MSA
sample sizes and BERT masking of AlphaFold's model config) come from the AlphaFold config JSON
when given, else AlphaFold-Multimer's defaults.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from pathlib import Path

import numpy as np
import torch

from protdp import __version__
from protdp.config import load_config, to_dict
from protdp.errors import InputError
from protdp.fileio import sha256_file
from protdp.model.config import ModelConfig
from protdp.model.multimer.model import MultimerConfig, MultimerModel
from protdp.model.multimer.msa import MaskedMsaConfig
from protdp.train.checkpointing import load_cpu
from protdp.train.multimer_file import read_multimer_file
from protdp.weights.alphafold_config import multimer_overrides
from protdp.weights.alphafold_multimer import (infer_multimer_config, is_fused_evoformer,
                                               is_multimer, multimer_arrays_from_state,
                                               multimer_state_from_arrays)
from protdp.weights.store import PROVENANCE_FILE, LazyNpz, write_json

MULTIMER_MODEL_FILE = "multimer_model.pt"
KIND = "alphafold_multimer"
FUSED_KEY = "alphafold_fused_evoformer"   # v3 fused / v2 unfused Evoformer triangle projections


def multimer_settings(path: str | Path | None) -> dict:
    """Structure-module layers, recycles, num_msa / num_extra_msa, masked_msa and every size
    (`overrides`, checked against the arrays on import) from an AlphaFold config JSON (bare or
    the fixture's {"config": ...} wrapper); {} without one."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
        model = data.get("config", data)["model"]
        evo = model["embeddings_and_evoformer"]
        masked = evo.get("masked_msa", {})
        return {"sm_layers": int(model["heads"]["structure_module"]["num_layer"]),
                "num_recycles": int(model["num_recycle"]),
                "num_msa": int(evo["num_msa"]), "num_extra_msa": int(evo["num_extra_msa"]),
                "masking": MaskedMsaConfig(**{k: float(masked[k]) for k in (
                    "uniform_prob", "profile_prob", "same_prob", "replace_fraction")
                    if k in masked}),
                "overrides": multimer_overrides(model)}
    except FileNotFoundError:
        raise InputError("AlphaFold config not found", path=path) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"not an AlphaFold-Multimer model config ({type(exc).__name__}: {exc})",
                         path=path) from None


def is_multimer_file(path: str | Path) -> bool:
    arrays = LazyNpz(Path(path))
    try:
        return is_multimer(arrays.shapes)
    finally:
        arrays.close()


def import_multimer(path: str | Path, *, sm_layers: int = 8, num_recycles: int = 20,
                    num_msa: int | None = None, num_extra_msa: int | None = None,
                    masking: MaskedMsaConfig | None = None, overrides: dict | None = None
                    ) -> tuple[MultimerModel, dict]:
    """(model, provenance) from an AlphaFold-Multimer npz; `overrides` (sizes from AlphaFold's
    config, `protdp.weights.alphafold_config`) must agree with the arrays: the first array that
    does not is one error naming it, its shape and the shape the config implies."""
    path = Path(path)
    arrays = LazyNpz(path)
    try:
        try:
            cfg = infer_multimer_config(arrays.shapes, sm_layers=sm_layers,
                                        num_recycles=num_recycles, overrides=overrides)
            for name, value in (("num_msa", num_msa), ("num_extra_msa", num_extra_msa),
                                ("masking", masking)):
                if value is not None:
                    setattr(cfg, name, value)
            state = multimer_state_from_arrays(arrays, cfg)
        except InputError as exc:
            raise InputError(exc.reason, path=path, field=exc.field) from None
        fused = is_fused_evoformer(arrays.shapes)
        n_source = int(sum(int(np.prod(s)) for s in arrays.shapes.values()))
        n_arrays = len(arrays.shapes)
    finally:
        arrays.close()
    model = MultimerModel(cfg)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    provenance = {
        "format": "alphafold-multimer", "source": str(path), "source_sha256": sha256_file(path),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "protdp_version": __version__, "multimer_config": to_dict(cfg),
        "source_arrays": n_arrays, "source_parameters": n_source,
        FUSED_KEY: fused,
        "protdp_parameters": sum(p.numel() for p in model.parameters())}
    return model.eval(), provenance


def save_multimer(model: MultimerModel, provenance: dict, out_dir: str | Path) -> Path:
    """Write the checkpoint folder (tmp file + os.replace, so a crash leaves no half file)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("--out exists and is not a folder", path=out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        target = out / MULTIMER_MODEL_FILE
        tmp = target.with_suffix(".pt.tmp")
        torch.save({"kind": KIND, "multimer_config": to_dict(model.config),
                    "state_dict": model.state_dict(),
                    FUSED_KEY: bool(provenance.get(FUSED_KEY, True))}, tmp)
        os.replace(tmp, target)
        write_json(out / PROVENANCE_FILE, provenance)
    except (OSError, RuntimeError) as exc:
        raise InputError(f"cannot write ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                         path=out) from None
    return out


def config_from_dict(data: dict) -> MultimerConfig:
    data = dict(data)
    trunk = load_config(ModelConfig, data.pop("trunk"))
    masking = MaskedMsaConfig(**data.pop("masking"))
    names = {f.name for f in dataclasses.fields(MultimerConfig)}
    return MultimerConfig(trunk=trunk, masking=masking, **{k: v for k, v in data.items()
                                                           if k in names})


def is_multimer_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / MULTIMER_MODEL_FILE).is_file() or path.name == MULTIMER_MODEL_FILE


def export_multimer_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """AlphaFold-Multimer npz arrays of a multimer checkpoint, in the Evoformer layout it was
    imported from (v3 fused unless recorded otherwise); import -> export is bit-identical."""
    model = load_multimer(path)
    blob = _read_blob(path)
    state = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    return multimer_arrays_from_state(state, model.config,
                                      fused_evoformer=bool(blob.get(FUSED_KEY, True)))


def _read_blob(path: str | Path) -> dict:
    path = Path(path)
    file = path / MULTIMER_MODEL_FILE if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"no {MULTIMER_MODEL_FILE} (not a multimer checkpoint)", path=path)
    return load_cpu(file)                   # a corrupt file: one line naming it


def load_multimer(path: str | Path) -> MultimerModel:
    """A multimer checkpoint folder (or its model file) -> the model in eval mode."""
    path = Path(path)
    file = path / MULTIMER_MODEL_FILE if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"no {MULTIMER_MODEL_FILE} (not a multimer checkpoint)", path=path)
    cfg, state = read_multimer_file(file)       # every field checked (issue 47)
    model = MultimerModel(cfg)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise InputError(f"weights do not fit the config: {str(exc).splitlines()[0]}",
                         path=file) from None
    return model.eval()
