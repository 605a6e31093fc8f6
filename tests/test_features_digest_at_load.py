"""A precomputed complex (`protdp complex features` folder) is hashed at start-up (the run's
input digest) and again when `predict_target` loads it, from the very bytes it loads (read once:
`complex_features_input.read_features_bytes`): a features.npz replaced between start-up and its
prediction is that target's one-line error naming the file (a rejected row), never predicted
under the digest the run recorded for the earlier file; an unchanged file records the start-up
digest, which is the sha256 of the bytes parsed. A file over MAX_FEATURES_FILE_BYTES is one
line, before it is read."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from model_fixtures import tiny_predictor
from protdp.errors import InputError
from protdp.fileio import sha256_file
from protdp.inference import complex_features_input as cfi
from protdp.inference.predictor import input_files


def _write(folder, n_rows: int):
    rng = np.random.default_rng(n_rows)
    asym = np.repeat(np.arange(1, 3), (6, 5)).astype(np.int32)                    # [L]
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / cfi.FEATURES_FILE, aatype=rng.integers(0, 20, 11).astype(np.int32),
             asym_id=asym, msa=rng.integers(0, 22, (n_rows, 11)).astype(np.int32))
    return folder / cfi.FEATURES_FILE


def test_input_files_reuse_the_start_up_digest_or_refuse(tmp_path):
    path = _write(tmp_path / "c0", 4)
    [t], _ = cfi.read_features_targets(tmp_path)
    assert t.error is None
    assert input_files(t, [path]) == [{"path": str(path), "sha256": t.extra["features_sha256"]}]
    _write(tmp_path / "c0", 5)                        # replaced after start-up
    with pytest.raises(InputError) as err:
        input_files(t, [path])
    text = str(err.value)
    assert text.startswith(str(path)) and "\n" not in text and "changed since" in text
    assert t.extra["features_sha256"][:12] in text and sha256_file(path)[:12] in text


def test_a_features_file_replaced_after_start_up_is_a_rejected_row(tmp_path):
    pred = tiny_predictor(tmp_path)
    try:
        path = _write(tmp_path / "feats" / "c0", 4)
        [t], digest = cfi.read_features_targets(tmp_path / "feats")
        _write(tmp_path / "feats" / "c0", 5)
        row = pred.predict_target(t, {"path": str(tmp_path / "feats"), "sha256": digest,
                                      "msa_dir": None})
    finally:
        pred.close()
    assert row["status"] == "rejected" and row["reasons"] == ["invalid_input"], row
    assert row["detail"].startswith(str(path)) and "changed since" in row["detail"]
    assert not (tmp_path / "out" / "targets" / t.file_name).exists()


def test_the_digest_recorded_is_that_of_the_bytes_loaded(tmp_path, monkeypatch):
    """features_inputs reads the file once and hashes and parses those same bytes: every read
    of the path goes through `read_raw` (counted), np.load never opens the path itself, and the
    digest handed to input_files is sha256 of the bytes the arrays came from."""
    path = _write(tmp_path / "c0", 4)
    [t], _ = cfi.read_features_targets(tmp_path)
    with np.load(path) as ref:                      # what the file holds, read independently
        msa = ref["msa"]
    seen = []
    real = cfi.read_raw

    def counted(p, bound):
        seen.append(real(p, bound))
        return seen[-1]

    monkeypatch.setattr(cfi, "read_raw", counted)
    monkeypatch.setattr(np, "load", _only_from_memory(np.load))
    built = cfi.features_inputs(t, max_length=100)
    assert len(seen) == 1
    assert built["sha256s"] == [hashlib.sha256(seen[0]).hexdigest()] == [
        t.extra["features_sha256"]]
    assert np.array_equal(built["features"]["msa"], msa)
    assert input_files(t, built["files"], built["sha256s"]) == [
        {"path": str(path), "sha256": hashlib.sha256(seen[0]).hexdigest()}]


def _only_from_memory(load):
    def guarded(source, *args, **kwargs):
        assert hasattr(source, "read"), f"np.load opened {source!r} itself"
        return load(source, *args, **kwargs)
    return guarded


def test_a_file_changed_before_its_load_is_refused_unparsed(tmp_path, monkeypatch):
    """features_inputs compares the digest of the bytes it read with the start-up digest before
    it parses them: a replaced file is one line, and nothing of it is loaded."""
    path = _write(tmp_path / "c0", 4)
    [t], _ = cfi.read_features_targets(tmp_path)
    _write(tmp_path / "c0", 5)
    parsed = []
    monkeypatch.setattr(cfi, "_read", lambda *a, **k: parsed.append(a))
    with pytest.raises(InputError) as err:
        cfi.features_inputs(t, max_length=100)
    assert str(err.value).startswith(str(path)) and "changed since" in str(err.value)
    assert "\n" not in str(err.value) and parsed == []


def test_a_features_file_over_the_bound_is_one_line(tmp_path, monkeypatch):
    path = _write(tmp_path / "c0", 4)
    size = path.stat().st_size
    monkeypatch.setattr(cfi, "MAX_FEATURES_FILE_BYTES", size - 1)
    monkeypatch.setattr(cfi, "read_raw", lambda *a: pytest.fail("read past the bound"))
    [t], _ = cfi.read_features_targets(tmp_path)
    assert t.error.startswith(str(path)) and "\n" not in t.error, t.error
    assert f"{size:,} bytes" in t.error and "MAX_FEATURES_FILE_BYTES" in t.error
    monkeypatch.undo()                                # the same file within the bound
    [t], _ = cfi.read_features_targets(tmp_path)
    assert t.error is None and t.extra["features_sha256"] == sha256_file(path)
