"""Hostile-input audit, round 4 (issue 47 D3): weights beyond MAX_WEIGHT_MAGNITUDE (1e4) or
non-finite, given to every loader of a user's weight file, classified as in
`hostile_cases_47.py`:

* rejected - one line naming the file (`protdp.model.weight_checks`);
* silent   - accepted: a 1e30 / NaN / Inf / 1.5e4 weight loaded into a model;
* raw / hang - a traceback or past the time / memory limit;
* intact   - a weight at the bound itself (1e4) accepted, as it must be;
* refused_valid - the weight at the bound refused (a wrong answer too).

Loaders: the monomer model file (raw and EMA weights: `predict`, `--finetune-from`,
`weights export`), a training run folder read for prediction (engine/model.pt, ema.pt), a
training resume (ema.pt; the engine's model.pt; the fp32 master weights of the optimizer
shards), `multimer_model.pt` (fine-tuning and
prediction readers), `weights import` of AlphaFold `.npz` (monomer, multimer) and OpenFold
`.pt`, and a second ensemble member given to `predict`. Only APIs main has are called, so the
same section measures main (the "before" numbers). DeepSpeed's resume is not run here (it needs
a launched process group; tests/test_deepspeed.py gives it a 1e30 fp32 master).
"""

from __future__ import annotations

import copy
import json
import sys
import types
from collections import Counter
from pathlib import Path

import numpy as np

from hostile_cases_47 import run_case

VALUES = (("1e30", 1e30), ("nan", float("nan")), ("inf", float("inf")), ("1.5e4", 1.5e4),
          ("at bound 1e4", 1e4))
AT_BOUND = "at bound 1e4"


def _set_one(tensor, value):
    """A copy of `tensor` with its first element `value`."""
    out = tensor.clone()
    out.view(-1)[0] = value
    return out


def _monomer_writers(tmp: Path):
    """{loader: (write(value, folder) -> path given to the loader, load(path))}: the monomer
    model file and a training run folder (prediction, resume)."""
    import torch

    from model_fixtures import tiny_config
    from protdp.config import to_dict
    from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
    from protdp.model import build_model
    from protdp.parallel import checkpoint as engine_ckpt
    from protdp.train import checkpointing as ck

    torch.manual_seed(0)
    cfg = tiny_config()
    model = build_model(cfg, verbose=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    name = "structure_module.angle_resnet.linear_out.weight"
    shadow = {k: v.float().clone() for k, v in state.items() if v.is_floating_point()}

    def model_file(value, folder, ema=False):
        m = build_model(cfg, verbose=False)
        m.load_state_dict(state if ema else dict(state, **{name: _set_one(state[name], value)}))
        ema_shadow = dict(shadow, **{name: _set_one(shadow[name], value)}) if ema else None
        return save_model_checkpoint(m, cfg, folder / "model.pt", ema_shadow=ema_shadow)

    def run_folder(value, folder, where):
        it = folder / "run" / "iter_0000002"
        (it / ck.ENGINE).mkdir(parents=True)
        meta = {"iteration": 2, "world_size": 1, "config": {"model": to_dict(cfg)},
                "format": engine_ckpt.CHECKPOINT_FORMAT, "optimizer_files": []}
        for m in (it / ck.META, it / ck.ENGINE / "meta.json"):
            m.write_text(json.dumps(meta))
        raw = dict(state, **{name: _set_one(state[name], value)}) if where == "model" else state
        torch.save({"model": raw, "extra": {}}, it / ck.ENGINE / "model.pt")
        ema = dict(shadow, **{name: _set_one(shadow[name], value)}) if where == "ema" else shadow
        torch.save({"decay": 0.9, "num_updates": 1, "shadow": ema}, it / ck.EMA_FILE)
        return it

    def engine_resume(it):
        ddp = types.SimpleNamespace(finish_param_sync=lambda: None, dp=1,
                                    module=build_model(cfg, verbose=False))
        return engine_ckpt.load_checkpoint(it / ck.ENGINE, ddp)

    def optimizer_shard(value, folder):
        master = {k: v.float().flatten() for k, v in shadow.items()}
        master[name] = _set_one(master[name], value)
        torch.save({"fragments": {k: [{"start": 0, "end": len(v), "master": v}]
                                  for k, v in master.items()}}, folder / "optim_rank00000.pt")
        return folder / "optim_rank00000.pt"

    def optimizer_resume(shard):
        return engine_ckpt._optimizer_states(shard.parent, {"optimizer_files": [shard.name]})

    return {
        "model.pt weights (predict, --finetune-from)": (model_file, load_model_checkpoint),
        "model.pt EMA shadow": (lambda v, f: model_file(v, f, ema=True), load_model_checkpoint),
        "run folder engine/model.pt (predict)": (lambda v, f: run_folder(v, f, "model"),
                                                 lambda it: load_model_checkpoint(it.parent)),
        "run folder ema.pt (predict)": (lambda v, f: run_folder(v, f, "ema"),
                                        lambda it: load_model_checkpoint(it.parent)),
        "resume ema.pt": (lambda v, f: run_folder(v, f, "ema"),
                          lambda it: ck.load_checkpoint(it, 0)),
        "resume engine model.pt": (lambda v, f: run_folder(v, f, "model"), engine_resume),
        "resume optimizer shard fp32 master": (optimizer_shard, optimizer_resume),
    }, (model, cfg)


def _multimer_writers(multimer_ckpt: Path):
    import torch

    from protdp.inference.multimer_loading import load_multimer_checkpoint
    from protdp.train.complex import read_multimer_checkpoint

    blob = torch.load(multimer_ckpt / "multimer_model.pt", weights_only=True)
    first = next(k for k, v in blob["state_dict"].items() if v.is_floating_point())

    def write(value, folder):
        b = copy.deepcopy(blob)
        b["state_dict"][first] = _set_one(b["state_dict"][first], value)
        torch.save(b, folder / "multimer_model.pt")
        return folder

    return {"multimer_model.pt (fine-tuning reader)": (write, read_multimer_checkpoint),
            "multimer_model.pt (predict loader)": (write, load_multimer_checkpoint)}


def _import_writers(fixture: Path, model_cfg):
    import torch

    from protdp.weights import cli as weights_cli
    from protdp.weights.convert import export_openfold

    model, cfg = model_cfg
    sources = {"monomer": (fixture / "params" / "params_model_3_ptm_small.npz",
                           fixture / "config_model_3_ptm_small.json"),
               "multimer": (fixture / "multimer" / "params" /
                            "params_model_1_multimer_v3_small.npz",
                            fixture / "multimer" / "config_model_1_multimer_v3_small.json")}

    def npz(kind):
        src, config = sources[kind]

        def write(value, folder):
            with np.load(src, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            key = sorted(arrays)[5]
            arrays[key] = arrays[key].copy()
            arrays[key].flat[0] = value
            np.savez(folder / src.name, **arrays)
            return folder / src.name

        load = (lambda p: weights_cli.main(["import", "--format", "alphafold", str(p), "--out",
                                            str(p.parent / "out"), "--alphafold-config",
                                            str(config)]))
        return write, load

    state = export_openfold(model)
    key = sorted(state)[7]

    def openfold_write(value, folder):
        torch.save(dict(state, **{key: _set_one(state[key], value)}), folder / "of.pt")
        return folder / "of.pt"

    def openfold_load(p):
        return weights_cli.main(["import", "--format", "openfold", str(p), "--out",
                                 str(p.parent / "out"), "--sm-layers", str(cfg.sm_layers)])

    return {"weights import AlphaFold .npz": npz("monomer"),
            "weights import AlphaFold-Multimer .npz": npz("multimer"),
            "weights import OpenFold .pt": (openfold_write, openfold_load)}


def _ensemble_writer(monomer_writers, folder0: Path):
    """A second ensemble member given to `predict` beside a good one."""
    from protdp.workflows import predict

    write_model, _ = monomer_writers["model.pt weights (predict, --finetune-from)"]
    good = write_model(0.0, folder0)                     # 0 at one weight: an ordinary model
    fasta = folder0 / "t.fasta"
    fasta.write_text(">a\nMKVLAAGIVGLLLAAQ\n")

    def load(bad):
        return predict([str(good), str(bad)], fasta, bad.parent / "out", release_gate="review",
                       device="cpu", progress=False)
    return {"ensemble member (predict)": (write_model, load)}


def audit_weight_magnitudes(tmp: Path, fixture: Path, multimer_ckpt: Path) -> dict:
    """{loader: outcome counts} over VALUES for every loader of a user's weight file."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    monomer, model_cfg = _monomer_writers(tmp)
    (tmp / "good").mkdir()
    loaders = {**monomer, **_multimer_writers(multimer_ckpt),
               **_import_writers(fixture, model_cfg), **_ensemble_writer(monomer, tmp / "good")}
    out = {}
    for k, (name, (write, load)) in enumerate(loaders.items()):
        counts: Counter = Counter()
        for j, (label, value) in enumerate(VALUES):
            folder = tmp / f"w{k}_{j}"
            folder.mkdir()
            path = write(value, folder)
            outcome, _ = run_case(lambda: load(path), path)
            if label == AT_BOUND:
                outcome = {"accepted": "intact", "rejected": "refused_valid"}.get(outcome,
                                                                                  outcome)
            counts["silent" if outcome == "accepted" else outcome] += 1
        out[name] = dict(counts)
        print(f"  {name}: {out[name]}", flush=True)
    return out
