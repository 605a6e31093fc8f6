"""protdp/inference/records.py (split from predictor.py): when a prediction folder counts as
done (provenance.json with the same fingerprint, outputs intact), as published-but-pending
(pending.json whole, provenance.json missing or torn), and which files its review item binds.
Reference: the records are written here by hand, with hashlib, independently of the writers."""

from __future__ import annotations

import hashlib
import json

from protdp.inference.records import (PENDING_FILE, completed_record, intact_pending,
                                      item_paths)


def _folder(tmp_path, fp="f" * 64):
    pdir = tmp_path / "pred"
    pdir.mkdir()
    (pdir / "ranked_0.pdb").write_bytes(b"ATOM  model\n")
    (pdir / "scores.json").write_text('{"x": 1}')
    outputs = {"pdb": "ranked_0.pdb", "scores": "scores.json"}
    record = {"fingerprint": fp, "outputs": outputs,
              "outputs_sha256": {n: hashlib.sha256((pdir / n).read_bytes()).hexdigest()
                                 for n in outputs.values()}}
    (pdir / PENDING_FILE).write_text(json.dumps(record))
    return pdir, record, fp


def test_pending_until_provenance_is_whole_then_done(tmp_path):
    pdir, record, fp = _folder(tmp_path)
    assert intact_pending(pdir, fp) and completed_record(pdir, fp) is None
    assert not intact_pending(pdir, "0" * 64)                  # other inputs: not ours to finish
    (pdir / "provenance.json").write_text(json.dumps(record)[:20])        # torn completion mark
    assert intact_pending(pdir, fp) and completed_record(pdir, fp) is None
    (pdir / "provenance.json").write_text(json.dumps(record))
    assert not intact_pending(pdir, fp) and completed_record(pdir, fp) == record
    assert completed_record(pdir, "0" * 64) is None


def test_a_changed_output_is_neither_done_nor_pending(tmp_path):
    pdir, record, fp = _folder(tmp_path)
    (pdir / "provenance.json").write_text(json.dumps(record))
    (pdir / "ranked_0.pdb").write_bytes(b"ATOM  swapped\n")
    assert completed_record(pdir, fp) is None
    (pdir / "provenance.json").unlink()
    assert not intact_pending(pdir, fp)


def test_review_item_binds_outputs_and_pending_not_provenance(tmp_path):
    pdir = tmp_path / "p"
    paths = {"pdb": str(pdir / "ranked_0.pdb"), "provenance": str(pdir / "provenance.json")}
    assert item_paths(paths, pdir) == {"pdb": str(pdir / "ranked_0.pdb"),
                                       "pending": str(pdir / PENDING_FILE)}
