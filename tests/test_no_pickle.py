"""No reader of a user's checkpoint file unpickles it: each one is given a file whose pickle runs
code (`__reduce__` creating a marker file) and must refuse it with an InputError naming the file,
the marker never appearing. The rank file's RNG state round-trips through weights_only=True."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from protdp.errors import InputError
from protdp.parallel import checkpoint as engine_ckpt
from protdp.train import checkpointing


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _malicious(path: Path, marker: Path, wrap=lambda p: {"x": p}) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(wrap(_Payload(marker)), path)
    return path


def _iter_dir(tmp_path: Path) -> Path:
    it = tmp_path / "run" / "iter_0000002"
    (it / checkpointing.ENGINE).mkdir(parents=True)
    (it / checkpointing.META).write_text(json.dumps(
        {"iteration": 2, "world_size": 1, "config": {"model": {}}}))
    torch.save({"model": {"w": torch.zeros(2)}}, it / checkpointing.ENGINE / "model.pt")
    torch.save({"decay": 0.9, "num_updates": 1, "shadow": {"w": torch.zeros(2)}},
               it / checkpointing.EMA_FILE)
    return it


def _refused(call, marker: Path, name: str):
    with pytest.raises(InputError) as err:
        call()
    assert name in str(err.value)
    assert not marker.exists(), "the payload ran"
    # the payload itself would have run under a plain unpickle (the test can fail)
    return err


def test_rank_file_with_code_is_refused_and_old_format_named(tmp_path):
    it, marker = _iter_dir(tmp_path), tmp_path / "pwned"
    _malicious(it / "rank_00000.pt", marker)
    err = _refused(lambda: checkpointing.load_checkpoint(it, 0), marker, "rank_00000.pt")
    assert "older" in str(err.value) or "pickled" in str(err.value)
    # a plain-unpickling reader would have run it: prove the payload is live
    torch.load(it / "rank_00000.pt", weights_only=False)
    assert marker.exists()


def test_old_v1_rank_file_with_numpy_state_is_refused(tmp_path):
    it = _iter_dir(tmp_path)
    torch.save({"iteration": 2, "rng": {"numpy": np.random.get_state(),
                                        "python": random.getstate()}}, it / "rank_00000.pt")
    with pytest.raises(InputError, match="rank_00000.pt"):
        checkpointing.load_checkpoint(it, 0)


@pytest.mark.parametrize("victim", ["ema", "model", "optimizer"])
def test_every_other_checkpoint_reader_refuses_code(tmp_path, victim):
    it, marker = _iter_dir(tmp_path), tmp_path / "pwned"
    if victim == "ema":
        _malicious(it / checkpointing.EMA_FILE, marker)
        call, name = (lambda: checkpointing.read_weights(it)), checkpointing.EMA_FILE
    elif victim == "model":
        _malicious(it / checkpointing.ENGINE / "model.pt", marker,
                   lambda p: {"model": {"w": p}})
        call, name = (lambda: checkpointing.read_weights(it)), "model.pt"
    else:
        shard = _malicious(it / checkpointing.ENGINE / "optim_rank00000.pt", marker)
        call, name = (lambda: engine_ckpt._optimizer_states(shard.parent, {
            "optimizer_files": [shard.name]})), shard.name
    _refused(call, marker, name)


def test_rng_state_round_trips_without_pickle(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.standard_normal()          # leaves a cached gaussian in numpy's state
    state = checkpointing.rng_state()
    torch.save({"format": checkpointing.RANK_FILE_FORMAT, "rng": state}, tmp_path / "r.pt")
    want = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    back = checkpointing.read_rank_file(tmp_path / "r.pt")
    checkpointing.set_rng_state(back["rng"])
    got = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    assert got == want
