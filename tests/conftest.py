"""Shared test fixtures: location of the real data corpus (../shared/data or $PROTDP_DATA)."""

from __future__ import annotations

import pytest

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
