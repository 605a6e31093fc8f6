"""`protdp review verify` re-hashes every file an item is bound to (SQLite and PostgreSQL): a
structure overwritten, a PAE deleted or a file replaced by a link after approval is named, one
line each, with a non-zero exit; an untouched queue verifies OK; rejected items are not checked;
and the recorded digests cannot be edited to match new bytes without the chain naming the item.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from review_fixtures import gated_item, pg_schema_url, queue_url  # noqa: F401
from sqlalchemy import text

from protdp.cli import main
from protdp.review import rehash
from protdp.review.store import ReviewStore


def _item(tmp_path, i: int) -> dict:
    """enqueue() kwargs with pdb/cif, a PAE, a gate `summary` sibling and scores.json."""
    folder = tmp_path / f"pred{i}"
    kw = gated_item(i, out_dir=folder)
    (folder / "scores.json").write_text(json.dumps({"mean_plddt": 55.0, "i": i}))
    for kind in ("pae", "summary"):
        (folder / f"{kind}.json").write_text(json.dumps({kind: [i, i + 1]}))
        kw["paths"][kind] = str(folder / f"{kind}.json")
    return kw


@pytest.fixture
def queue(queue_url, tmp_path, monkeypatch):
    """Item 1 approved, item 2 pending, item 3 rejected (its files then deleted)."""
    store = ReviewStore(queue_url)
    store.set_files_roots([tmp_path])
    admin = store.admin(store.init_admin())
    alice = store.reviewer(admin.add_reviewer("alice"))
    for i in (1, 2, 3):
        store.enqueue(**_item(tmp_path, i))
    alice.decide(1, "approve")
    alice.decide(3, "reject", "clashes")
    for f in (tmp_path / "pred3").iterdir():      # housekeeping of a rejected prediction
        f.unlink()
    monkeypatch.setenv("PROTDP_QUEUE_URL", queue_url)
    yield store
    store.close()


def _cli_verify(capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["review", "verify"])
    return code, capsys.readouterr().out.splitlines()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_untouched_queue_verifies_ok(queue, capsys):
    report = queue.verify()
    assert report["ok"] and report["file_problems"] == [] and report["more_file_problems"] == 0
    assert report["items_files_checked"] == 2          # approved + pending; rejected skipped
    code, lines = _cli_verify(capsys)
    assert code == 0 and lines[-1].startswith("ok:")
    assert "the files of 2 items re-hashed" in lines[-1]


def _overwrite_structure(pdb):
    old = pdb.read_bytes()
    pdb.write_bytes(old + b"ATOM  swapped after approval\n")
    return "pdb", _sha(old), _sha(pdb.read_bytes()), "changed since enqueue"


def _delete_pae(pae):
    old = pae.read_bytes()
    pae.unlink()
    return "pae", _sha(old), None, "missing"


def _symlink_summary(summary):
    """Same bytes behind a link: verify must not follow it."""
    old = summary.read_bytes()
    copy = summary.with_name("elsewhere.json")
    copy.write_bytes(old)
    summary.unlink()
    os.symlink(copy, summary)
    return "summary", _sha(old), None, "now a symlink"


@pytest.mark.parametrize("tamper,name", [(_overwrite_structure, "pred1.pdb"),
                                         (_delete_pae, "pae.json"),
                                         (_symlink_summary, "summary.json")])
def test_a_file_changed_after_approval_is_reported(queue, capsys, tmp_path, tamper, name):
    path = tmp_path / "pred1" / name
    kind, want, got, what = tamper(path)
    shown = {"missing": "missing", "now a symlink": "symlink"}.get(what)
    report = queue.verify()
    assert not report["ok"] and report["bad_items"] == [1]
    assert report["problems"] == []                    # the chain itself is intact
    [problem] = report["file_problems"]
    assert (problem["item_id"], problem["kind"], problem["file"], problem["problem"],
            problem["expected_sha256"], problem["found_sha256"]) == (1, kind, str(path), what,
                                                                     want, got)
    code, lines = _cli_verify(capsys)
    file_lines = [ln for ln in lines if ln.startswith("FILE ")]
    assert code == 1 and lines[-1].startswith("FAILED")
    assert file_lines == [f"FILE item 1: {kind} file {path} {what} (expected sha256 {want}, "
                          f"found {got or shown})"]


def test_recorded_digests_are_covered_by_the_chain(queue, tmp_path):
    """Re-recording the new bytes in the row (a database credential, no key) is still named."""
    pdb = tmp_path / "pred1" / "pred1.pdb"
    pdb.write_bytes(b"ATOM  forged\n")
    with queue.db.tx(readonly=True) as conn:
        raw = conn.execute(text("SELECT file_sha256 FROM review_items WHERE id = 1")).scalar()
    recorded = raw if isinstance(raw, dict) else json.loads(raw)
    recorded["pdb"] = _sha(pdb.read_bytes())
    with queue.engine.begin() as conn:
        conn.execute(text("UPDATE review_items SET file_sha256 = :v WHERE id = 1"),
                     {"v": json.dumps(recorded)})
    report = queue.verify()
    assert report["file_problems"] == [] and not report["ok"] and 1 in report["bad_items"]
    assert any("item 1: scores, target or files were edited after enqueue" in p
               for p in report["problems"])


def test_pages_and_the_problem_cap(queue, tmp_path, monkeypatch):
    monkeypatch.setattr(rehash, "PAGE", 1)
    monkeypatch.setattr(rehash, "MAX_FILE_PROBLEMS", 1)
    for i in (1, 2):
        (tmp_path / f"pred{i}" / "pae.json").unlink()
    report = queue.verify()
    assert report["bad_items"] == [1, 2] and report["items_files_checked"] == 2
    assert len(report["file_problems"]) == 1 and report["more_file_problems"] == 1


def test_file_state_hashes_in_chunks_like_hashlib(tmp_path):
    data = os.urandom(2 * rehash.CHUNK_BYTES + 12345)
    path = tmp_path / "big.pdb"
    path.write_bytes(data)
    assert rehash.file_state(path) == ("file", _sha(data))
    assert rehash.file_state(tmp_path / "none.pdb") == ("missing", None)
    assert rehash.file_state(tmp_path) == ("not a regular file", None)
