"""`protdp review ...` through the real console entry point (protdp.cli.main)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from review_fixtures import gated_item, pg_schema_url, sqlite_url  # noqa: F401

from protdp.cli import main
from protdp.paths import REPO_ROOT
from protdp.review.store import ReviewStore


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["review", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _add_reviewer(capsys, url: str, name: str) -> str:
    code, out, err = run(capsys, "add-reviewer", name, "--queue-url", url)
    assert code == 0 and "shown once" in err
    token = out.strip()
    assert token.startswith("pdr_") and len(token) > 40
    return token


def test_review_workflow(sqlite_url, capsys, monkeypatch, tmp_path):
    url = sqlite_url
    token = _add_reviewer(capsys, url, "alice")
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

    code, out, _ = run(capsys, "show", "1")
    assert code == 0
    for text in ("mean pLDDT", "Very low (pLDDT < 50)", "reason: shallow_msa", "pdb:",
                 "alice  approved: fold matches homologue"):
        assert text in out, text
    code, out, _ = run(capsys, "show", "1", "--json")
    assert [e["action"] for e in json.loads(out)["events"]] == ["enqueued", "claimed", "approved"]
    code, _, err = run(capsys, "show", "99")
    assert code == 2 and "no review item with id 99" in err

    out_file = tmp_path / "decisions.jsonl"
    code, _, _ = run(capsys, "export", "--format", "jsonl", "--out", str(out_file))
    recs = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(r["item_id"], r["decision"]) for r in recs] == [(1, "approved"), (2, "rejected"),
                                                             (3, "escalated")]
    code, out, _ = run(capsys, "export", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[1]["comment"].startswith("'=")

    code, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert stats["by_state"]["approved"] == 1 and stats["by_reviewer"]["alice"]["rejected"] == 1
    code, out, _ = run(capsys, "list", "--state", "all")
    assert "approved (alice)" in out

    code, out, _ = run(capsys, "remove-reviewer", "alice")
    assert code == 0
    code, _, err = run(capsys, "claim")
    assert code == 2 and "not recognised" in err


def test_terminal_escapes_in_target_names_are_neutralised(sqlite_url, capsys):
    store = ReviewStore(sqlite_url)
    store.enqueue(**gated_item(1, target="evil\x1b]0;pwned\x07\x1b[2J"))
    code, out, _ = run(capsys, "list", "--queue-url", sqlite_url)
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in out


def test_cli_against_postgresql(capsys, monkeypatch):
    with pg_schema_url() as url:
        token = _add_reviewer(capsys, url, "bob")
        ReviewStore(url).enqueue(**gated_item(7))
        monkeypatch.setenv("PROTDP_REVIEW_TOKEN", token)
        code, out, _ = run(capsys, "claim", "--queue-url", url)
        assert code == 0 and "claimed item 1" in out
        code, out, _ = run(capsys, "stats", "--queue-url", url)
        assert code == 0 and "claimed 1" in out


def test_console_script_entry_point(sqlite_url):
    """The installed-style invocation (`python -m protdp.cli review ...`) in a fresh process."""
    env = {**os.environ, "PROTDP_QUEUE_URL": sqlite_url}
    res = subprocess.run([sys.executable, "-m", "protdp.cli", "review", "add-reviewer", "carol"],
                         capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert ReviewStore(sqlite_url).authenticate(res.stdout.strip()) == "carol"
    res = subprocess.run([sys.executable, "-m", "protdp.cli", "review", "list", "--queue-url",
                          "mysql://x@y/z"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert res.returncode == 2 and "unsupported queue database" in res.stderr
    assert "Traceback" not in res.stderr
