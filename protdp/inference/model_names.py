"""Which weights made a prediction, in the names AlphaFold and ColabFold use (issue 41).

- Weights name: imported AlphaFold weights keep AlphaFold's model name (`model_3_ptm`,
  `model_1_multimer_v3`), read from the import's provenance.json (`source`:
  `params_<name>.npz`, `alphafold_model_name`), so the name survives any
  folder name and any `--checkpoint` order. A protdp-trained checkpoint is named
  `protdp_<first 12 hex digits of its sha256>`: the digest its release record is bound to
  (`protdp.train.release_record`), so the name is stable across copies and paths.
- Prediction name (every per-model file): `model_<N>_seed_<SSS>` (ColabFold's), N AlphaFold's
  model number for imported weights (`model_3_ptm` predicts as `model_3_seed_000`), else the
  position in `--checkpoint` order.
- ColabFold tag: `<model type>_model_<N>_seed_<SSS>`, the model type ColabFold's own
  (`alphafold2`, `alphafold2_ptm`, `alphafold2_multimer_v1|v2|v3`) for imported weights and
  `protdp` / `protdp_multimer` for protdp-trained ones (docs/prediction.md, "Model names that
  say which weights"; tools that accept only AlphaFold's tokens, such as af_analysis, refuse
  these).
"""

from __future__ import annotations

import re
from pathlib import Path

PROTDP_TOKEN = "protdp"                 # ColabFold model-type token of protdp-trained weights
PROTDP_MULTIMER_TOKEN = "protdp_multimer"
AF_NAME_RE = re.compile(r"model_(\d+)(_ptm|_multimer_v(\d+))?")


IMPORT_PROVENANCE_FILE = "provenance.json"   # = protdp.weights.store.PROVENANCE_FILE (floor 8)
_PARAMS_NAME = re.compile(r"params_(model_\d+(?:_ptm|_multimer_v\d+)?)(?:_\w+)?\.npz")


def alphafold_model_name(checkpoint) -> str | None:
    """AlphaFold's model name (`model_3_ptm`, `model_1_multimer_v3`) of a checkpoint imported
    from `params_<name>.npz` (`protdp weights import`), read from the import's provenance.json
    (`format` alphafold / alphafold-multimer, `source`); None for anything else (a protdp-
    trained checkpoint, an OpenFold state dict, a missing or foreign provenance file)."""
    import json

    path = Path(checkpoint)
    folder = path if path.is_dir() else path.parent
    try:
        doc = json.loads((folder / IMPORT_PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith("alphafold"):
        return None
    m = _PARAMS_NAME.fullmatch(Path(str(doc.get("source", ""))).name)
    return m.group(1) if m else None


def weights_name(path, sha256: str) -> str:
    """`model_3_ptm` for imported AlphaFold weights, else `protdp_<sha256[:12]>`."""
    return alphafold_model_name(path) or f"protdp_{sha256[:12]}"


def model_type_token(name: str, multimer: bool) -> str:
    """ColabFold's model-type token for the weights named `name` (`weights_name`)."""
    m = AF_NAME_RE.fullmatch(name)
    if m is None:
        return PROTDP_MULTIMER_TOKEN if multimer else PROTDP_TOKEN
    if m.group(3):
        return f"alphafold2_multimer_v{m.group(3)}"
    return "alphafold2_ptm" if m.group(2) == "_ptm" else "alphafold2"


def alphafold_model_number(name: str) -> int | None:
    m = AF_NAME_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def colabfold_tag(prediction: str, token: str) -> str:
    """`alphafold2_ptm_model_3_seed_000`: ColabFold's tag of the prediction `model_3_seed_000`."""
    return f"{token}_{prediction}"


def describe_members(models) -> list[dict]:
    """Per loaded model (`LoadedModel`): {"model_name", "model_type"}."""
    out = []
    for m in models:
        name = weights_name(Path(m.path), m.sha256)
        out.append({"model_name": name, "model_type": model_type_token(name, m.is_multimer)})
    return out
