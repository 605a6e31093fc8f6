"""The trainer's release check (`release_check: true`) submits what `protdp release` accepts:
a monomer run's iteration folder; a run fine-tuned on complexes, its run folder, after
multimer_model.pt is written (`protdp release <run>/iter_N` refuses such a run). The real
`Trainer.save` / `ComplexTrainer.write_servable` run with the real `ReleaseChecks`; only the
collective checkpoint write, the model and the `protdp release` command are stand-ins (a shell
command that records its folder and whether the multimer checkpoint was there)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from protdp.fileio import sha256_file
from protdp.train import checkpointing, complex as complex_mod
from protdp.train.complex import MULTIMER_MODEL_FILE, ComplexTrainer
from protdp.train.release_jobs import RELEASE_LOG, ReleaseChecks
from protdp.train.trainer import Trainer


@dataclasses.dataclass
class _TinyConfig:
    c_m: int = 4


class _Ema:
    def state_dict(self):
        return {}

    @contextlib.contextmanager
    def swapped_into(self, model):
        yield


def _trainer(cls, run: Path, checks: ReleaseChecks, logged: list[str]):
    """`cls` without its (data-, model- and process-group-building) __init__: what save reads."""
    t = cls.__new__(cls)
    t.pcfg = SimpleNamespace(overlap_param_gather=False)
    t.rank, t.world, t.iteration = 0, 1, 7
    t.args = SimpleNamespace(save=str(run), keep_last=0, to_dict=dict)
    t.release_checks, t.ema, t.model = checks, _Ema(), torch.nn.Linear(2, 2)
    t.feed = SimpleNamespace(sampler_states=dict)
    t.model_config, t.finetune_source = _TinyConfig(), None
    t.logger = SimpleNamespace(print=logged.append)
    return t


@pytest.fixture
def fake_checkpoint_write(monkeypatch):
    def save_checkpoint(saver, save_dir, iteration, **_):
        final = Path(save_dir) / checkpointing.iter_dir_name(iteration)
        final.mkdir(parents=True)
        return final
    monkeypatch.setattr(checkpointing, "save_checkpoint", save_checkpoint)

    def write_multimer(model, state, out_dir):
        target = Path(out_dir) / MULTIMER_MODEL_FILE
        target.write_bytes(b"multimer weights " + str(sorted(state)).encode())
        return target
    monkeypatch.setattr(complex_mod, "write_multimer_checkpoint", write_multimer)


@pytest.mark.parametrize("cls", [Trainer, ComplexTrainer])
def test_save_submits_the_folder_protdp_release_accepts(tmp_path, fake_checkpoint_write, cls):
    run = tmp_path / "run"
    run.mkdir()
    # stands in for `protdp release FOLDER`: records the folder and whether it holds the
    # multimer checkpoint at the moment the check starts
    checks = ReleaseChecks(log=print, command=lambda ck: [
        "/bin/sh", "-c", f'echo "$1 $(test -f "$1/{MULTIMER_MODEL_FILE}" && echo multimer)"',
        "release", str(ck)])
    logged: list[str] = []
    _trainer(cls, run, checks, logged).save()
    job = checks.finish()
    iter_dir = run / checkpointing.iter_dir_name(7)
    if cls is ComplexTrainer:
        assert checks.launched == [run] and job.path == run
        assert (run / RELEASE_LOG).read_text().split() == [str(run), "multimer"]
        assert any(MULTIMER_MODEL_FILE in line for line in logged), logged
    else:
        assert checks.launched == [iter_dir] and job.path == iter_dir
        assert (iter_dir / RELEASE_LOG).read_text().split() == [str(iter_dir)]
        assert not (run / MULTIMER_MODEL_FILE).exists()


def test_release_verdict_binds_the_served_checkpoints_digest(tmp_path, monkeypatch):
    """The end-of-training verdict reads release.json with the digest `protdp release` records:
    the multimer file's sha256 for a complex run, the iteration's weight files otherwise."""
    run = tmp_path / "run"
    run.mkdir()
    (run / MULTIMER_MODEL_FILE).write_bytes(b"weights")
    complex_t = _trainer(ComplexTrainer, run, None, [])
    assert complex_t.servable_digest(run) == sha256_file(run / MULTIMER_MODEL_FILE)
    seen = []
    monkeypatch.setattr(checkpointing, "checkpoint_digest", lambda p: seen.append(p) or "d")
    assert _trainer(Trainer, run, None, []).servable_digest(run / "iter_7") == "d"
    assert seen == [run / "iter_7"]
