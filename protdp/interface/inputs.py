"""The bytes of a prediction's files, each read once: what is parsed, hashed, copied and bound.

A confidence decision is made from several files (the structure, the PAE file and, depending on
the tool, a summary JSON with ipTM / pTM, a pLDDT file, AlphaFold2's ranking_debug.json). For a
reviewer's approval to bind exactly the bytes that produced the numbers, every reader takes its
bytes from one `InputBytes`: each file is read once, by role, and the recorded bytes are what
the numbers are parsed from and what `protdp gate` hashes and copies (`files`). `unchanged`
reads them again after scoring, so a file rewritten meanwhile is an error, not a silent mix.

A file is read only if it is a regular file (a FIFO would block, a device never ends) of at most
`MAX_INPUT_BYTES`; with a `root`, only if its real path (after every link) is inside the root,
so a link in a tool's folder cannot bring a file from elsewhere into the review queue.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from protdp.errors import InputError

MAX_INPUT_BYTES = 512 * 2**20     # one input file (a 5,000-residue ColabFold JSON is ~180 MB)


@dataclass(frozen=True)
class InputFile:
    role: str                     # "structure", "pae", "summary", "plddt", "ranking"
    path: Path
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _inside(path: Path, root: Path) -> Path:
    """`path`'s real path, which must lie inside `root`'s real path."""
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(os.path.realpath(root)):
        raise InputError(f"is a link to {real}, outside the folder being read ({root}); "
                         "refusing to read it", path=path)
    return real


def read_input_bytes(path: str | Path, root: str | Path | None = None,
                     limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (with `root`: inside it)."""
    path = Path(path)
    target, flags = path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if root is not None:
        target = _inside(path, Path(root))
        flags |= getattr(os, "O_NOFOLLOW", 0)      # the checked real path, not a link swapped in
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror or type(exc).__name__})",
                         path=path) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError("not a regular file", path=path)
        if st.st_size > limit:
            raise InputError(f"is over {limit // 2**20} MiB ({st.st_size} bytes); refusing "
                             "to read it", path=path)
        data = fh.read(st.st_size)       # read(n) allocates n bytes: the size, not the limit
        if len(data) != st.st_size or fh.read(1):
            raise InputError("changed size while it was read (still being written?)",
                             path=path)
    return data


class InputBytes:
    """Every file a reader used, by role, each read once (see the module docstring)."""

    def __init__(self, root: str | Path | None = None):
        self.root = None if root is None else Path(root)
        self.files: dict[str, InputFile] = {}

    def read(self, path: str | Path, role: str) -> bytes:
        path = Path(path)
        known = self.files.get(role)
        if known is not None:
            if known.path != path:
                raise ValueError(f"role {role!r} is already {known.path}, not {path}")
            return known.data
        data = read_input_bytes(path, self.root)
        self.files[role] = InputFile(role, path, data)
        return data

    def unchanged(self) -> None:
        """Every file still holds the bytes read (else the numbers could be of other bytes
        than the ones copied and shown to a reviewer)."""
        for f in self.files.values():
            if read_input_bytes(f.path, self.root) != f.data:
                raise InputError("changed while it was being gated; run the gate again",
                                 path=f.path)
