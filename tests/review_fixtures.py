"""Helpers shared by the review-queue tests: a throwaway PostgreSQL schema per test, queue
URL fixtures for both backends, realistic gated items, queues with an admin and reviewers,
and the multi-process claim worker.

PostgreSQL comes from env PROTDP_TEST_PG_URL (.ci/run exports it) or the same default URL;
an unreachable server makes the tests fail, never skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from protdp.gating import GatePolicy, route
from protdp.paths import REPO_ROOT
from protdp.inference.layout import current_prediction

PG_DEFAULT_URL = "postgresql://protdp:protdp@127.0.0.1:5432/protdp_test"


def pg_base_url() -> str:
    return os.environ.get("PROTDP_TEST_PG_URL") or PG_DEFAULT_URL


@contextlib.contextmanager
def pg_schema_url():
    """A fresh schema on the test server; yields a URL whose search_path points at it."""
    base = make_url(pg_base_url())
    admin_url = base.set(drivername="postgresql+psycopg2") if base.drivername == "postgresql" \
        else base
    admin = create_engine(admin_url)
    schema = f"protdp_t_{uuid.uuid4().hex[:12]}"
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        pytest.fail(f"PostgreSQL test server unreachable at {base.render_as_string()} "
                    f"(.ci/run installs and starts it; see DESIGN.md): {exc.orig}")
    try:
        yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def queue_url(request, tmp_path):
    """The same test against a SQLite file and against a real PostgreSQL server."""
    if request.param == "sqlite":
        yield str(tmp_path / "queue.sqlite")
    else:
        with pg_schema_url() as url:
            yield url


@pytest.fixture
def sqlite_url(tmp_path):
    return str(tmp_path / "queue.sqlite")


def gated_item(i: int, *, target: str | None = None, mean: float = 55.0, length: int = 40,
               out_dir: Path | None = None) -> dict:
    """enqueue() kwargs for a prediction the real gate sends to review (a ramp of pLDDT)."""
    plddt = np.clip(np.linspace(mean - 25, mean + 25, length), 0, 100)  # [L]
    decision = route(plddt, length=length, msa_depth=12, training_crop=256, policy=GatePolicy())
    assert decision.route == "needs_review"
    paths = {}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for kind, ext in (("pdb", "pdb"), ("cif", "cif")):
            p = out_dir / f"pred{i}.{ext}"
            p.write_text(f"REMARK prediction {i} ({kind})\n")
            paths[kind] = str(p)
    return dict(prediction_id=f"run1/target{i}", target=target or f"target{i}",
                scores={"plddt": plddt, "mean_plddt": decision.mean_plddt,
                        "afdb_bands": decision.afdb_bands},
                paths=paths, reasons=decision.reasons, details=decision.details)


def queue_with(url: str, *names: str, admin_name: str = "admin"):
    """(store, admin, {name: token}): a queue with its first admin and reviewers `names`."""
    from protdp.review.store import ReviewStore

    store = ReviewStore(url)
    admin = store.admin(store.init_admin(admin_name))
    return store, admin, {name: admin.add_reviewer(name) for name in names}


def expire_leases(store) -> None:
    """Move every live lease an hour into the past (stands in for waiting an hour)."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE review_items SET lease_expires_at = lease_expires_at - 3600 "
                          "WHERE lease_expires_at IS NOT NULL"))


def claim_worker(url: str, token: str, barrier, out_path: str) -> None:
    """Claim-and-decide until the queue is empty; write what this process did as JSON."""
    from protdp.review.store import QueueBusy, ReviewStore

    store = ReviewStore(url)
    reviewer = store.reviewer(token)
    claimed, errors = [], []
    barrier.wait()
    busy = 0

    def patiently(op, *args, **kwargs):
        """A client retries when the queue says it is busy (what the message asks for)."""
        nonlocal busy
        for _ in range(20):
            try:
                return op(*args, **kwargs)
            except QueueBusy:
                busy += 1
        return op(*args, **kwargs)

    while True:
        try:
            item = patiently(reviewer.claim, lease_seconds=600)
        except Exception as exc:  # recorded; the test fails on any
            errors.append(f"claim: {exc!r}")
            break
        if item is None:
            break
        claimed.append(item["id"])
        action = ("approve", "reject", "escalate")[item["id"] % 3]
        try:
            patiently(reviewer.decide, item["id"], action, comment=f"{action} by {reviewer.name}")
        except Exception as exc:
            errors.append(f"decide {item['id']}: {exc!r}")
    store.close()
    Path(out_path).write_text(json.dumps({"claimed": claimed, "errors": errors, "busy": busy}))


def open_worker(urls: list[str], barrier, out_paths: list[str]) -> None:
    """For each url in turn: open (and so create/migrate) the queue right after the others (one
    barrier per url); write the outcome to the matching out path."""
    from pathlib import Path

    from protdp.review.store import ReviewStore

    for url, out_path in zip(urls, out_paths):
        barrier.wait()
        try:
            ReviewStore(url).close()
            Path(out_path).write_text("ok")
        except Exception as exc:  # recorded; the test fails on any
            Path(out_path).write_text(f"error: {exc}")


def predict_into_queue(out_dir: Path, queue_url: str, data_dir: Path, *, pae_head: bool = True,
                       seed: int = 0) -> Path:
    """Run the real predictor (a tiny randomly initialised checkpoint, noised so pLDDT varies)
    on the real chain 2p90_A02 with its MSA; the flagged prediction lands in `queue_url`.
    Returns the prediction's folder."""
    import torch

    from protdp.config import load_config, read_yaml
    from protdp.data.parse import parse_structure
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.inference.predictor import PredictConfig
    from protdp.model import build_model
    from protdp.model.config import ModelConfig
    from protdp.resources import config_file
    from protdp.workflows import predict

    torch.manual_seed(seed)
    cfg = load_config(ModelConfig, {**read_yaml(config_file("model/tiny.yaml")),
                                    "pae_head": pae_head})
    model = build_model(cfg, verbose=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = save_model_checkpoint(model, None, out_dir / "tiny.pt", training_crop=32,
                                 max_msa_rows=16)
    chain = parse_structure(data_dir / "structures" / "2p90_A02.pdb")
    fasta = out_dir / "targets.fasta"
    fasta.write_text(f">2p90_A02\n{chain.sequence}\n")
    msa_dir = out_dir / "msa"
    msa_dir.mkdir(exist_ok=True)
    (msa_dir / "2p90_A02.a3m").write_bytes(
        (data_dir / "msa" / "2p90_A02.hhblits_subsample.a3m").read_bytes())
    res = predict(ckpt, fasta, out_dir / "pred", msa_dir=msa_dir, queue_url=queue_url,
                  config=PredictConfig(max_length=200, max_msa_rows=16), progress=False,
                  release_gate="review")   # a random test checkpoint: unreleased, to review
    assert res.rows[0]["route"] == "needs_review", res.rows[0]
    return current_prediction(out_dir / "pred" / "targets" / "2p90_A02")


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def review_server(url: str, log_path: Path):
    """`protdp review serve` on a free loopback port in its own process; yields its base URL
    once /healthz answers, stops it afterwards."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "protdp.cli", "review", "serve",
                                 "--queue-url", url, "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            base, deadline = f"http://127.0.0.1:{port}", time.time() + 60
            while True:
                try:
                    if httpx.get(base + "/healthz", timeout=1).text == "ok":
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, Path(log_path).read_text()
                assert time.time() < deadline, "review server did not come up"
                time.sleep(0.2)
            yield base
        finally:
            proc.terminate()
            proc.wait(20)


def complex_item(out_dir: Path, name: str = "4hhb_hbA1-36_hbB1-40") -> dict:
    """enqueue() kwargs of a complex (issue 32) from DeepMind's AlphaFold-Multimer outputs in
    the fixture: the PDB with chains A and B and scores.json written by protdp's complex
    writers, ipTM / pTM / chain-pair ipTM / interface PAE from the PAE logits, the real gate."""
    import json

    import torch

    from protdp.data.residues import RESTYPES
    from protdp.inference.complexes import complex_scores
    from protdp.model.multimer.heads import (chain_pair_actifptm, complex_confidence,
                                             contact_probability)
    from protdp.complex.outputs import write_complex_structures
    from test_complex_pairing import FIXTURE

    f, o = np.load(FIXTURE / f"features_{name}.npz"), np.load(FIXTURE / f"outputs_{name}.npz")
    seq = "".join((RESTYPES + "X")[i] for i in f["aatype"])
    asym = f["asym_id"]
    chains = [("AB"[k], "".join(c for c, a in zip(seq, asym) if a == k + 1)) for k in range(2)]
    plddt = np.round(o["confidence/plddt"].astype(np.float64), 2)
    conf = complex_confidence(torch.from_numpy(o["predicted_aligned_error/logits"]),
                              torch.linspace(0.25, 31.75, 64), torch.from_numpy(asym))
    top = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in conf.items()}
    top.update(plddt=plddt, ptm=float(conf["ptm"]), iptm=float(conf["iptm"]),
               interface_pae=float(conf["interface_pae"]),
               positions=o["structure_module/final_atom_positions"],     # interface rows
               chain_pair_actifptm=chain_pair_actifptm(
                   torch.from_numpy(o["predicted_aligned_error/logits"]),
                   torch.linspace(0.25, 31.75, 64),
                   contact_probability(torch.from_numpy(o["distogram/logits"]),
                                       torch.from_numpy(o["distogram/bin_edges"])),
                   torch.from_numpy(asym))[0].numpy())
    extra = complex_scores(chains, top)
    decision = route(plddt, length=len(seq), msa_depth=12, training_crop=None,
                     policy=GatePolicy(), sequence=seq,
                     interface={"iptm": extra["iptm"], "interface_pae": extra["interface_pae"],
                                "interface_scores": extra["interface_scores"]})
    assert decision.route == "needs_review"
    files = write_complex_structures(out_dir, name, chains, o["structure_module/final_atom_positions"],
                                     plddt, o["structure_module/final_atom_mask"])
    scores = {"sequence": seq, "plddt": plddt.tolist(), "mean_plddt": decision.mean_plddt,
              "afdb_bands": decision.afdb_bands, "ptm": round(top["ptm"], 4),
              "length": len(seq), **extra}
    (out_dir / "scores.json").write_text(json.dumps(
        {**scores, "pae": np.round(top["pae"], 2).tolist()}))
    return dict(prediction_id=f"complex/{name}", target=name, scores=scores,
                paths={"pdb": str(files["pdb"]), "scores": str(out_dir / "scores.json")},
                reasons=decision.reasons, details=decision.details)
