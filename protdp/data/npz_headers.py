"""The declared shapes of an `.npz` from its member headers, before any array is read (issue 47,
"bounded by the bytes"). `np.load` allocates what a member's `.npy` header declares before it
reads the bytes, so a small file can ask for gigabytes; every reader of a user's `.npz`
(`templates.npz`, AlphaFold parameter files: `protdp.weights.validate`) reads the headers here
first and checks them against its own layout and the documented bounds.

Each member's header is read with numpy's own reader (`np.lib.format.read_magic` /
`read_array_header_{1,2}_0`); `declared_problem` compares the bytes its shape declares with
the bytes the zip member really holds, and with the zip entry's compressed size x
MAX_COMPRESSION_RATIO and MAX_DECLARED_BYTES (a zip entry may itself lie about its size).
`read_npz` reads a path, a file's bytes or an open binary file object, so that a caller that
hashes a file (a precomputed complex's features.npz) loads exactly the bytes it hashed.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from protdp.data.bounds import MAX_COMPRESSION_RATIO, MAX_DECLARED_BYTES, declared_bytes
from protdp.errors import InputError

HEADER_ERRORS = (zipfile.BadZipFile, ValueError, OSError, EOFError, SyntaxError, KeyError)


class DuplicateMember(ValueError):
    """An .npz listing one array twice (np.load silently keeps the last)."""

    def __init__(self, key: str):
        super().__init__(f"the archive holds array {key!r} twice (duplicate zip member)")
        self.key = key


@dataclass(frozen=True)
class NpyHeader:
    """One member of an .npz as its headers describe it."""

    shape: tuple
    dtype: np.dtype
    data_bytes: int        # bytes after the .npy header (the zip entry's uncompressed size)
    stored_bytes: int      # bytes the zip entry occupies in the file (compressed)

    @property
    def declared(self) -> int:
        return declared_bytes(self.shape, self.dtype.itemsize)


def _npy_header(fh) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, header length) of one `.npy` stream (numpy's own header reader)."""
    version = np.lib.format.read_magic(fh)
    read = {(1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise ValueError(f"unsupported .npy format version {version}")
    shape, _, dtype = read(fh)
    return tuple(shape), dtype, fh.tell()


def read_npz_headers(path: str | Path | BinaryIO, keys=None) -> dict[str, NpyHeader]:
    """{key: NpyHeader} of the members of an .npz (those in `keys`, or all), headers only;
    a member listed twice is a ValueError (np.load silently keeps one). Raises the
    HEADER_ERRORS of an unreadable archive for the caller to name."""
    out: dict[str, NpyHeader] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if keys is not None and key not in keys:
                continue
            if key in out:
                raise DuplicateMember(key)
            with zf.open(info) as fh:
                shape, dtype, offset = _npy_header(fh)
            out[key] = NpyHeader(shape, dtype, info.file_size - offset, info.compress_size)
    return out


def declared_problem(key: str, header: NpyHeader) -> str | None:
    """Why a member's declared size cannot be read (None: it may be): its shape x itemsize must
    be the bytes the member holds, within MAX_DECLARED_BYTES and the stored bytes x
    MAX_COMPRESSION_RATIO."""
    need = header.declared
    if header.dtype.hasobject:
        return f"{key} holds Python objects (dtype {header.dtype}), which are never unpickled"
    if need != header.data_bytes:
        return (f"{key}: header declares shape {header.shape} ({need:,} bytes) but the member "
                f"holds {header.data_bytes:,} bytes")
    limit = min(MAX_DECLARED_BYTES, max(header.stored_bytes, 1) * MAX_COMPRESSION_RATIO)
    if need > limit:
        return (f"{key} declares {need:,} bytes from {header.stored_bytes:,} stored bytes "
                f"(bound {limit:,}, protdp.data.bounds)")
    return None


def read_npz(source: str | Path | bytes | BinaryIO, what: str = "file",
             keys: tuple[str, ...] | None = None, *,
             path: str | Path | None = None) -> dict[str, np.ndarray]:
    """Every array of an .npz (or those of `keys` it holds: the other members are neither
    checked nor decompressed), never unpickled, each member's header checked first
    (`declared_problem`: nothing allocated beyond the bytes the source holds). `source` is a
    path, the file's bytes or an open binary file object: a caller that hashed the bytes loads
    exactly those bytes (`path` then names them in errors). A folder, a missing file, non-zip
    bytes (np.load would read a plain .npy or offer to unpickle) or a damaged archive is one
    InputError naming the file as an .npz `what`."""
    fh, name = _source(source, what, path)
    try:
        if not zipfile.is_zipfile(fh):
            raise InputError(f"not an .npz {what} (not a zip archive of .npy arrays)", path=name)
        _rewind(fh)
        for key, header in read_npz_headers(fh, keys).items():
            problem = declared_problem(key, header)
            if problem:
                raise InputError(problem.removeprefix(f"{key}: "), path=name, field=key)
        _rewind(fh)
        with np.load(fh, allow_pickle=False) as data:
            wanted = data.files if keys is None else [k for k in keys if k in data.files]
            return {key: data[key] for key in wanted}
    except HEADER_ERRORS as exc:
        raise InputError(f"not a readable .npz {what} ({type(exc).__name__}: {exc})",
                         path=name) from None


def _source(source, what: str, path):
    """(a path or a seekable binary file object, the name errors give) of an .npz source:
    bytes are read from memory, a file object from its start (the caller keeps it open)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source), path
    if hasattr(source, "read"):
        return source, path if path is not None else getattr(source, "name", None)
    source = Path(source)
    name = source if path is None else path
    if source.is_dir():
        raise InputError(f"a directory, not an .npz {what}", path=name)
    if not source.is_file():
        raise InputError(f"{what} not found", path=name)
    return source, name


def _rewind(fh) -> None:
    """Back to the start of a file object (zipfile.is_zipfile and ZipFile leave it anywhere;
    np.load reads its magic from where it stands); a path needs nothing."""
    if hasattr(fh, "seek"):
        fh.seek(0)
