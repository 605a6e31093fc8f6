"""Errors of the review queue (all `ProtdpError`s: entry points print one line, no traceback)."""

from __future__ import annotations

from protdp.errors import ProtdpError


class QueueError(ProtdpError):
    """The queue cannot do what was asked (unreachable database, unknown reviewer, ...)."""


class QueueBusy(QueueError):
    """Another process held the SQLite write lock longer than the bounded busy wait."""


class AuthError(QueueError):
    """Missing, unknown, revoked or insufficient credentials (reviewer or admin token)."""


class ItemNotFound(QueueError):
    """No item with that id."""


class ClaimConflict(QueueError):
    """The item is decided already, held by another reviewer's live lease, or over a limit."""
