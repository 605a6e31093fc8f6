"""`protdp predict --db` searches each target's MSA when a process claims it from the run's work
queue (issue 45), not a static share per rank: two processes started by hand on one --out
search every target once between them (each target once in summary.csv), a target whose
search fails is its summary row while the rest go on, and with --prefetch the search runs in
the worker process, giving the same predictions as inline."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from msa_fixtures import FAMILIES, family_records, msa_sequences, write_fasta
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.claimed_search import SEARCH_FAILED, ClaimedSearch, prepare_search
from protdp.inference.layout import current_prediction
from protdp.inference.predictor import PredictConfig
from protdp.model import build_model
from protdp.msa import SearchSettings
from protdp.paths import REPO_ROOT
from protdp.workflows import predict

TINY = REPO_ROOT / "configs" / "model" / "tiny.yaml"
SEARCHED = ("2p90_A02", "T1055", "102m_A")
BLOCKED = "blocked"            # its search folder is a file: its search fails
# the CLI with every search call logged as "<pid> <stem>" (one line each)
DRIVER = """
import os, sys
import protdp.inference.claimed_search as cs
real = cs.search_targets
def logged(queries, *a, **k):
    with open(os.environ["SEARCH_LOG"], "a") as fh:
        fh.write("".join(f"{os.getpid()} {q.stem}\\n" for q in queries))
    return real(queries, *a, **k)
cs.search_targets = logged
from protdp.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("claimed")
    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(TINY, verbose=False), None, tmp / "tiny.pt",
                                 training_crop=32, max_msa_rows=16)
    families = {k: FAMILIES[k] for k in ("2p90_A02", "T1055", "102m_A", "1a00_A")}
    db = write_fasta(tmp / "uniref_mini.fasta.gz",
                     family_records(data_dir, families, background=False))
    seqs = {n: msa_sequences(data_dir / FAMILIES[n])[0][:80] for n in SEARCHED}
    seqs[BLOCKED] = seqs["T1055"][:40]
    fasta = tmp / "t.fasta"
    fasta.write_text("".join(f">{n}\n{s}\n" for n, s in seqs.items()))
    return ckpt, db, fasta


def _block(out: Path) -> None:
    (out / "msa_search").mkdir(parents=True)
    (out / "msa_search" / BLOCKED).write_text("a file where the target's search folder goes")


def _launch_env(launch: str, rank: int, port: str) -> dict:
    """Two processes by hand (job-array tasks), or two ranks of one SLURM step (each then
    world size 2, as srun sets them)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK")}
    if launch == "by_hand":
        return base
    return {**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}


@pytest.mark.parametrize("launch", ["by_hand", "slurm_ranks"])
def test_two_processes_search_what_they_claim(tmp_path, inputs, launch):
    import socket
    ckpt, db, fasta = inputs
    out = tmp_path / "out"
    _block(out)
    log = tmp_path / "search.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    cmd = [sys.executable, "-c", DRIVER, "predict", "--checkpoint", str(ckpt), "--fasta",
           str(fasta), "--out", str(out), "--db", str(db), "--allow-unreleased", "--no-plots",
           "--no-progress", "--device", "cpu", "--max-msa-rows", "16", "--search-workers", "1",
           "--prefetch", "0", "--dist-timeout-minutes", "2"]
    procs = [subprocess.Popen(cmd, env={**_launch_env(launch, r, port), "SEARCH_LOG": str(log),
                                        "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    with open(out / "summary.csv", newline="") as fh:
        rows = {r["id"]: r for r in csv.DictReader(fh)}
    assert sorted(rows) == sorted((*SEARCHED, BLOCKED))         # each target exactly once
    calls = [line.split() for line in log.read_text().splitlines()]
    # every target searched once, by the process that claimed it (never a static share each)
    assert sorted(stem for _, stem in calls) == sorted((*SEARCHED, BLOCKED))
    summary = {r["target"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert summary[BLOCKED]["status"] == "rejected"
    assert summary[BLOCKED]["detail"].startswith(SEARCH_FAILED)
    for name in SEARCHED:
        prov = json.loads((current_prediction(out / "targets" / name) / "provenance.json")
                          .read_text())
        [msa] = prov["inputs"]["msa_files"]
        assert Path(msa["path"]) == (out / "msa_search" / name / "uniref_mini.a3m").resolve()
        assert summary[name]["msa_depth"] > 1 and summary[name]["status"] != "rejected"
        assert prov["config"]["msa_search"]["databases"][0]["path"] == str(Path(db).resolve())
        assert prov["world_size"] == (2 if launch == "slurm_ranks" else 1)


def test_prefetched_search_is_the_inline_one(tmp_path, inputs, monkeypatch):
    """--prefetch: the worker process searches and featurizes; the main process searches
    nothing itself, and the rows equal those of the inline search."""
    ckpt, db, fasta = inputs
    cfg = PredictConfig(max_length=200, max_msa_rows=16, plots=False)
    runs = {}
    for name, workers in (("inline", 0), ("ahead", 1)):
        out = tmp_path / name
        _block(out)
        search, prov = prepare_search([str(db)], out / "msa_search", SearchSettings())
        if workers:
            searched_here = []
            real = ClaimedSearch.outcome

            def counting(self, t):
                searched_here.append(t.target_id)
                return real(self, t)

            monkeypatch.setattr(ClaimedSearch, "outcome", counting)
        runs[name] = predict(ckpt, fasta, out, config=cfg, progress=False, release_gate="off",
                             claimed_search=search, msa_search=prov, prefetch_workers=workers)
    assert searched_here == []              # every search ran in the prefetch worker
    keys = ("target", "status", "msa_depth", "mean_plddt", "detail")
    inline = [{k: r[k] for k in keys} for r in runs["inline"].rows]
    ahead = [{k: r[k] for k in keys} for r in runs["ahead"].rows]
    assert [r["detail"] for r in inline if r["target"] == BLOCKED][0].startswith(SEARCH_FAILED)
    for a, b in zip(inline, ahead):
        assert a["detail"].replace(str(tmp_path / "inline"), "") == \
            b["detail"].replace(str(tmp_path / "ahead"), "")
        assert (a["target"], a["status"], a["msa_depth"], a["mean_plddt"]) == \
            (b["target"], b["status"], b["msa_depth"], b["mean_plddt"])
