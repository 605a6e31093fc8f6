"""Reading users' input files safely: one clear `InputError` line per problem, never a hang.

* Regular files only: the path is `os.stat`-ed before it is opened, and opened non-blocking
  and `fstat`-ed again, so a named pipe, device, socket or directory is refused, never read
  (a FIFO in a pairs file would otherwise block the build forever).
* gzip is transparent everywhere (`x.a3m.gz`, `x.cif.gz`, by the gzip magic bytes), with a cap
  on the decompressed size (a gzip bomb is an error, not an out-of-memory kill).
* Text is strict UTF-8 (a UTF-8 byte-order mark is dropped; UTF-16 is named as such); CRLF and
  lone CR line endings become LF; NUL bytes mean binary data. Every error names the file and,
  where one exists, the line.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import zlib
from pathlib import Path

from protdp.errors import InputError
from protdp.fileio import atomic_write_bytes, check_output

MAX_INPUT_BYTES = 8 << 30      # largest file or decompressed gzip stream read (8 GiB)
GZIP_MAGIC = b"\x1f\x8b"
_READ_CHUNK = 1 << 20

_KIND = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"))


def os_reason(exc: OSError) -> str:
    """Short human reason for an OSError (no errno numbers, no library wording)."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the file is not readable by this user)"
    if exc.errno == errno.ENOENT:
        return "file not found"
    if exc.errno == errno.EISDIR:
        return "is a directory, expected a file"
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long"
    if exc.errno == errno.ELOOP:
        return "too many levels of symbolic links"
    if exc.errno == errno.ENOTDIR:
        return "a parent of this path is not a directory"
    return f"cannot read the file ({(exc.strerror or 'I/O error').lower()})"


def _not_regular(mode: int) -> str | None:
    for test, what in _KIND:
        if test(mode):
            return what
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_regular_file(path: str | Path) -> os.stat_result:
    """os.stat the path; InputError unless it is an existing regular file (symlinks followed)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(os_reason(exc), path=path) from None
    what = _not_regular(st.st_mode)
    if what is not None:
        raise InputError(f"{what}, not a regular file; only regular files are read",
                         path=path)
    return st


def _open_regular(path: str | Path) -> int:
    """File descriptor of a regular file, opened without ever blocking on a FIFO."""
    check_regular_file(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputError(os_reason(exc), path=path) from None
    what = _not_regular(os.fstat(fd).st_mode)       # replaced between stat and open?
    if what is not None:
        os.close(fd)
        raise InputError(f"{what}, not a regular file; only regular files are read", path=path)
    return fd


def check_readable(path: str | Path) -> None:
    """InputError unless `path` is a regular file this process can open for reading."""
    os.close(_open_regular(path))


def read_raw(path: str | Path, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The file's bytes as stored (no decompression)."""
    fd = _open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            return _read_bounded(fh, max_bytes, path)
    except OSError as exc:
        raise InputError(os_reason(exc), path=path) from None


def _read_bounded(fh, max_bytes: int, path: str | Path) -> bytes:
    """At most `max_bytes` from `fh`, read in chunks: memory grows with the file, never with
    the bound (`fh.read(max_bytes + 1)` reserves the whole 8 GiB up front, so under `ulimit -v`,
    SLURM memory limits or strict overcommit every read died on its first file)."""
    chunks, total = [], 0
    while True:
        block = fh.read(min(_READ_CHUNK * 16, max_bytes + 1 - total))
        if not block:
            return b"".join(chunks)
        chunks.append(block)
        total += len(block)
        if total > max_bytes:
            raise InputError(f"file is larger than the {max_bytes >> 20} MiB input limit",
                             path=path)


def _gunzip(data: bytes, path: str | Path, max_bytes: int) -> bytes:
    """All gzip members of `data`, decompressed, at most `max_bytes`."""
    out, total = [], 0
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            chunk = d.decompress(data, max_bytes - total + 1)
        except zlib.error:
            raise InputError("gzip data is corrupt (expected a valid .gz file)",
                             path=path) from None
        total += len(chunk)
        out.append(chunk)
        if total > max_bytes or d.unconsumed_tail:
            raise InputError(f"decompresses to more than the {max_bytes >> 20} MiB input "
                             f"limit", path=path)
        if not d.eof:
            raise InputError("gzip data is truncated (the .gz file ends before its end "
                             "marker)", path=path)
        data = d.unused_data
        if data and not data.startswith(GZIP_MAGIC):
            break                                   # trailing padding after the last member
    return b"".join(out)


def read_bytes(path: str | Path, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """File content, gunzipped when it is gzip data (by magic bytes or a `.gz` suffix)."""
    return unpack(read_raw(path, max_bytes), path, max_bytes)


def unpack(data: bytes, path: str | Path, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The content of a file's stored bytes `data` (`read_raw`): gunzipped when gzip data."""
    if data.startswith(GZIP_MAGIC):
        return _gunzip(data, path, max_bytes)
    if str(path).lower().endswith(".gz") and data:
        raise InputError("named .gz but is not gzip data", path=path)
    return data


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def decode_text(data: bytes, path: str | Path) -> str:
    """Strict UTF-8 text with LF line endings (BOM dropped, CRLF / CR converted)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError("not a text file in UTF-8 (UTF-16 byte-order mark); save the file as "
                         "UTF-8 or ASCII", path=path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(f"not a text file: NUL byte at offset {nul} (binary data)",
                         path=path, line=_line_of(data, nul))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
        raise InputError(f"not a text file in UTF-8: byte 0x{bad:02X} at offset {exc.start} "
                         f"cannot be decoded (save the file as UTF-8 or ASCII)", path=path,
                         line=_line_of(data, exc.start)) from None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_text(path: str | Path, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """`decode_text(read_bytes(path))`: a regular, possibly gzipped, UTF-8 text file."""
    return decode_text(read_bytes(path, max_bytes), path)


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of the stored bytes of a regular file (never blocks on a FIFO)."""
    h = hashlib.sha256()
    fd = _open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            for block in iter(lambda: fh.read(_READ_CHUNK), b""):
                h.update(block)
    except OSError as exc:
        raise InputError(os_reason(exc), path=path) from None
    return h.hexdigest()


def split_suffix(path: str | Path) -> tuple[str, str]:
    """(name without format suffix, lower-case format suffix) ignoring a trailing `.gz`:
    `1abc.cif.gz` -> ('1abc', '.cif'); `x_A.uniref.sto` -> ('x_A.uniref', '.sto')."""
    name = Path(path).name
    if name.lower().endswith(".gz"):
        name = name[:-3]
    p = Path(name)
    return p.stem if p.suffix else name, p.suffix.lower()


def format_suffix(path: str | Path) -> str:
    """Lower-case extension that names the file format, ignoring a trailing `.gz`."""
    return split_suffix(path)[1]


def writable_output(path: str | Path, what: str, kind: str = "text", *, force: bool = False,
                    inputs: tuple = (), replace_same_kind: bool = True) -> Path:
    """Check (before any work) that `path` can be created or replaced: its folder exists or
    can be made and is writable, the path is not a directory, and it is ours to replace
    (`protdp.fileio.check_output`: never a device node or FIFO; a file of another `kind` or an
    input of the job only with `force`). Returns it as a Path."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise InputError(f"{what} is a directory, expected a file path", path=p)
    check_output(p, kind, what, force=force, inputs=inputs, replace_same_kind=replace_same_kind)
    parent = p.parent if str(p.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the folder of the {what}: {os_reason(exc)}",
                         path=parent) from None
    if not parent.is_dir():
        raise InputError(f"the folder of the {what} is not a directory", path=parent)
    probe = parent / f".{p.name}.probe-{os.getpid()}"
    try:                            # a real write: access(2) says yes to root regardless
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError:
        raise InputError(f"cannot write the {what}: its folder is not writable",
                         path=parent) from None
    if p.exists():
        try:
            os.close(os.open(p, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0)))
        except OSError:
            raise InputError(f"cannot write the {what}: the file is read-only or not a "
                             f"regular file", path=p) from None
    return p


def atomic_write_text(path: str | Path, text: str) -> None:
    """`protdp.fileio.atomic_write_bytes` of UTF-8 text (a crash leaves the old file or the new
    one, never a half-written one, never over a device node or FIFO); an OS error is one line."""
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as exc:
        raise InputError(f"cannot write: {os_reason(exc).replace('read', 'write')}",
                         path=path) from None


def writable_folder(path: str | Path, what: str) -> Path:
    """Check (before any work) that folder `path` exists or can be made and is writable (a real
    write probe); one InputError line otherwise (e.g. for `protdp predict --out`)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{what} exists and is not a folder", path=p)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the {what}: {os_reason(exc)}", path=p) from None
    writable_output(p / ".protdp-write-probe", what)
    return p


def save_structure(structure, directory: Path, name: str,
                   kinds: tuple[str, ...] = ("pdb", "cif")) -> dict[str, Path]:
    """Write a Biopython structure as `<name>.pdb` / `<name>.cif` (those of `kinds`), each
    through a hidden per-process temporary renamed into place, so a crash never leaves half a
    file under the final name; returns {kind: path}."""
    from Bio.PDB import MMCIFIO, PDBIO
    out = {}
    for kind, io_cls in (("pdb", PDBIO), ("cif", MMCIFIO)):
        if kind not in kinds:
            continue
        path = Path(directory) / f"{name}.{kind}"
        writer = io_cls()
        writer.set_structure(structure)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        writer.save(str(tmp))
        os.replace(tmp, path)
        out[kind] = path
    return out
