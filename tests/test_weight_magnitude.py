"""Weights beyond MAX_WEIGHT_MAGNITUDE or non-finite are refused by every loader (issue 47 D3),
one line naming the file and the tensor: the monomer model file (raw and EMA weights), a
training checkpoint read for prediction or fine-tuning (engine/model.pt, ema.pt), a training
resume (the engine's model.pt, the EMA file), the OpenFold `.pt` import. (The multimer model
file, the AlphaFold `.npz` import and an ensemble member through `protdp predict` are covered
in test_multimer_checkpoint_hostile.py and test_ensemble_hostile.py.) Weights at the bound
itself load and predict as before."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from model_fixtures import one_thread, tiny_config  # noqa: F401
from protdp.data.bounds import MAX_WEIGHT_MAGNITUDE
from protdp.errors import InputError
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.model import build_model
from protdp.model.weight_checks import check_weights, value_problem, weights_problem
from protdp.parallel import checkpoint as engine_ckpt
from protdp.train import checkpointing

BOUND = MAX_WEIGHT_MAGNITUDE
OVER = np.nextafter(np.float32(BOUND), np.float32(np.inf))   # the next float32 above it


def test_the_rule():
    assert value_problem("w", torch.full((3,), BOUND)) is None
    assert value_problem("w", torch.full((3,), -BOUND)) is None
    assert "|w| = 1e+04 > 10000" in value_problem("w", torch.tensor([0.0, -float(OVER)]))
    assert "non-finite" in value_problem("w", np.array([0.0, np.nan], np.float32))
    assert "'w' holds |w| = 1e+30" in value_problem("w", np.full(2, 1e30))
    assert value_problem("steps", torch.tensor([10 ** 9])) is None       # integers: not weights
    assert value_problem("w", torch.zeros(0)) is None
    assert weights_problem({"a": torch.zeros(2), "b": torch.full((2,), 1e5)}).startswith(
        "weight 'b'")
    assert "not a named tensor" in weights_problem({"a": [1.0]})
    assert "expected a dict" in weights_problem([torch.zeros(1)])
    assert "not a dense tensor" in weights_problem({"a": torch.zeros(2).to_sparse()})
    with pytest.raises(InputError, match=r"^f.pt: field 'state_dict': weight 'b' holds"):
        check_weights({"a": torch.zeros(2), "b": torch.full((2,), 1e5)}, "f.pt", "state_dict")


def _model():
    torch.manual_seed(0)
    cfg = tiny_config()
    return build_model(cfg, verbose=False), cfg


def _one_line(call, *needles):
    with pytest.raises(InputError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text and all(n in text for n in needles), text
    return text


def test_monomer_model_file_raw_and_ema(tmp_path):
    model, cfg = _model()
    name = "structure_module.angle_resnet.linear_out.weight"
    with torch.no_grad():
        model.state_dict()[name].view(-1)[0] = BOUND          # at the bound: loads
    ok = save_model_checkpoint(model, cfg, tmp_path / "ok.pt")
    assert load_model_checkpoint(ok).model.state_dict()[name].abs().max() == BOUND
    with torch.no_grad():
        model.state_dict()[name].view(-1)[0] = 1e30
    huge = save_model_checkpoint(model, cfg, tmp_path / "huge.pt")
    _one_line(lambda: load_model_checkpoint(huge), str(huge), "field 'state_dict'", name,
              "1e+30 > 10000")
    model, cfg = _model()
    shadow = {k: v.float().clone() for k, v in model.state_dict().items()
              if v.is_floating_point()}
    shadow[name].view(-1)[1] = float(OVER)
    bad_ema = save_model_checkpoint(model, cfg, tmp_path / "ema.pt", ema_shadow=shadow)
    _one_line(lambda: load_model_checkpoint(bad_ema), "field 'ema_shadow'", name)
    _one_line(lambda: checkpointing.read_any_weights(bad_ema), "ema_shadow")  # --finetune-from


def _iter_dir(tmp_path, model, cfg):
    from protdp.config import to_dict
    it = tmp_path / "run" / "iter_0000002"
    (it / checkpointing.ENGINE).mkdir(parents=True)
    (it / checkpointing.META).write_text(json.dumps(
        {"iteration": 2, "world_size": 1, "config": {"model": to_dict(cfg)},
         "format": engine_ckpt.CHECKPOINT_FORMAT, "optimizer_files": []}))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"model": state, "extra": {}}, it / checkpointing.ENGINE / "model.pt")
    (it / checkpointing.ENGINE / "meta.json").write_text((it / checkpointing.META).read_text())
    shadow = {k: v.float().clone() for k, v in state.items() if v.is_floating_point()}
    torch.save({"decay": 0.9, "num_updates": 1, "shadow": shadow}, it / checkpointing.EMA_FILE)
    return it, state, shadow


def test_training_checkpoint_for_prediction_and_resume(tmp_path):
    model, cfg = _model()
    it, state, shadow = _iter_dir(tmp_path, model, cfg)
    assert load_model_checkpoint(it.parent).weights == "ema"          # the good folder loads
    name = "evoformer.blocks.0.msa_transition.linear_1.weight"
    shadow[name][0, 0] = float("inf")
    torch.save({"decay": 0.9, "num_updates": 1, "shadow": shadow}, it / checkpointing.EMA_FILE)
    for read in (lambda: load_model_checkpoint(it.parent),            # predict, ensemble member
                 lambda: checkpointing.load_checkpoint(it, 0)):       # resume: the EMA file
        _one_line(read, str(it / checkpointing.EMA_FILE), "non-finite", name)
    shadow[name][0, 0] = 0.0
    torch.save({"decay": 0.9, "num_updates": 1, "shadow": shadow}, it / checkpointing.EMA_FILE)
    state[name][0, 0] = -2e4
    torch.save({"model": state, "extra": {}}, it / checkpointing.ENGINE / "model.pt")
    model_pt = str(it / checkpointing.ENGINE / "model.pt")
    _one_line(lambda: checkpointing.read_weights(it), model_pt, name, "2e+04 > 10000")
    # resume through the engine: refused before anything is copied into the model
    target = build_model(cfg, verbose=False)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    ddp = types.SimpleNamespace(finish_param_sync=lambda: None, dp=1, module=target)
    _one_line(lambda: engine_ckpt.load_checkpoint(it / checkpointing.ENGINE, ddp), model_pt,
              "field 'model'", name)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    state[name][0, 0] = -BOUND                                        # at the bound: resumes
    torch.save({"model": state, "extra": {}}, it / checkpointing.ENGINE / "model.pt")
    engine_ckpt.load_checkpoint(it / checkpointing.ENGINE, ddp)
    assert target.state_dict()[name][0, 0] == -BOUND


def test_openfold_import_refuses_huge_and_nan_values(tmp_path):
    from protdp.weights.convert import export_openfold, import_params

    model, cfg = _model()
    state = export_openfold(model)
    pt = tmp_path / "of.pt"
    torch.save(state, pt)
    import_params(pt, "openfold", sm_layers=cfg.sm_layers)           # the good file imports
    key = sorted(state)[7]
    for value, needle in ((1e30, "1e+30 > 10000"), (float("nan"), "non-finite")):
        bad = dict(state, **{key: torch.full_like(state[key], value)})
        torch.save(bad, pt)
        _one_line(lambda: import_params(pt, "openfold", sm_layers=cfg.sm_layers), str(pt),
                  key, needle)


def test_resume_optimizer_shards_master_weights(tmp_path):
    """The fp32 master weights a resume copies from the optimizer shards into the model are
    weights too (DeepSpeed's ZeRO partitions: tests/test_deepspeed.py)."""
    shard = tmp_path / "optim_rank00000.pt"
    frag = {"start": 0, "end": 3, "master": torch.tensor([0.0, BOUND, -1.0]),
            "exp_avg_sq": torch.tensor([1e12, 0.0, 0.0])}       # moments are not weights
    torch.save({"fragments": {"w": [frag]}}, shard)
    assert engine_ckpt._optimizer_states(tmp_path, {"optimizer_files": [shard.name]})
    frag["master"][2] = -3e4
    torch.save({"fragments": {"w": [frag]}}, shard)
    _one_line(lambda: engine_ckpt._optimizer_states(tmp_path, {"optimizer_files": [shard.name]}),
              str(shard), "field 'master'", "'w[0:3]' holds |w| = 3e+04")
