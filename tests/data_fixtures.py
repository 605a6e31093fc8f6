"""Test helper: a small HDF5 store of a few real families of ../shared/data/PAIRS.tsv."""

from __future__ import annotations

import csv
from pathlib import Path


def build_pairs_store(data_dir: Path, pair_ids, out_dir: Path, skip_msas=()) -> Path:
    """Write `out_dir/pairs.tsv` (absolute paths) for `pair_ids`, minus MSA files in `skip_msas`
    (paths relative to the data dir), build `out_dir/data.h5` from it and return its path."""
    from protdp.data.store import build_store

    with open(data_dir / "PAIRS.tsv") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t")
                if r["pair_id"] in set(pair_ids) and r["msa_file"] not in set(skip_msas)]
    lines = ["pair_id\tmsa_file\tstructure_file\tchain"] + [
        f"{r['pair_id']}\t{data_dir / r['msa_file']}\t{data_dir / r['structure_file']}\t"
        f"{r['chain']}" for r in rows]
    pairs = Path(out_dir) / "pairs.tsv"
    pairs.write_text("\n".join(lines) + "\n")
    build_store(Path(out_dir) / "data.h5", pairs=pairs, progress=False)
    return Path(out_dir) / "data.h5"


# ------------------------------------------------------------------------ hostile inputs

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import re  # noqa: E402

# texts of Python / library exceptions that must never reach a user-facing message
RAW_LIBRARY_TEXT = re.compile(
    r"Traceback|Errno|KeyError|ValueError|TypeError|IndexError|AttributeError|RuntimeError|"
    r"UnicodeDecodeError|UnicodeError|OSError|PermissionError|FileNotFoundError|Exception|"
    r"codec can't|invalid literal|could not convert|generator didn't|has no attribute|"
    r"not subscriptable|NoneType|zlib|BadGzipFile")


def assert_clean_message(message: str, path) -> None:
    """One line, naming the file first, with no library / Python exception text in it."""
    assert "\n" not in message, message
    assert message.startswith(str(path)), (message, path)
    assert not RAW_LIBRARY_TEXT.search(message), message


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def permissions_enforced():
    """Make `chmod 000` bite even when the tests run as root: drop CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from this thread's effective set for the block (restored after;
    a no-op for ordinary users, who have neither)."""
    libc = ctypes.CDLL(None, use_errno=True)
    hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        yield
        return
    saved = [(d.effective, d.permitted, d.inheritable) for d in data]
    data[0].effective &= ~((1 << 1) | (1 << 2))
    libc.capset(ctypes.byref(hdr), data)
    try:
        yield
    finally:
        for d, s in zip(data, saved):
            d.effective, d.permitted, d.inheritable = s
        libc.capset(ctypes.byref(hdr), data)
