"""Batch prediction wired to the review queue: the top floor, where inference meets review.

`protdp.inference` predicts and gates and hands flagged predictions to a `ReviewSink`; it never
imports the review store. This module is the one place that connects the two, for
`protdp predict`, the red-team suite and the demo.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from protdp.inference.batch import predict_batch
from protdp.inference.predictor import RunResult
from protdp.inference.writers import printable


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """--queue-url and --gating of the commands that gate predictions and enqueue the flagged
    ones (`protdp predict`, `protdp gate`)."""
    parser.add_argument("--queue-url", default=os.environ.get("PROTDP_QUEUE_URL"),
                        help="review queue (SQLite path/URL or postgresql://; env "
                             "PROTDP_QUEUE_URL); default OUT/review_queue.sqlite")
    parser.add_argument("--gating", default=None,
                        help="gate policy YAML (default: the shipped configs/gating.yaml)")


def review_queue_url(queue_url: str | None, out_dir: str | Path) -> str:
    """The review queue a run uses: `queue_url`, or OUT/review_queue.sqlite."""
    return queue_url or str(Path(out_dir).resolve() / "review_queue.sqlite")


def display_url(queue_url: str) -> str:
    """The queue URL with any password masked (for printing, provenance and summaries)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from protdp.review.db import normalize_url
    try:
        return make_url(normalize_url(queue_url)).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable queue URL>"


class QueueSink:
    """A `ReviewSink` over the review queue at `queue_url`, opened on the first flagged
    prediction (a batch where nothing needs review creates no queue). It holds the queue's
    enqueue-only door (`protdp.review.enqueue.Enqueuer`): the predictor cannot claim, decide
    or manage reviewers."""

    def __init__(self, queue_url: str):
        self.queue_url = queue_url
        self.display = display_url(queue_url)
        self._enqueuer = None

    def enqueue(self, prediction_id, target, scores, paths, reasons, *, details, actor,
                rebind=False) -> int:
        if self._enqueuer is None:
            from protdp.review.enqueue import Enqueuer
            self._enqueuer = Enqueuer(self.queue_url)
        return self._enqueuer.enqueue(prediction_id, target, scores, paths, reasons,
                                      details=details, actor=actor, rebind=rebind)

    def close(self) -> None:
        if self._enqueuer is not None:
            self._enqueuer.close()
            self._enqueuer = None


def predict(checkpoint, fasta: str | Path, out_dir: str | Path, *, queue_url: str | None = None,
            **kwargs) -> RunResult:
    """`predict_batch` with flagged predictions enqueued in the review queue at `queue_url`
    (default OUT/review_queue.sqlite); other keywords as `predict_batch`."""
    if queue_url:                             # a given queue: checked before any work (issue 47)
        from protdp.review.probe import probe_queue
        probe_queue(queue_url)
    queue_url = review_queue_url(queue_url, out_dir)
    result = predict_batch(checkpoint, fasta, out_dir, sink=QueueSink(queue_url), **kwargs)
    return dataclasses.replace(result, queue_url=queue_url)


def review_commands(queue_url: str, port: int = 8765) -> str:
    """The commands that open the review UI on a queue (printed after a batch)."""
    url = printable(display_url(queue_url))
    return (f"protdp review init-db --queue-url {url}   # once: prints the admin token\n"
            f"PROTDP_REVIEW_ADMIN_TOKEN=... protdp review add-reviewer alice --queue-url {url}"
            "   # prints alice's login token once\n"
            f"protdp review serve --queue-url {url} --host 127.0.0.1 --port {port}")
