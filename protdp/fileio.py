"""Small file helpers shared across layers: provenance hashes of inputs and checkpoints, and the\none guard every output writer goes through (`check_output`, `atomic_write_bytes`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from protdp.errors import InputError


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in `chunk`-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def torch_load_refusal(exc: BaseException, path: str | Path | None = None) -> str:
    """Why `torch.load(..., weights_only=True)` refused a file, in one line. torch's own text is
    a paragraph whose first advice, to load with weights_only=False, would run code from an
    untrusted pickle; for a file that is not a checkpoint at all it is simply wrong."""
    text = str(exc)
    pickled = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
    if pickled:
        return (f"it holds pickled Python objects ({pickled.group(1)}) besides tensors, which "
                "protdp does not unpickle (that can run code); save its state dict of tensors "
                "alone and give that file")
    if re.search(r"Trying to call reduce|Unsupported class", text) or (
            "Unsupported operand" in text and path is not None and _is_pickle(path)):
        return ("it is a pickle with operations beyond tensors (possibly code), which protdp "
                "does not unpickle; save its state dict of tensors alone and give that file")
    if "Weights only load failed" in text:
        return "not a PyTorch checkpoint (neither a torch.save archive nor a pickle of tensors)"
    if isinstance(exc, EOFError) or "zip archive" in text:
        return "empty, truncated or corrupt (the torch.save archive cannot be read)"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"cannot be read by torch.load ({type(exc).__name__}: {first})"


def _is_pickle(path: str | Path) -> bool:
    """A file that starts with pickle's PROTO opcode (protocol 2+): a raw pickle, not text."""
    try:
        with open(path, "rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False


# --- Output files: one guard for every writer ------------------------------------------------
# An output path never replaces something that is not ours (DESIGN.md § Conventions): a device
# node, FIFO, socket or directory is never replaced (`--rejects /dev/null` run as root would
# otherwise turn /dev/null into a regular file), and an existing file of another kind (a review
# queue database, a training store, a checkpoint, an input of the same job) is replaced only with
# `--force`.

_MAGIC = ((b"SQLite format 3\x00", "sqlite", "an SQLite database (e.g. a review queue)"),
          (b"\x89HDF\r\n\x1a\n", "hdf5", "an HDF5 file (e.g. a training store)"),
          (b"PK\x03\x04", "zip", "a zip archive (e.g. a checkpoint or weights)"),
          (b"\x1f\x8b", "gzip", "gzip data (e.g. a compressed input)"))
_TEXT_INPUTS = ((b">", "an a3m/FASTA file (an input)"),
                (b"# STOCKHOLM", "a Stockholm alignment (an input)"),
                (b"data_", "an mmCIF structure (an input)"),
                (b"HEADER", "a PDB structure (an input)"), (b"ATOM  ", "a PDB structure (an input)"))
TEXT_KINDS = ("text", "json", "jsonl", "tsv", "csv")    # outputs that may replace each other


class OutputRefused(InputError):
    """An output path that is not ours (one line naming the path; no traceback)."""


def _node_kind(mode: int) -> str | None:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None if stat.S_ISREG(mode) else "not a regular file"


def sniff_kind(path: str | Path) -> tuple[str, str]:
    """(kind, description) of an existing regular file from its first bytes: 'sqlite', 'hdf5',
    'zip', 'gzip', 'input' (a3m/FASTA/Stockholm/mmCIF/PDB text), 'empty' or 'text'."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return "text", "a file"
    if not head:
        return "empty", "an empty file"
    for magic, kind, what in _MAGIC:
        if head.startswith(magic):
            return kind, what
    stripped = head.lstrip(b"\xef\xbb\xbf").lstrip()
    for magic, what in _TEXT_INPUTS:
        if stripped.startswith(magic):
            return "input", what
    return "text", "a text file"


def output_problem(path: str | Path, kind: str, *, force: bool = False,
                   inputs: tuple = (), replace_same_kind: bool = True) -> str | None:
    """Why `path` must not be replaced by an output of `kind` ('text', 'json', 'jsonl', 'tsv',
    'csv', 'hdf5', 'sqlite', 'zip', ...), or None when it may be (absent, or a regular file of
    the same kind). Never allowed: a directory, device, FIFO or socket. Allowed only with
    `force`: a file of another kind, a file of the same binary kind when not
    `replace_same_kind`, or one of this job's `inputs`."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return None
    except OSError:
        return None                  # unreadable parent etc.: the write itself names it
    node = _node_kind(st.st_mode)
    if node is not None:
        return f"{node}, not a regular file; an output never replaces it (give a file path)"
    for other in inputs:
        try:
            if other is not None and os.path.samefile(p, other):
                if force:
                    return None
                return ("is an input of this same job; refusing to overwrite it (give another "
                        "output path, or --force)")
        except OSError:
            continue
    if force:
        return None
    found, what = sniff_kind(p)
    if found == "empty":
        return None
    text_out = kind in TEXT_KINDS
    if (found == "text" and text_out) or (found == kind and (text_out or replace_same_kind)):
        return None
    return (f"already exists and is {what}, not a previous {kind} output of this command; "
            f"refusing to overwrite it (give another path, or --force to replace it)")


def check_output(path: str | Path, kind: str, what: str, *, force: bool = False,
                 inputs: tuple = (), replace_same_kind: bool = True) -> Path:
    """`output_problem` as an exception: OutputRefused('<what> <path>: <reason>')."""
    why = output_problem(path, kind, force=force, inputs=inputs,
                         replace_same_kind=replace_same_kind)
    if why is not None:
        raise OutputRefused(f"{what} {why}", path=path)
    return Path(path)


def replace_file(tmp: str | Path, path: str | Path) -> None:
    """os.replace(tmp, path), unless `path` became a non-regular file meanwhile (then `tmp` is
    removed and OutputRefused raised): the last check before every output rename."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    node = None if st is None else _node_kind(st.st_mode)
    if node is not None:
        Path(tmp).unlink(missing_ok=True)
        raise OutputRefused(f"{node}, not a regular file; an output never replaces it",
                            path=path)
    os.replace(tmp, path)


def commit_file(tmp: str | Path, path: str | Path) -> None:
    """A finished temporary file (e.g. an HDF5 store) into place durably: fsync it, rename it
    over `path` with `replace_file`, fsync the folder (the rename survives a power cut)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    replace_file(tmp, path)
    dfd = os.open(Path(path).parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` via a temporary file beside `path`, fsync, and `replace_file`: a crash leaves
    the old file or the new one, never a half-written one, and never replaces a device node."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        replace_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj, *, sort_keys: bool = False,
                      allow_nan: bool = False, default=None) -> Path:
    """`obj` as indented JSON (one trailing newline) through `atomic_write_bytes`; the parent
    folder is made if missing. `allow_nan` only for reports that must keep a NaN they measured
    (a benchmark's kernel check, a calibration's undefined correlation); `default` as in
    `json.dumps`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=1, sort_keys=sort_keys, allow_nan=allow_nan,
                      default=default) + "\n"
    return atomic_write_bytes(path, text.encode())


def read_json_object(path: str | Path, what: str, data: bytes | None = None) -> dict:
    """A JSON file that must hold an object (`what` names it in the error; `data`: its bytes,
    read earlier): damaged JSON, binary data or another JSON type is one InputError naming the
    file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text() if data is None else data.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"invalid JSON: {exc}", path=path) from None
    if not isinstance(doc, dict):
        raise InputError(f"a JSON {type(doc).__name__}, expected {what}", path=path)
    return doc


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, one read of at most `limit` bytes (a larger file is one InputError
    naming it and the bound: nothing beyond the bound is read)."""
    path = Path(path)
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} larger than {limit:,} bytes (protdp.data.bounds)", path=path)
    return data
