"""Module-level task functions for the worker-pool tests (workers import them by name)."""

from __future__ import annotations

import os
import random
import time

from protdp.errors import InputError


def slow_square(payload: dict) -> dict:
    """A result that depends only on the payload, after a random delay (timing must not matter)."""
    time.sleep(random.random() * payload.get("jitter", 0.05))
    if payload.get("action") == "die":
        os._exit(3)
    if payload.get("action") == "hang":
        time.sleep(600)
    if payload.get("action") == "bad":
        raise InputError("bad family", path=payload["fids"][0])
    return {"index": payload["i"], "value": payload["i"] ** 2, "pid": os.getpid()}


def describe(payload: dict) -> str:
    return f"families {', '.join(payload['fids'])}"
