"""`protdp review ...` through the real console entry point (protdp.cli.main)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from review_fixtures import gated_item, pg_schema_url, sqlite_url  # noqa: F401
from sqlalchemy import text

from protdp.cli import main
from protdp.paths import REPO_ROOT
from protdp.review.store import ReviewStore


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["review", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _init(capsys, url: str) -> str:
    code, out, err = run(capsys, "init-db", "--queue-url", url)
    assert code == 0 and "shown once" in err
    return out.strip()


def _add_reviewer(capsys, monkeypatch, url: str, name: str, admin_token: str) -> str:
    monkeypatch.setenv("PROTDP_REVIEW_ADMIN_TOKEN", admin_token)
    code, out, err = run(capsys, "add-reviewer", name, "--queue-url", url)
    assert code == 0 and "shown once" in err
    token = out.strip()
    assert token.startswith("pdr_") and len(token) > 40
    return token


def test_reviewer_management_needs_the_admin_token(sqlite_url, capsys, monkeypatch):
    url = sqlite_url
    monkeypatch.delenv("PROTDP_REVIEW_ADMIN_TOKEN", raising=False)
    code, _, err = run(capsys, "add-reviewer", "mallory", "--queue-url", url)
    assert code == 2 and "no review queue at" in err and "review init-db" in err  # not created
    assert not Path(url).exists()
    admin = _init(capsys, url)
    code, _, err = run(capsys, "add-reviewer", "mallory", "--queue-url", url)
    assert code == 2 and "PROTDP_REVIEW_ADMIN_TOKEN" in err
    monkeypatch.setenv("PROTDP_REVIEW_ADMIN_TOKEN", "pdr_wrong")    # names the admin token
    code, _, err = run(capsys, "add-reviewer", "mallory", "--queue-url", url)
    assert code == 2 and "admin token not recognised" in err, err
    monkeypatch.delenv("PROTDP_REVIEW_ADMIN_TOKEN")
    code, _, err = run(capsys, "init-db", "--queue-url", url)
    assert code == 0 and "already there" in err       # no second admin from init-db
    alice = _add_reviewer(capsys, monkeypatch, url, "alice", admin)
    monkeypatch.setenv("PROTDP_REVIEW_ADMIN_TOKEN", alice)  # a reviewer token is not enough
    for argv in (["add-reviewer", "mallory"], ["remove-reviewer", "alice"],
                 ["release", "--reviewer", "alice"], ["set-limits", "--max-lease", "99999"]):
        code, _, err = run(capsys, *argv, "--queue-url", url)
        assert code == 2 and "not an admin" in err, argv
    monkeypatch.setenv("PROTDP_REVIEW_ADMIN_TOKEN", admin)
    code, out, _ = run(capsys, "set-limits", "--max-lease", "1200", "--queue-url", url)
    assert code == 0 and "max_lease_seconds 1200" in out
    code, out, _ = run(capsys, "reviewers", "--queue-url", url)
    assert "admin active" in out and "alice" in out and "mallory" not in out


def test_review_workflow(sqlite_url, capsys, monkeypatch, tmp_path):
    url = sqlite_url
    admin = _init(capsys, url)
    token = _add_reviewer(capsys, monkeypatch, url, "alice", admin)
    store = ReviewStore(url)
    for i in range(3):
        store.enqueue(**gated_item(i, out_dir=tmp_path / "preds"))
    monkeypatch.setenv("PROTDP_QUEUE_URL", url)  # the default for --queue-url

    code, out, _ = run(capsys, "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["1", "2", "3"]
    assert "low_mean_plddt" in out and "target2" in out

    monkeypatch.delenv("PROTDP_REVIEW_TOKEN", raising=False)
    code, _, err = run(capsys, "claim")
    assert code == 2 and "PROTDP_REVIEW_TOKEN" in err
    monkeypatch.setenv("PROTDP_REVIEW_TOKEN", token + "x")
    code, _, err = run(capsys, "approve", "1")
    assert code == 2 and "not recognised" in err
    assert store.get(1)["state"] == "pending"

    monkeypatch.setenv("PROTDP_REVIEW_TOKEN", token)
    code, out, _ = run(capsys, "claim", "--lease", "120")
    assert code == 0 and "claimed item 1" in out and "audit trail" in out
    code, out, _ = run(capsys, "approve", "1", "--comment", "fold matches homologue")
    assert code == 0 and "item 1 approved by alice" in out
    with pytest.raises(SystemExit) as exc:  # argparse: --comment is required to reject
        run(capsys, "reject", "2")
    assert exc.value.code == 2
    code, out, _ = run(capsys, "reject", "2", "-m", "=cmd|' /C calc'!A0")
    assert code == 0 and "rejected" in out
    code, out, _ = run(capsys, "escalate", "3", "--comment", "ask structural biology")
    assert code == 0
    code, _, err = run(capsys, "approve", "3")
    assert code == 2 and "already escalated by alice" in err
    code, _, err = run(capsys, "approve", str(2**63))
    assert code == 2 and "no review item" in err

    code, out, _ = run(capsys, "show", "1")
    assert code == 0
    for text_ in ("mean pLDDT", "Very low (pLDDT < 50)", "reason: shallow_msa", "pdb: pred0.pdb",
                  "folder:", "alice  approved: fold matches homologue"):
        assert text_ in out, text_
    code, out, _ = run(capsys, "show", "1", "--json")
    assert [e["action"] for e in json.loads(out)["events"]] == ["enqueued", "claimed", "approved"]
    code, _, err = run(capsys, "show", "99")
    assert code == 2 and "no review item with id 99" in err
    code, _, err = run(capsys, "show", str(2**63))
    assert code == 2 and "no review item" in err

    out_file = tmp_path / "decisions.jsonl"
    code, _, _ = run(capsys, "export", "--format", "jsonl", "--out", str(out_file))
    recs = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(r["item_id"], r["decision"]) for r in recs] == [(1, "approved"), (2, "rejected"),
                                                             (3, "escalated")]
    # a folder given as --out, or one that cannot be written: one line, nothing written beside it
    for bad in (tmp_path, Path("/proc/decisions.csv")):
        before = sorted(bad.parent.iterdir()) if bad.parent != Path("/proc") else None
        code, _, err = run(capsys, "export", "--format", "csv", "--out", str(bad))
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(bad.parent) in err, err
        assert before is None or sorted(bad.parent.iterdir()) == before
    code, _, err = run(capsys, "export", "--format", "store", "--out", str(tmp_path))
    assert code == 2 and "is a directory" in err
    code, out, _ = run(capsys, "export", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[1]["comment"].startswith("'=")

    code, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert stats["by_state"]["approved"] == 1 and stats["by_reviewer"]["alice"]["rejected"] == 1
    code, out, _ = run(capsys, "list", "--state", "all")
    assert "approved (alice)" in out
    code, out, _ = run(capsys, "verify")
    assert code == 0 and out.startswith("ok:")

    monkeypatch.setenv("PROTDP_REVIEW_ADMIN_TOKEN", admin)
    code, out, _ = run(capsys, "remove-reviewer", "alice")
    assert code == 0 and "0 claim(s) released" in out
    code, _, err = run(capsys, "claim")
    assert code == 2 and "not recognised" in err


def test_verify_command_reports_tampering(sqlite_url, capsys, monkeypatch):
    admin = _init(capsys, sqlite_url)
    token = _add_reviewer(capsys, monkeypatch, sqlite_url, "alice", admin)
    store = ReviewStore(sqlite_url)
    store.enqueue(**gated_item(1))
    store.reviewer(token).decide(1, "reject", "bad")
    code, out, _ = run(capsys, "verify", "--queue-url", sqlite_url)
    head = out.split("head ")[1].split()[0]
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE review_items SET state = 'approved', comment = NULL"))
    code, out, _ = run(capsys, "verify", "--queue-url", sqlite_url, "--expect-head", head)
    assert code == 1 and "PROBLEM item 1: state is 'approved'" in out and "FAILED" in out
    code, out, _ = run(capsys, "verify", "--queue-url", sqlite_url, "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_admin_release(sqlite_url, capsys, monkeypatch):
    admin = _init(capsys, sqlite_url)
    token = _add_reviewer(capsys, monkeypatch, sqlite_url, "alice", admin)
    store = ReviewStore(sqlite_url)
    store.enqueue(**gated_item(1))
    store.enqueue(**gated_item(2))
    store.reviewer(token).claim()
    store.reviewer(token).claim()
    code, out, _ = run(capsys, "release", "--item", "1", "--queue-url", sqlite_url)
    assert code == 0 and "released 1 claim(s): 1" in out
    code, out, _ = run(capsys, "release", "--reviewer", "alice", "--queue-url", sqlite_url)
    assert code == 0 and "released 1 claim(s): 2" in out
    assert store.list(state="claimed") == []


def test_terminal_escapes_are_neutralised_in_every_field(sqlite_url, capsys, tmp_path):
    store = ReviewStore(sqlite_url)
    evil = "evil\x1b]0;pwned\x07\x1b[2J\u202e"
    item = gated_item(1, target=evil)
    store.enqueue(**{**item, "details": {"shallow_msa": evil},
                     "scores": {**item["scores"], "afdb_bands": {evil: 0.5}}})
    with store.engine.begin() as conn:  # fields only a hostile database could hold
        conn.exec_driver_sql("UPDATE review_items SET paths = ?, folder = ?",
                             (json.dumps({"pdb\x1b[31m": "x\x1b[2J.pdb"}), "/tmp/\x1b[2J"))
    for argv in (["list"], ["show", "1"], ["stats"]):
        code, out, _ = run(capsys, *argv, "--queue-url", sqlite_url)
        assert code == 0 and "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    code, out, _ = run(capsys, "show", "1", "--queue-url", sqlite_url)
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J<U+202E>" in out and "pdb\\x1b[31m" in out


def test_cli_against_postgresql(capsys, monkeypatch):
    with pg_schema_url() as url:
        admin = _init(capsys, url)
        token = _add_reviewer(capsys, monkeypatch, url, "bob", admin)
        ReviewStore(url).enqueue(**gated_item(7))
        monkeypatch.setenv("PROTDP_REVIEW_TOKEN", token)
        code, out, _ = run(capsys, "claim", "--queue-url", url)
        assert code == 0 and "claimed item 1" in out
        code, out, _ = run(capsys, "stats", "--queue-url", url)
        assert code == 0 and "claimed 1" in out
        code, out, _ = run(capsys, "verify", "--queue-url", url)
        assert code == 0


def test_console_script_entry_point(sqlite_url):
    """The installed-style invocation (`python -m protdp.cli review ...`) in a fresh process."""
    env = {**os.environ, "PROTDP_QUEUE_URL": sqlite_url}
    res = subprocess.run([sys.executable, "-m", "protdp.cli", "review", "init-db", "--admin-name",
                          "carol"], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert ReviewStore(sqlite_url).authenticate(res.stdout.strip()) == "carol"
    res = subprocess.run([sys.executable, "-m", "protdp.cli", "review", "list", "--queue-url",
                          "mysql://x@y/z"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert res.returncode == 2 and "unsupported queue database" in res.stderr
    assert "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "protdp.cli", "review", "--help"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert res.returncode == 0 and "init-db" in res.stdout and "verify" in res.stdout


@pytest.mark.parametrize("port", ["99999", "0", "http"])
def test_serve_port_out_of_range_is_one_usage_line(tmp_path, capsys, port):
    """`review serve --port 99999` was an OverflowError traceback from bind()."""
    with pytest.raises(SystemExit) as exc:
        run(capsys, "serve", "--queue-url", str(tmp_path / "q.sqlite"), "--port", port)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[-1] == (
        f"protdp review serve: error: argument --port: '{port}' is not a TCP port (1 to 65535)")
    assert not (tmp_path / "q.sqlite").exists()
