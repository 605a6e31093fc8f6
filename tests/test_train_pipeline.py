"""End-to-end pretraining on a small real store: 2-rank torchrun run where the loss goes down,
exact resume (through mpirun), reshard resume 2 -> 1 (`protdp train`), SIGKILL of a worker
under `torchrun --max-restarts 2`, and a hung (SIGSTOPped) peer ending in a clear timeout error.

One store and one reference run are built per module and shared; everything uses the tiny model.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from data_fixtures import build_pairs_store
from model_fixtures import af2_reference  # noqa: F401  (fixture)
from protdp.paths import REPO_ROOT
from protdp.train import checkpointing, report
from protdp.train import cli as train_cli
from protdp.train.launch import mpirun_cmd, torchrun_cmd, worker_env
from protdp.train.logging import PHASES

# small real families (<= ~300 residues, shallow MSAs) so the store builds in about a second
FAMILIES = {"2q2k_A", "5awl_A", "7a4d_E", "102m_A", "T1055", "4hhb_B", "2p90_A02", "T1042"}
SKIP_MSAS = {"msa/4hhb_B.colabfold.a3m", "msa/2p90_A02.hhblits.a3m"}  # the deep ones
ITERS = 20


def tiny_argv(store, **over) -> list[str]:
    opts = {"config": "configs/train/tiny.yaml", "data": str(store), "global-batch-size": "4",
            "train-iters": str(ITERS), "save-interval": "5", "keep-last": "4", "log-interval": "5",
            "distributed-timeout-minutes": "1", **over}
    argv = []
    for k, v in opts.items():
        if v is not None:
            argv += [f"--{k}", str(v)]
    return argv + ["--overlap-grad-reduce", "--use-distributed-optimizer"]


def run(cmd: list[str], timeout: float = 150) -> str:
    proc = subprocess.run(cmd, env=worker_env(), cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-4000:]}"
    return out


def model_params(ckpt_dir: Path) -> dict:
    return torch.load(ckpt_dir / checkpointing.ENGINE / "model.pt", weights_only=True)["model"]


def assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a), f"params differ (max abs diff {diff:.3g})"


@pytest.fixture(scope="module")
def store(data_dir, tmp_path_factory) -> Path:
    return build_pairs_store(data_dir, FAMILIES, tmp_path_factory.mktemp("store"), SKIP_MSAS)


@pytest.fixture(scope="module")
def reference(store, tmp_path_factory) -> tuple[Path, str]:
    """2 ranks under torchrun, 20 iterations, checkpoints every 5, wandb offline."""
    save = tmp_path_factory.mktemp("ref") / "ckpt"
    out = run(torchrun_cmd(tiny_argv(store, save=save, **{"wandb-mode": "offline"}), nproc=2))
    return save, out


def test_two_rank_run_loss_goes_down_and_logs_breakdown(reference):
    save, out = reference
    train, evals = report.read_metrics(save / "metrics.jsonl")
    assert [r["iteration"] for r in train] == list(range(1, ITERS + 1))
    losses = [r["loss"] for r in train]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first, f"loss did not go down: first 5 mean {first:.3f}, last 5 mean {last:.3f}"
    for r in train:
        for key in ("time/data_wait", "time/forward", "time/backward", "time/exposed_comm",
                    "time/optimizer", "time/step", "samples_per_s", "residues_per_s", "max_memory_mb",
                    "loss/fape", "loss/distogram", "loss/masked_msa", "loss/plddt", "grad_norm"):
            assert r[key] is not None and r[key] >= 0, key
        assert r["samples"] == 4 and r["time/forward"] > 0 and r["time/backward"] > 0
        assert r["attention_kernel"] == "recompute"         # CPU, pair bias needs a gradient
        assert sum(r[f"time/{p}"] for p in PHASES) <= r["time/step_mean"] <= r["time/step"]
    assert [e["iteration"] for e in evals] == [10, 20]
    assert all(0 <= e["val_lddt_ca"] <= 1 and e["val_families"] == 2 for e in evals)
    assert "exposed_comm" in out and "final val lDDT-Cα (EMA weights)" in out
    assert checkpointing.list_checkpoints(save) == [5, 10, 15, 20]
    meta = json.loads((save / "iter_0000020" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["config"]["global_batch_size"] == 4
    assert meta["code_version"]["git_commit"] and len(os.listdir(save / "iter_0000020")) >= 4
    assert list((save / "wandb").glob("offline-run-*")), "wandb offline run missing"
    # protdp report renders the curves and the breakdown
    assert train_cli.report([str(save)]) == 0
    for name in ("loss", "lddt", "breakdown", "throughput"):
        assert (save / f"{name}.png").stat().st_size > 5000


def test_exact_resume_through_mpirun(reference, store, tmp_path):
    """15 + 5 iterations with a resume (launched by mpirun) == 20 in one run, bit for bit."""
    if shutil.which("mpirun") is None:
        pytest.fail("OpenMPI's mpirun is not installed (apt-get install openmpi-bin; .ci/run does)")
    save, _ = reference
    resumed = tmp_path / "ckpt"
    resumed.mkdir()
    shutil.copytree(save / "iter_0000015", resumed / "iter_0000015")
    out = run(mpirun_cmd(tiny_argv(store, save=resumed, load=resumed), np=2))
    assert "resumed from" in out and "dp=2 (mpirun)" in out
    assert_same_params(model_params(resumed / "iter_0000020"), model_params(save / "iter_0000020"))
    ema_a = torch.load(resumed / "iter_0000020" / "ema.pt")["shadow"]
    ema_b = torch.load(save / "iter_0000020" / "ema.pt")["shadow"]
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)


def test_reshard_resume_two_ranks_to_one(reference, store, tmp_path):
    """A dp=2 checkpoint loads at dp=1: model, EMA and optimizer state round-trip exactly, the
    sampler re-partitions the rest of the epoch, and `protdp train` continues the run."""
    import torch.distributed as dist

    from protdp.parallel import consolidate_optimizer
    from protdp.train.args import parse_args
    from protdp.train.cli import main as train_main
    from protdp.train.trainer import Trainer

    save, _ = reference
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(save / "iter_0000010", src / "iter_0000010")
    again = tmp_path / "again"
    trainer = Trainer(parse_args(tiny_argv(store, load=src, save=again, **{"data-parallel-size": 1})))
    try:
        assert trainer.iteration == 10 and trainer.world == 1 and trainer.num_micro == 4
        trainer.save()  # re-save at dp=1 without training
    finally:
        trainer.logger.close()
        dist.destroy_process_group()
    assert_same_params(model_params(again / "iter_0000010"), model_params(src / "iter_0000010"))
    opt_a = consolidate_optimizer(src / "iter_0000010" / checkpointing.ENGINE)
    opt_b = consolidate_optimizer(again / "iter_0000010" / checkpointing.ENGINE)
    assert opt_a.keys() == opt_b.keys()
    for name in opt_a:
        for key in opt_a[name]:
            assert torch.equal(opt_a[name][key], opt_b[name][key]), (name, key)
    state = torch.load(again / "iter_0000010" / "rank_00000.pt", weights_only=True)["sampler"]
    assert state["segments"][0][0] == 2 and state["segments"][-1][:2] == [1, 1]
    # continue at dp=1 through the `protdp train` entry point
    assert train_main(tiny_argv(store, load=src, save=src, **{"train-iters": 11, "eval-iters": 0})) == 0
    train, _ = report.read_metrics(src / "metrics.jsonl")
    assert [r["iteration"] for r in train] == [11] and train[0]["samples"] == 4
    assert checkpointing.list_checkpoints(src) == [10, 11]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _worker_pid(launcher_pid: int, rank: int) -> int | None:
    for pid in _descendants(launcher_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"\0".join(env):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"protdp.train" in cmdline or b"pretrain.py" in cmdline:   # the training worker
                return pid
    return None


class _Output:
    """Collects a child's merged stdout/stderr in a thread (so pipes never fill up)."""

    def __init__(self, proc: subprocess.Popen):
        self.text = ""
        self.thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self.thread.start()

    def _pump(self, proc):
        for line in proc.stdout:
            self.text += line


def _wait_for(cond, proc, out: _Output, timeout: float, what: str):
    deadline = time.time() + timeout
    while not cond():
        if proc.poll() is not None:
            out.thread.join(5)
            pytest.fail(f"run ended (exit {proc.returncode}) before {what}:\n{out.text[-4000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}:\n{out.text[-4000:]}")
        time.sleep(0.05)


def test_sigkilled_worker_restarts_from_checkpoint_and_completes(reference, store, tmp_path):
    """torchrun --max-restarts 2: SIGKILL rank 1 after the first checkpoint; the job restarts
    from it and ends with exactly the parameters of the uninterrupted reference run."""
    save, _ = reference
    ckpt = tmp_path / "ckpt"
    argv = tiny_argv(store, save=ckpt, **{"save-interval": 5, "keep-last": 2})
    proc = subprocess.Popen(torchrun_cmd(argv, nproc=2, max_restarts=2), env=worker_env(),
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = _Output(proc)
    _wait_for(lambda: checkpointing.latest_checkpoint(ckpt) is not None, proc, out, 120,
              "the first checkpoint")
    victim = _worker_pid(proc.pid, rank=1)
    assert victim is not None, "rank 1 worker not found"
    killed_after = checkpointing.list_checkpoints(ckpt)[-1]
    os.kill(victim, signal.SIGKILL)
    rc = proc.wait(timeout=180)
    out.thread.join(10)
    assert rc == 0, out.text[-4000:]
    assert killed_after < ITERS, "the run finished before the kill: nothing was tested"
    assert "resumed from" in out.text and "restart #1" in out.text
    train, _ = report.read_metrics(ckpt / "metrics.jsonl")
    assert [r["iteration"] for r in train] == list(range(1, ITERS + 1))
    assert train[-1]["restart"] == 1
    assert checkpointing.list_checkpoints(ckpt) == [15, 20]  # keep-last 2
    assert_same_params(model_params(ckpt / "iter_0000020"), model_params(save / "iter_0000020"))


def test_hung_peer_ends_in_clear_timeout_error(store, tmp_path):
    """A SIGSTOPped rank must make the other rank fail with an error naming rank and collective."""
    argv = tiny_argv(store, **{"train-iters": 500, "distributed-timeout-minutes": 0.1,
                               "log-dir": tmp_path, "eval-interval": 1000, "save-interval": None})
    proc = subprocess.Popen(torchrun_cmd(argv, nproc=2), env=worker_env(), cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = _Output(proc)
    metrics = tmp_path / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, proc, out, 120,
              "two training steps")
    victim = _worker_pid(proc.pid, rank=1)
    assert victim is not None
    t0 = time.time()
    os.kill(victim, signal.SIGSTOP)
    try:
        _wait_for(lambda: "pretrain: error: rank 0: collective" in out.text, proc, out, 60,
                  "rank 0's timeout error")
        waited = time.time() - t0
    finally:
        os.kill(victim, signal.SIGCONT)
    rc = proc.wait(timeout=60)
    out.thread.join(10)
    assert rc != 0
    line = next(ln for ln in out.text.splitlines() if "pretrain: error: rank 0: collective" in ln)
    assert "timeout" in line.lower() or "timed out" in line.lower(), line
    assert waited < 40, f"error took {waited:.0f} s for a 6 s timeout"


def test_non_finite_activations_skip_the_step_instead_of_leaving_collectives(store, tmp_path):
    """A rank whose model output is non-finite (compute_loss raises NonFiniteError) must not drop
    out of the collectives: it back-propagates NaN into every gradient, the optimizer's
    all-reduced vote skips the step, the weights stay put, and the next step trains normally."""
    import torch.distributed as dist

    from protdp.model.losses import NonFiniteError
    from protdp.train.args import parse_args
    from protdp.train.trainer import Trainer

    trainer = Trainer(parse_args(tiny_argv(store, save=tmp_path / "ck", **{"data-parallel-size": 1,
                                                                           "train-iters": "3"})))
    real_loss, calls = trainer.compute_loss, {"n": 0}

    def flaky_loss(outputs, batch, config):
        calls["n"] += 1
        if calls["n"] == trainer.num_micro + 1:          # first micro-batch of the second step
            raise NonFiniteError("3 non-finite value(s) in model outputs", field="plddt_logits")
        return real_loss(outputs, batch, config)

    trainer.compute_loss = flaky_loss
    try:
        first = trainer.train_step()
        before = {k: v.detach().clone() for k, v in trainer.ddp.module.state_dict().items()}
        skipped = trainer.train_step()
        after = {k: v.detach().clone() for k, v in trainer.ddp.module.state_dict().items()}
        third = trainer.train_step()
    finally:
        trainer.logger.close()
        dist.destroy_process_group()
    assert not first["skipped"] and skipped["skipped"] and not third["skipped"]
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, changed[:5]
    assert set(skipped) == set(first)                     # same metric keys: same all-reduce


def test_finetune_from_model_file_loads_weights_only_and_resumes_exactly(reference, store, tmp_path):
    """--finetune-from: the run starts from the source's (EMA) weights with a fresh optimizer,
    schedule and EMA, on 2 ranks with overlap + the distributed optimizer; exact resume holds."""
    from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint

    source = load_model_checkpoint(reference[0])               # the reference's EMA weights
    src = save_model_checkpoint(source.model, source.config, tmp_path / "src.pt")
    want = {k: v.clone() for k, v in source.model.state_dict().items()}

    # lr 1e-30: Adam's updates vanish in fp32, so after two steps the weights are the source's
    frozen = tmp_path / "frozen"
    out = run(torchrun_cmd(tiny_argv(store, save=frozen, **{
        "finetune-from": src, "train-iters": 2, "save-interval": 2, "lr": "1e-30",
        "lr-warmup-iters": 0}), nproc=2))
    assert "fine-tuning from" in out and "model-file, raw weights" in out
    # (bitwise except weights that are exactly 0 in the source, e.g. behind a dead ReLU unit:
    # an Adam step of 1e-30 is representable there)
    got = model_params(frozen / "iter_0000002")
    assert got.keys() == want.keys()
    assert all(torch.allclose(got[k], want[k], rtol=0, atol=1e-25) for k in want)
    meta = json.loads((frozen / "iter_0000002" / "meta.json").read_text())
    assert meta["config"]["finetune_source"]["kind"] == "model-file"
    assert meta["config"]["finetune_source"]["path"] == str(src.resolve())
    optim = torch.load(frozen / "iter_0000002" / checkpointing.ENGINE / "optim_rank00000.pt",
                       weights_only=True)
    assert optim["step"] == 2.0                                # a fresh optimizer, not the source's

    # exact resume: 3 iterations straight == 2, then --load for the third
    straight, split = tmp_path / "straight", tmp_path / "split"
    ft = {"finetune-from": src, "save-interval": 1, "lr-warmup-iters": 0, "lr-decay-iters": 3}
    run(torchrun_cmd(tiny_argv(store, save=straight, **{**ft, "train-iters": 3}), nproc=2))
    run(torchrun_cmd(tiny_argv(store, save=split, **{**ft, "train-iters": 2}), nproc=2))
    out = run(torchrun_cmd(tiny_argv(store, save=split, load=split, **{**ft, "train-iters": 3}),
                           nproc=2))
    assert "resumed from" in out
    assert_same_params(model_params(split / "iter_0000003"), model_params(straight / "iter_0000003"))


def test_finetune_from_mismatched_config_is_one_clear_error(reference, store, tmp_path):
    out = subprocess.run(torchrun_cmd(tiny_argv(store, **{
        "finetune-from": reference[0], "model-config": "configs/model/small.yaml",
        "train-iters": 4, "save-interval": None}), nproc=1), env=worker_env(), cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=150)
    assert out.returncode != 0
    assert "--finetune-from" in out.stderr and "do not fit the model config" in out.stderr


def test_finetune_from_imported_alphafold_weights(store, tmp_path, af2_reference):  # noqa: F811
    """The published-weights path: AlphaFold's own npz (the reference fixture's model_3_ptm)
    imported, then fine-tuned on 2 ranks with overlap + the distributed optimizer from the
    fine-tuning recipe (configs/train/finetune.yaml, sized down): it starts from exactly the
    imported weights (lr 1e-30) and trains all-atom with AF2's fine-tuning losses."""
    from protdp.cli import main as protdp_main
    from protdp.inference.checkpoint import load_model_checkpoint

    root = af2_reference
    ckpt = tmp_path / "af2"
    assert protdp_main(["weights", "import", "--format", "alphafold",
                        str(root / "params" / "params_model_3_ptm_small.npz"), "--out", str(ckpt),
                        "--alphafold-config", str(root / "config_model_3_ptm_small.json")]) == 0
    imported = load_model_checkpoint(ckpt)
    small = {"config": "configs/train/finetune.yaml", "crop-size": 32, "max-msa-rows": 8,
             "max-extra-msa-rows": 8, "global-batch-size": 2, "train-iters": 2,
             "save-interval": 2, "eval-interval": 100, "wandb-mode": "disabled",
             "distributed-timeout-minutes": 2, "finetune-from": ckpt, "data": store,
             "no-release-check": None}
    argv = [a for k, v in {**small, "lr": "1e-30", "save": tmp_path / "ft"}.items()
            for a in ([f"--{k}"] if v is None else [f"--{k}", str(v)])]
    out = run(torchrun_cmd(argv, nproc=2), timeout=400)
    assert "fine-tuning from" in out and "model-file, raw weights" in out
    want = {k: v for k, v in imported.model.state_dict().items()}
    got = model_params(tmp_path / "ft" / "iter_0000002")
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in want) < 1e-20
    train, _ = report.read_metrics(tmp_path / "ft" / "metrics.jsonl")
    assert len(train) == 2 and all(r["loss/violation"] >= 0 for r in train)
    assert all(r["loss/experimentally_resolved"] >= 0 for r in train)
