"""Issue 47's minor items, each with the case that showed it: a declared Content-Length of
99,999,999,999 bytes is answered 413 at once (main held the connection open); a removed
reviewer can be added again with a fresh token while the old token stays revoked; a
code-carrying rank file (a pickle whose reduce calls os.system) is called what it is, not
"not a PyTorch checkpoint"; a FIFO given as --template is named as a FIFO, not as missing."""

from __future__ import annotations

import asyncio
import os
import pickle

import pytest
import torch

from protdp.errors import InputError
from protdp.review.errors import AuthError
from protdp.review.web.app import create_app
from protdp.review.web.limits import MAX_REQUEST_BYTES
from protdp.templates.inputs import custom_template
from protdp.train.checkpointing import read_rank_file
from review_fixtures import queue_with


def _asgi(app, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> list[dict]:
    """One request straight into the ASGI app; the body is never sent (a client that lies)."""
    sent = []

    async def receive():
        await asyncio.sleep(30)                      # a body that never arrives
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8765)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=10))
    return sent


@pytest.mark.parametrize("length,status", [(b"99999999999", 413),
                                           (str(MAX_REQUEST_BYTES + 1).encode(), 413),
                                           (b"12abc", 400)])
def test_huge_declared_body_is_refused_at_once(tmp_path, length, status):
    store, _, _ = queue_with(str(tmp_path / "q.sqlite"))
    sent = _asgi(create_app(store), "POST", "/login", [(b"content-length", length),
                                                       (b"content-type", b"application/json")])
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == status
    headers = dict(start["headers"])
    assert headers[b"connection"] == b"close" and b"x-frame-options" in headers


def test_removed_reviewer_can_be_added_again(tmp_path):
    store, admin, tokens = queue_with(str(tmp_path / "q.sqlite"), "alice")
    admin.remove_reviewer("alice")
    with pytest.raises(AuthError):
        store.reviewer(tokens["alice"])
    fresh = admin.add_reviewer("alice")
    assert fresh != tokens["alice"]
    assert store.reviewer(fresh).name == "alice"
    with pytest.raises(AuthError):                      # the old token stays revoked
        store.reviewer(tokens["alice"])
    with pytest.raises(Exception, match="already exists"):
        admin.add_reviewer("alice")
    report = store.verify()
    assert report["ok"], report["problems"]


class Payload:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.mark.parametrize("writer", ["torch", "pickle"])
def test_code_carrying_rank_file_is_named_as_such(tmp_path, writer):
    path = tmp_path / "rank_0.pt"
    obj = {"format": "x", "payload": Payload()}
    if writer == "torch":
        torch.save(obj, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(obj, fh)
    with pytest.raises(InputError) as exc:
        read_rank_file(path)
    msg = str(exc.value)
    assert "not a PyTorch checkpoint" not in msg and "does not unpickle" in msg, msg


def test_fifo_template_is_named_as_a_fifo(tmp_path):
    fifo = tmp_path / "t.cif"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        custom_template("MKVLAAGIVG", str(fifo))


def test_fifo_in_the_input_folder_is_a_rejected_row(tmp_path):
    from protdp.inference.inputs import read_inputs
    (tmp_path / "a.fasta").write_text(">a\nMKVLAAG\n")
    os.mkfifo(tmp_path / "b.fasta")
    targets, _ = read_inputs(tmp_path)
    rows = {t.target_id: t for t in targets}
    assert rows["a"].error is None and rows["a"].raw_sequence == "MKVLAAG"
    assert "not a regular file" in rows["b.fasta"].error and "b.fasta" in rows["b.fasta"].error


@pytest.mark.parametrize("kw,match", [({"seed": -1}, "--random-seed -1"),
                                      ({"seed": 2 ** 64}, "--random-seed 18446744073709551616"),
                                      ({"seed": 2 ** 32 - 1, "num_seeds": 2}, "the last seed"),
                                      ({"num_seeds": 10 ** 9}, "--seeds 1000000000"),
                                      ({"num_recycles": 10 ** 9}, "--num-recycles")])
def test_prediction_options_are_bounded_before_any_work(kw, match):
    from protdp.inference.predictor import PredictConfig
    with pytest.raises(InputError, match=match):
        PredictConfig(**kw)
    PredictConfig(seed=2 ** 32 - 1)          # the largest unsigned 32-bit seed is fine


def test_seed_and_queue_checked_before_the_first_prediction(tmp_path, capsys):
    from model_fixtures import tiny_config
    from protdp.cli import main as protdp_main
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.model import build_model
    cfg = tiny_config()
    save_model_checkpoint(build_model(cfg, verbose=False), cfg, tmp_path / "m.pt")
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">a\nMKVLAAGIVG\n")
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("hello\n")
    for extra, match in ((["--random-seed", "-1"], "--random-seed -1 is outside"),
                         (["--queue-url", str(not_a_db)], "is not an SQLite database")):
        out = tmp_path / f"o{len(extra[1])}"
        rc = protdp_main(["predict", "--checkpoint", str(tmp_path / "m.pt"), "--fasta",
                          str(fasta), "--out", str(out), "--no-progress", "--no-plots",
                          "--allow-unreleased", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and match in err and "Traceback" not in err, err
        assert not (out / "targets").exists() or not any((out / "targets").iterdir())
    assert not_a_db.read_text() == "hello\n"
