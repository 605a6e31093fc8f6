"""Hostile input at the queue's doors: file paths and planted links, NUL and control
characters, bidi overrides, huge integers, a stalled SQLite writer."""

from __future__ import annotations

import sqlite3
import time

import pytest
from review_fixtures import gated_item, queue_url, queue_with, sqlite_url  # noqa: F401
from sqlalchemy import text

from protdp.errors import InputError
from protdp.review.files import read_item_file, resolve_item_file, split_paths
from protdp.review.hygiene import (check_comment, display_text, escape_controls, int_in_range,
                                   truncate)
from protdp.review.store import QueueBusy, ReviewStore
from protdp.workflows import QueueSink

SECRET = "root:$6$not-a-real-hash:19000:0:99999:7:::\n"


@pytest.fixture
def secret_file(tmp_path):
    """A file the server can read but must never serve (stands in for /etc/shadow)."""
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_text(SECRET)
    for ext in (".pdb", ".json"):
        path.with_suffix(ext).write_text(SECRET)
    return path


def test_split_paths_keeps_one_folder_and_bare_names(tmp_path):
    folder, names = split_paths({"pdb": tmp_path / "a.pdb", "cif": str(tmp_path / "a.cif")})
    assert folder == str(tmp_path) and names == {"pdb": "a.pdb", "cif": "a.cif"}
    with pytest.raises(InputError, match="one folder"):
        split_paths({"pdb": tmp_path / "a.pdb", "cif": tmp_path / "sub" / "a.cif"})
    for bad in ({"pdb": ""}, {"pdb": "a\x00.pdb"}, {"../x": "a.pdb"}, {"pdb": "/"}):
        with pytest.raises(InputError):
            split_paths(bad)
    assert split_paths({}) == (None, {})


def test_only_files_inside_the_items_own_folder_are_served(tmp_path, secret_file):
    store = ReviewStore(str(tmp_path / "q.sqlite"))
    item_id = store.enqueue(**gated_item(1, out_dir=tmp_path / "preds"))
    item = store.get(item_id)
    data, media, name = read_item_file(item, "pdb")
    assert data == (tmp_path / "preds" / "pred1.pdb").read_bytes()
    assert (media, name) == ("chemical/x-pdb", "pred1.pdb")
    assert read_item_file(item, "cif")[1] == "chemical/x-mmcif"
    # hostile rows written straight into the table (absolute, relative, '..', folder swaps)
    hostile = [({"pdb": str(secret_file.with_suffix(".pdb"))}, item["folder"]),
               ({"pdb": "../outside/shadow.pdb"}, item["folder"]),
               ({"pdb": "shadow.pdb"}, "../outside"),
               ({"pdb": "shadow"}, str(secret_file.parent)),
               ({"scores": "shadow.json"}, str(secret_file.parent) + "/../outside")]
    for paths, folder in hostile:
        assert read_item_file({**item, "paths": paths, "folder": folder}, "pdb") is None
        assert read_item_file({**item, "paths": paths, "folder": folder}, "scores") is None
    # a link planted in a real prediction folder, to a file and to a folder outside it
    planted = tmp_path / "preds" / "pred1.pdb"
    planted.unlink()
    planted.symlink_to(secret_file.with_suffix(".pdb"))
    assert read_item_file(item, "pdb") is None
    (tmp_path / "preds" / "scores.json").symlink_to(secret_file.with_suffix(".json"))
    assert read_item_file(item, "scores") is None
    # a link that stays inside the folder is fine; roots confine folders when configured
    planted.unlink()
    planted.symlink_to(tmp_path / "preds" / "pred1.cif")
    assert read_item_file(item, "pdb")[0].startswith(b"REMARK prediction 1 (cif)")
    assert resolve_item_file(item, "pdb", [tmp_path / "elsewhere"]) is None
    assert resolve_item_file(item, "pdb", [tmp_path.resolve()]) is not None


def test_a_nul_byte_in_a_fasta_header_is_queued_escaped(queue_url):
    """`protdp predict` hands the header to the sink; PostgreSQL refuses NUL in text, which
    stopped the batch on every rerun. Now it is stored as a visible escape."""
    sink = QueueSink(queue_url)
    item = gated_item(1)
    hostile = "evil\x00name\x1b[2J\u202eexe.pdb"
    item_id = sink.enqueue("run/a\x00b", hostile, {**item["scores"], "sequence": "MK\x00T"},
                           {}, item["reasons"], details={"x": "d\x00"}, actor="predictor")
    assert sink.enqueue("run/a\x00b", hostile, item["scores"], {}, item["reasons"],
                        details={}, actor="predictor") == item_id
    assert not hasattr(sink._enqueuer, "reviewer") and not hasattr(sink._enqueuer, "list")
    sink.close()
    stored = ReviewStore(queue_url).get(item_id)
    assert stored["target"] == "evil\\x00name\\x1b[2J\u202eexe.pdb"
    assert stored["prediction_id"] == "run/a\\x00b" and stored["scores"]["sequence"] == "MK\\x00T"
    assert stored["details"] == {"x": "d\\x00"}


def test_comments_refuse_control_characters():
    assert check_comment("  fine\nsecond line\t ") == "fine\nsecond line"
    with pytest.raises(InputError, match="U\\+0000"):
        check_comment("bad\x00")
    with pytest.raises(InputError, match="U\\+001B"):
        check_comment("\x1b[31mred")
    with pytest.raises(InputError, match="longer"):
        check_comment("x" * 10_001)


def test_display_neutralises_bidi_and_controls():
    assert display_text("alice\u202egnp.exe") == "alice<U+202E>gnp.exe"
    assert display_text("a\u2066b\u200fc") == "a<U+2066>b<U+200F>c"
    assert display_text("x\x1b[2Jy\x07") == "x\\x1b[2Jy\\x07"
    assert display_text("l1\nl2", keep_newlines=True) == "l1\nl2"
    assert escape_controls("ok ü 中") == "ok ü 中"
    assert truncate("x" * 1_000_000) == "x" * 79 + "…" and truncate("short") == "short"


def test_integer_parameters_are_range_checked():
    assert int_in_range("7", "page", 1, 10) == 7
    for bad in ("0", "11", str(2**63), "-1", "1e3", "", "x" * 5000):
        with pytest.raises(InputError, match="page"):
            int_in_range(bad, "page", 1, 10)


def test_a_stalled_sqlite_writer_gives_a_clear_busy_error_in_bounded_time(sqlite_url):
    store, admin, tokens = queue_with(sqlite_url, "alice")
    store.enqueue(**gated_item(1))
    impatient = ReviewStore(sqlite_url, busy_timeout_s=0.5)
    alice = impatient.reviewer(tokens["alice"])
    stall = sqlite3.connect(sqlite_url, isolation_level=None)
    stall.execute("BEGIN IMMEDIATE")                     # a writer that stalls
    try:
        t0 = time.monotonic()
        with pytest.raises(QueueBusy, match="busy: another process held its write lock for "
                                            "more than 0.5 s; try again"):
            alice.claim()
        assert time.monotonic() - t0 < 5
        assert impatient.get(1)["state"] == "pending"    # readers are not blocked (WAL)
    finally:
        stall.rollback()
        stall.close()
    assert alice.claim()["id"] == 1


def test_a_stalled_postgresql_writer_gives_a_clear_busy_error():
    from review_fixtures import pg_schema_url

    with pg_schema_url() as url:
        store, admin, tokens = queue_with(url, "alice")
        store.enqueue(**gated_item(1))
        impatient = ReviewStore(url, busy_timeout_s=0.5)
        alice = impatient.reviewer(tokens["alice"])
        with store.engine.connect() as conn:
            trans = conn.begin()
            conn.execute(text("SELECT * FROM review_items WHERE id = 1 FOR UPDATE"))
            with pytest.raises(QueueBusy, match="busy"):
                alice.decide(1, "approve")
            trans.rollback()
        assert alice.decide(1, "approve")["state"] == "approved"
        impatient.close()
        store.close()
