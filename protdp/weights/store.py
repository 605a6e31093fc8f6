"""Parameter files and imported checkpoints on disk.

An imported checkpoint is a folder holding `model.pt` (the ordinary protdp model file,
`protdp.inference.checkpoint.save_model_checkpoint`, so predict / calibrate / redteam / training
read it) and `provenance.json` (source file and digest, every mapped and skipped parameter with
its reason, the configuration inferred). Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from protdp import fileio
from protdp.errors import InputError
from protdp.fileio import atomic_write_json, replace_file
from protdp.train.checkpointing import IMPORTED_MODEL_FILE
from protdp.data.npz_headers import read_npz as read_npz_checked

PROVENANCE_FILE = "provenance.json"


def read_npz(path: str | Path, what: str = "parameter file") -> dict[str, np.ndarray]:
    """All arrays of an .npz file (no pickles, headers checked first); a missing, truncated or
    foreign file (a folder, a plain .npy, any non-zip bytes) is one clear error naming it as
    `what` (`protdp.data.npz_headers.read_npz`)."""
    return read_npz_checked(path, what)


def npz_shapes(path: str | Path) -> dict[str, tuple]:
    """{key: shape} of every array of an .npz from the member headers only (no data read),
    each header checked first (`protdp.weights.validate.npz_headers`)."""
    from protdp.weights.validate import npz_headers
    return npz_headers(path)


class LazyNpz:
    """Mapping view of an .npz that reads one array per access (np.load's NpzFile) and turns a
    damaged member into one clear error naming the file and key."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.shapes = npz_shapes(self.path)
        self._npz = np.load(self.path, allow_pickle=False)

    def __contains__(self, key) -> bool:
        return key in self.shapes

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self._npz[key]
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            raise InputError(f"cannot read array ({type(exc).__name__}: {exc})", path=self.path,
                             field=key) from None

    def keys(self):
        return self.shapes.keys()

    def close(self) -> None:
        self._npz.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """Uncompressed .npz with sorted keys, written atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{k: np.ascontiguousarray(arrays[k]) for k in sorted(arrays)})
        replace_file(tmp, path)
    except BaseException:          # a crash never leaves a half-written file behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, obj: dict) -> Path:
    """An import's provenance: sorted keys, strict JSON, written atomically."""
    return atomic_write_json(path, obj, sort_keys=True)


def model_file(checkpoint: str | Path) -> Path:
    """The model file of an imported checkpoint folder (or the file itself)."""
    path = Path(checkpoint)
    return path / IMPORTED_MODEL_FILE if path.is_dir() else path
