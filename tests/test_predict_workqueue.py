"""`protdp predict` through the work queue (issue 45): two processes started by hand on the
same inputs and --out share the targets; one killed with kill -9 midway loses its target only
until its lease runs out, the other finishes every target and summary.csv has each exactly
once; `protdp predict --status OUT` names who is running what."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import torch
import yaml

from protdp.cli import main as protdp_main
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.layout import current_prediction
from protdp.model.model import build_model
from protdp.paths import REPO_ROOT
from protdp.workqueue import run_status

TINY = yaml.safe_load((REPO_ROOT / "configs" / "model" / "tiny.yaml").read_text())
SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQFEVVHSLAKWKRQTLGQHDFSAGEGLYTHMKALRPDEDRLSPLHSVYVDQWDWERVMGDGERQFSTLKSTVEAIWAGIKATEAAVSEEFGLAPFLPDQIHFVHSQELLSRYPDLDAKGRERAIAKDLGAVFLVGIGGKLSDGHRHDVRAPDYDDWAAVYHQGTLEERINPLF"
LEASE_S = 3.0


def _cmd(ckpt, fasta, out):
    return [sys.executable, "-m", "protdp.cli", "predict", "--checkpoint", str(ckpt), "--fasta",
            str(fasta), "--out", str(out), "--allow-unreleased", "--no-plots", "--no-progress",
            "--msa-mode", "single_sequence", "--lease-seconds", str(LEASE_S)]


def _summary_ids(out):
    with open(out / "summary.csv", newline="") as fh:
        return [r["id"] for r in csv.DictReader(fh)]


def _held_by(queue, pid):
    """The target process `pid` holds in the run's queue (None: none, or no run yet)."""
    if not queue.is_file():
        return None
    try:
        st = run_status(str(queue))
    except Exception:   # noqa: BLE001  (the run is being created)
        return None
    return next((r for r in st["running"] if r["pid"] == pid), None)


def _model_and_targets(tmp_path, names: list[str], *, first: int, step: int):
    """A tiny model checkpoint and a FASTA of `names`, target i being SEQ's first
    `first + step * i` residues."""
    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(TINY, verbose=False), None, tmp_path / "m.pt")
    fasta = tmp_path / "t.fasta"
    fasta.write_text("".join(f">{n}\n{SEQ[:first + step * i]}\n" for i, n in enumerate(names)))
    return ckpt, fasta


def test_two_processes_by_hand_one_killed(tmp_path, capsys):
    names = [f"t{i:02d}" for i in range(10)]
    # lengths 40..130: long enough that each process holds a target for a while
    ckpt, fasta = _model_and_targets(tmp_path, names, first=40, step=10)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    survivor = subprocess.Popen(_cmd(ckpt, fasta, out), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    victim = subprocess.Popen(_cmd(ckpt, fasta, out), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    queue = out / ".summary_parts" / "work_queue.sqlite"
    held, deadline = None, time.monotonic() + 120
    try:
        while held is None and time.monotonic() < deadline:     # the victim holds a target
            time.sleep(0.05)
            if _held_by(queue, victim.pid) is None:
                continue
            os.kill(victim.pid, signal.SIGSTOP)      # frozen while it holds it (or just not)
            held = _held_by(queue, victim.pid)
            if held is None:
                os.kill(victim.pid, signal.SIGCONT)
        assert held is not None, "the second process never claimed a target"
        # --status: who runs what (read from the queue while both processes are alive)
        assert protdp_main(["predict", "--status", str(out)]) == 0
        shown = capsys.readouterr().out
        assert f"running {held['name']}: rank 0 on {held['host']} pid {victim.pid}" in shown
        assert "of 10" in shown and "left" in shown
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    stdout, stderr = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, stderr[-3000:]
    assert victim.returncode == -signal.SIGKILL
    ids = _summary_ids(out)
    assert sorted(ids) == names                                 # every target, exactly once
    assert "10 targets:" in stdout
    st = run_status(str(queue))
    assert st["counts"]["done"] == 10 and st["running"] == []
    # the killed process's target was predicted by the survivor, after the lease ran out
    prov = json.loads((current_prediction(out / "targets" / held["name"]) /
                       "provenance.json").read_text())
    assert prov["host"] and (out / "targets" / held["name"] / "CURRENT").is_file()
    from sqlalchemy import select

    from protdp.workqueue import WorkQueue
    from protdp.workqueue.schema import items
    q = WorkQueue(str(queue), st["run_key"])
    with q.db.tx(readonly=True) as conn:
        row = conn.execute(select(items.c.attempts, items.c.pid).where(
            items.c.run_key == st["run_key"], items.c.idx == held["idx"])).first()
    q.close()
    assert row.attempts == 2 and row.pid == survivor.pid
    # a re-launch into the same --out: the finished run is verified, nothing predicted again
    again = subprocess.run(_cmd(ckpt, fasta, out), env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(10 already complete, skipped)" in again.stdout
    assert sorted(_summary_ids(out)) == names


def test_status_of_a_folder_without_a_run_is_one_line(tmp_path, capsys):
    assert protdp_main(["predict", "--status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no prediction run has started in this folder" in err
    assert protdp_main(["predict", "--status", str(tmp_path / "nope")]) == 2
    assert "output folder not found" in capsys.readouterr().err
    (tmp_path / "t.fasta").write_text(">a\nMKT\n")
    (tmp_path / "m.pt").write_bytes(b"")
    assert protdp_main(["predict", "--checkpoint", str(tmp_path / "m.pt"), "--fasta",
                        str(tmp_path / "t.fasta"), "--out", str(tmp_path / "o"),
                        "--lease-seconds", "0"]) == 2
    assert "--lease-seconds 0: must be > 0" in capsys.readouterr().err


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_slurm_ranks_share_the_queue(tmp_path):
    """Two ranks of one SLURM step (SLURM_PROCID / SLURM_NTASKS, as srun sets them) claim from
    one queue: every target predicted once, by one of the two ranks."""
    names = [f"s{i}" for i in range(6)]
    ckpt, fasta = _model_and_targets(tmp_path, names, first=20, step=8)
    out = tmp_path / "out"
    port = str(_free_port())
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK")}
    procs = [subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "pipelines" / "predict.py"), *_cmd(ckpt, fasta, out)[4:],
         "--dist-timeout-minutes", "2"],
        env={**base, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "SLURM_PROCID": str(r),
             "SLURM_LOCALID": str(r), "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2",
             "SLURM_JOB_NODELIST": "localhost", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert sorted(_summary_ids(out)) == names
    worlds = {json.loads((current_prediction(out / "targets" / n) / "provenance.json")
                        .read_text())["world_size"] for n in names}
    assert worlds == {2} and "6 targets:" in outs[0][0]
