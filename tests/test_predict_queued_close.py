"""`predict_queued` hands its work queue to the caller, who closes it; when predicting raises
instead (a bug, Ctrl-C), the queue it opened is closed before the error propagates, and a run
that finishes returns it open."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import protdp.inference.work as work
from protdp.workqueue import WorkQueue


class RecordingQueue(WorkQueue):
    opened: list = []

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.closed = False
        RecordingQueue.opened.append(self)

    def close(self) -> None:
        self.closed = True
        super().close()


def _pred(tmp_path, predict_target):
    return SimpleNamespace(out_dir=tmp_path, settings={"model": "tiny"},
                           predict_target=predict_target)


def _run(pred, tmp_path):
    targets = [SimpleNamespace(index=0, target_id="a")]
    info = {"sha256": "0" * 64, "msa_dir": None}
    return work.predict_queued(pred, targets, [12], info, rank=0, progress=False,
                               queue_url=work.default_queue_url(tmp_path))


@pytest.mark.parametrize("error", [RuntimeError("model bug"), KeyboardInterrupt()])
def test_queue_is_closed_when_predicting_raises(tmp_path, monkeypatch, error):
    monkeypatch.setattr(work, "WorkQueue", RecordingQueue)
    RecordingQueue.opened.clear()

    def predict_target(target, info):
        raise error

    with pytest.raises(type(error)):
        _run(_pred(tmp_path, predict_target), tmp_path)
    [queue] = RecordingQueue.opened
    assert queue.closed


def test_queue_is_returned_open_when_the_run_finishes(tmp_path, monkeypatch):
    monkeypatch.setattr(work, "WorkQueue", RecordingQueue)
    RecordingQueue.opened.clear()
    row = {"index": 0, "target_id": "a", "status": "accepted"}
    queue, mine = _run(_pred(tmp_path, lambda target, info: dict(row)), tmp_path)
    try:
        assert queue is RecordingQueue.opened[0] and not queue.closed
        assert mine == [row] and queue.results() == [row]
    finally:
        queue.close()
