"""Reading a multimer checkpoint file (`multimer_model.pt`, the `protdp weights import` layout:
{"kind": "alphafold_multimer", "multimer_config": dict, "state_dict": tensors}) as hostile
input (issue 47): a truncated, empty or random file, a code-carrying pickle, a missing key,
a config or `masking` dict of the wrong shape, sizes beyond `protdp.data.bounds`, and weights
beyond MAX_WEIGHT_MAGNITUDE (`protdp.model.weight_checks`) are each one InputError line naming the file and the field, as the
monomer loader answers - never a traceback and never an allocation the file's bytes do not
justify (the config is checked before a module is built)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from protdp.config import load_config
from protdp.data.bounds import MAX_BLOCKS, MAX_CHANNELS, MAX_MSA_ROWS
from protdp.errors import InputError, ProtdpError
from protdp.model.config import ModelConfig
from protdp.model.multimer.model import MultimerConfig
from protdp.model.multimer.msa import MaskedMsaConfig
from protdp.model.weight_checks import check_weights
from protdp.train.checkpointing import load_cpu

_INT_BOUNDS = {"num_msa": MAX_MSA_ROWS, "num_extra_msa": MAX_MSA_ROWS,
               "template_blocks": MAX_BLOCKS}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def multimer_config_from_dict(data, path) -> MultimerConfig:
    """`multimer_config` of a checkpoint -> MultimerConfig, every field checked."""
    if not isinstance(data, dict):
        raise InputError(f"multimer_config is a {type(data).__name__}, expected a dict",
                         path=path, field="multimer_config")
    data = dict(data)
    trunk, masking = data.pop("trunk", None), data.pop("masking", {})
    if not isinstance(trunk, dict):
        raise InputError("multimer_config.trunk missing or not a dict", path=path,
                         field="multimer_config.trunk")
    try:
        trunk_cfg = load_config(ModelConfig, trunk)
    except (ProtdpError, ValueError, TypeError, KeyError) as exc:
        raise InputError(_one_line(exc), path=path, field="multimer_config.trunk") from None
    names = {f.name for f in dataclasses.fields(MaskedMsaConfig)}
    if not isinstance(masking, dict) or set(masking) - names or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v <= 1 for v in masking.values()):
        raise InputError(f"masking must be a dict of probabilities in [0, 1] with keys "
                         f"{sorted(names)}, got {str(masking)[:120]}", path=path,
                         field="multimer_config.masking")
    fields = {f.name: f for f in dataclasses.fields(MultimerConfig)}
    kept = {k: v for k, v in data.items() if k in fields}
    for name, value in kept.items():
        default = fields[name].default
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and \
                0 < value <= _INT_BOUNDS.get(name, MAX_CHANNELS)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
                math.isfinite(value) and value >= 0
        if not ok:
            raise InputError(f"{value!r} is not a valid value (protdp.data.bounds)"[:200],
                             path=path, field=f"multimer_config.{name}")
    return MultimerConfig(trunk=trunk_cfg, masking=MaskedMsaConfig(**masking), **kept)


def read_multimer_file(file: Path) -> tuple[MultimerConfig, dict]:
    """(config, state dict) of one multimer_model.pt; see the module docstring."""
    blob = load_cpu(file)                       # truncated / empty / pickled code: one line
    if not isinstance(blob, dict) or blob.get("kind") != "alphafold_multimer":
        raise InputError("not an AlphaFold-Multimer checkpoint (no kind "
                         "'alphafold_multimer')", path=file)
    cfg = multimer_config_from_dict(blob.get("multimer_config"), file)
    state = blob.get("state_dict")
    if not isinstance(state, dict) or not state:
        raise InputError("state_dict missing or empty", path=file, field="state_dict")
    check_weights(state, file, "state_dict")   # finite, |w| <= MAX_WEIGHT_MAGNITUDE
    return cfg, state
