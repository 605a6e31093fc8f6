"""Shared test fixtures: location of the real data corpus (../shared/data or $PROTDP_DATA)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI runs the property tests on a fixed set of examples (reproducible gate); locally they
# explore new random examples on every run.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

from protdp.paths import data_root


@pytest.fixture(scope="session")
def data_dir():
    root = data_root()
    assert (root / "PAIRS.tsv").exists(), (
        f"real data corpus not found at {root}; set PROTDP_DATA or place shared/ beside the repo")
    return root


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tests share 2 cores with spawned ranks and servers: intra-op threads only oversubscribe."""
    import torch

    torch.set_num_threads(1)
    yield
