"""Largest |w| of the parameter files at hand against MAX_WEIGHT_MAGNITUDE (issue 47 D3): the
bound every weight loader enforces (`protdp.model.weight_checks`) must sit far above real
parameters. Measured per file: the max |w| over every floating array, the array holding it,
and the ratio bound / max.

* AlphaFold reference fixtures made with DeepMind's JAX AlphaFold v2.3.2 (AlphaFold's own
  initialisers: ../shared/af2_reference params, the AF-Multimer one, tests/data/af2_multimer_b);
* OpenFold-shaped checkpoints as the tests make them (`export_openfold` of protdp's tiny and
  AF2-sized models at protdp's initialisation; the same numbers as a `.pt` import);
* the same fixtures after `protdp weights import` (protdp's state dict).

The published AlphaFold / OpenFold parameters are not reachable from this machine (no network),
so they are not measured here.

    .venv/bin/python benchmarks/weight_magnitudes.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from protdp.data.bounds import MAX_WEIGHT_MAGNITUDE
from protdp.paths import REPO_ROOT, data_root

RESULTS = REPO_ROOT / "benchmarks" / "results" / "weight_magnitudes.json"


def peak(arrays: dict) -> dict:
    """{"max_abs", "where", "bound_over_max"} over the floating arrays of a name -> array dict."""
    best, where = 0.0, None
    for name, value in arrays.items():
        value = value.detach().float().numpy() if torch.is_tensor(value) else np.asarray(value)
        if value.dtype.kind != "f" or not value.size:
            continue
        m = float(np.abs(value).max())
        if m > best:
            best, where = m, name
    return {"max_abs": round(best, 4), "where": where,
            "bound_over_max": round(MAX_WEIGHT_MAGNITUDE / best, 1) if best else None}


def _npz(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def main() -> int:
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from model_fixtures import tiny_config
    from protdp.config import load_config, read_yaml
    from protdp.model import build_model
    from protdp.model.config import ModelConfig
    from protdp.resources import config_file
    from protdp.weights import cli as weights_cli
    from protdp.weights.convert import export_openfold

    fixture = data_root().parent / "af2_reference"
    npz = {"af2_reference params_model_3_ptm_small.npz":
           fixture / "params" / "params_model_3_ptm_small.npz",
           "af2_reference params_model_1_multimer_v3_small.npz":
           fixture / "multimer" / "params" / "params_model_1_multimer_v3_small.npz"}
    npz.update({f"tests/data/af2_multimer_b {p.name}": p for p in
                sorted((REPO_ROOT / "tests" / "data" / "af2_multimer_b" / "params").glob("*.npz"))})
    out = {name: peak(_npz(path)) for name, path in npz.items()}
    torch.manual_seed(0)
    af2 = load_config(ModelConfig, read_yaml(config_file("model/af2.yaml")))
    for label, cfg in (("tiny", tiny_config()), ("af2", af2)):
        out[f"openfold-shaped export_openfold({label} model)"] = peak(
            export_openfold(build_model(cfg, verbose=False)))
    with tempfile.TemporaryDirectory() as d:
        ck = Path(d) / "ck"
        weights_cli.main(["import", "--format", "alphafold", str(npz[next(iter(npz))]), "--out",
                          str(ck), "--alphafold-config",
                          str(fixture / "config_model_3_ptm_small.json")])
        blob = torch.load(ck / "model.pt", weights_only=True)
        out["imported model.pt (params_model_3_ptm_small)"] = peak(blob["state_dict"])
    doc = {"bound": MAX_WEIGHT_MAGNITUDE, "files": out,
           "largest": max(v["max_abs"] for v in out.values())}
    RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
