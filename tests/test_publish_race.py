"""Two processes publishing the same prediction (issue 45's shared --out): the loser of the
rename race gets the FileExistsError every caller handles, not the ENOTEMPTY OSError a
directory renamed onto a non-empty one gives, and the winner's files stay as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from protdp.inference import layout


def test_lost_rename_race_is_file_exists(tmp_path, monkeypatch):
    final, build = tmp_path / "pid", tmp_path / ".build"
    build.mkdir()
    (build / "scores.json").write_text("mine")
    final.mkdir()
    (final / "scores.json").write_text("theirs")         # published between check and rename
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: False if p == final else real_exists(p))
    with pytest.raises(FileExistsError, match="never overwritten"):
        layout.publish_build(build, final)
    assert (final / "scores.json").read_text() == "theirs"
    assert (build / "scores.json").read_text() == "mine"
