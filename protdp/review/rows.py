"""Rows as callers see them: ISO times and an item's effective state at database time."""

from __future__ import annotations

import datetime as dt


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ISO 8601 UTC (what exports and pages show)."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def item_dict(row, now: float) -> dict:
    """An items row as a plain dict at database time `now`: a claim whose lease ran out reads
    as pending (nobody holds it; the row changes when someone claims or decides it), and
    `lease_remaining_s` says how long a live lease has left."""
    out = dict(row)
    out.pop("reason_codes", None)
    out["lease_remaining_s"] = None
    if out["state"] == "claimed":
        left = (out["lease_expires_at"] or 0.0) - now
        if left <= 0:
            out.update(state="pending", claimed_by=None, lease_expires_at=None)
        else:
            out["lease_remaining_s"] = round(left, 3)
    return out
