"""Where the real protein data lives: env `PROTDP_DATA`, default `../shared/data`
relative to the repository root (the folder holding the `protdp` package)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_root() -> Path:
    """Root of the shared real-data corpus (see ../shared/data/README.md)."""
    env = os.environ.get("PROTDP_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT / ".." / "shared" / "data").resolve()
