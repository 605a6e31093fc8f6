"""Resumable, checksummed downloads for the dataset recipes (stdlib urllib: http(s) and file).

One file at a time, the same for every archive:
  * bytes go to `<dest>.part`; a retry (or a rerun after kill -9) asks for the rest with an HTTP
    `Range` request and appends when the server answers 206, else starts over;
  * the finished bytes are checked (an expected sha256 when the caller has one, then the
    caller's `check`, e.g. gzip CRC or a parse) before the rename to `dest`, so `dest` is
    always a whole, checked file; a mismatch deletes the partial file and fetches again;
  * every accepted file is appended to a sha256sum-format log (`checksums.sha256`) that a rerun
    trusts only after re-hashing: a file changed on disk since is fetched again.

Against a hostile or broken mirror: a body longer than `max_bytes` stops there (an endless
body), an attempt that runs past `deadline` seconds stops even while bytes keep trickling
(the socket timeout alone never fires on 1 byte every 20 s), and a 206 answer is appended only
when its `Content-Range` starts at the requested offset (a 206 from 0 restarts the file).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CHUNK = 1 << 16
MAX_FILE_BYTES = 4 << 30        # largest download accepted (an endless body stops here)
MAX_TEXT_BYTES = 256 << 20      # largest index / id / checksum list read into memory
FILE_DEADLINE_S = 1800.0        # one attempt at one file, start to end (a 1-byte trickle)
USER_AGENT = "protdp-datasets/1 (+https://github.com/; resumable recipe)"


class FetchError(Exception):
    """A file could not be fetched and checked (after retries); the message says why."""


class NotFound(FetchError):
    """The archive has no such file (HTTP 404 / missing file://)."""


@dataclass
class Fetched:
    path: Path
    sha256: str
    size: int
    attempts: int
    resumed: bool          # some bytes came from an earlier, interrupted attempt


def sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _open(url: str, offset: int, timeout: float):
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        req.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"{url}: not found (HTTP 404)") from None
        if exc.code == 416 and offset:          # nothing left to send: the part is whole
            return None
        raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, FileNotFoundError):
            raise NotFound(f"{url}: not found") from None
        raise FetchError(f"{url}: {exc.reason}") from None


def _range_start(resp) -> int | None:
    """First byte offset of a 206 answer's `Content-Range: bytes START-END/TOTAL`."""
    m = re.match(r"\s*bytes\s+(\d+)-", resp.headers.get("Content-Range") or "")
    return int(m.group(1)) if m else None


def _download_part(url: str, part: Path, timeout: float, max_bytes: int = MAX_FILE_BYTES,
                   deadline: float = FILE_DEADLINE_S) -> bool:
    """Append the missing bytes of `url` to `part`; True when it resumed an earlier part."""
    offset = part.stat().st_size if part.exists() else 0
    started = time.monotonic()
    resp = _open(url, offset, timeout)
    if resp is None:
        return True
    with resp:
        status = getattr(resp, "status", None) or 200
        if status == 206:
            start = _range_start(resp)
            if start not in (0, offset):
                raise FetchError(f"{url}: asked for bytes from {offset}, the server sent "
                                 f"Content-Range {resp.headers.get('Content-Range')!r}")
            resumed = offset > 0 and start == offset      # a 206 from 0: the whole file
        else:
            resumed = False
        expected = resp.headers.get("Content-Length")
        with open(part, "ab" if resumed else "wb") as fh:
            got = 0
            base = offset if resumed else 0
            read = getattr(resp, "read1", resp.read)      # what arrived: never waits for 64 KiB
            while True:
                block = read(CHUNK)
                if not block:
                    break
                fh.write(block)
                got += len(block)
                if base + got > max_bytes:
                    raise _TooBig(f"{url}: larger than the {max_bytes >> 20} MiB download cap "
                                  f"(an endless or wrong body)")
                if time.monotonic() - started > deadline:
                    raise FetchError(f"{url}: not finished after {deadline:.0f} s (the server "
                                     f"sends too slowly); the part is kept for a retry")
            fh.flush()
            os.fsync(fh.fileno())
        if expected is not None and got != int(expected):
            raise FetchError(f"{url}: connection closed after {got} of {expected} bytes")
    return resumed


def fetch(url: str, dest: Path, *, sha256: str | None = None,
          check: Callable[[Path], None] | None = None, retries: int = 3, timeout: float = 60.0,
          backoff: float = 0.5, max_bytes: int = MAX_FILE_BYTES,
          deadline: float = FILE_DEADLINE_S) -> Fetched:
    """Download `url` to `dest` (resuming `dest.part`), verify, rename. Raises NotFound or
    FetchError naming the URL and the last problem."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    resumed_any, last = False, "no attempt"
    for attempt in range(1, retries + 2):
        try:
            resumed_any |= _download_part(url, part, timeout, max_bytes, deadline)
            digest = sha256_path(part)
            if sha256 is not None and digest != sha256:
                raise _Corrupt(f"sha256 {digest[:12]}... != expected {sha256[:12]}...")
            if check is not None:
                try:
                    check(part)
                except Exception as exc:          # the caller's check: gzip, parser, ...
                    raise _Corrupt(f"failed the content check: {exc}") from None
            os.replace(part, dest)
            return Fetched(dest, digest, dest.stat().st_size, attempt, resumed_any)
        except (NotFound, _TooBig):
            part.unlink(missing_ok=True)
            raise
        except _Corrupt as exc:
            part.unlink(missing_ok=True)          # bad bytes: never resume from them
            last = f"corrupt download ({exc})"
        except (FetchError, OSError, http.client.HTTPException) as exc:
            last = str(exc) or type(exc).__name__  # keep the part: the next try resumes
        if attempt <= retries:
            time.sleep(backoff * attempt)
    raise FetchError(f"{url}: gave up after {retries + 1} attempts: {last}")


class _Corrupt(Exception):
    pass


class _TooBig(FetchError):
    """Over the download cap: retrying would only fetch the same endless body again."""


class ChecksumLog:
    """Append-only sha256sum-format log of accepted files (paths relative to `root`)."""

    def __init__(self, root: Path, name: str = "checksums.sha256"):
        self.root = Path(root)
        self.path = self.root / name
        self._lock = threading.Lock()
        self.entries: dict[str, str] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                digest, _, rel = line.partition("  ")
                if len(digest) == 64 and rel:
                    self.entries[rel] = digest

    def rel(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def verified(self, path: Path) -> bool:
        """The file exists and still has the recorded sha256."""
        want = self.entries.get(self.rel(path))
        return want is not None and Path(path).is_file() and sha256_path(Path(path)) == want

    def add(self, path: Path, digest: str) -> None:
        rel = self.rel(path)
        with self._lock:
            self.entries[rel] = digest
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write(f"{digest}  {rel}\n")
                fh.flush()
                os.fsync(fh.fileno())

    def compact(self) -> None:
        """Rewrite the log with one line per file (last entry wins), atomically."""
        with self._lock:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(f"{d}  {r}\n" for r, d in sorted(self.entries.items())))
            os.replace(tmp, self.path)


def read_sha256sums(text: str) -> dict[str, str]:
    """`sha256sum` output -> {relative path: digest} ('*' binary marks allowed)."""
    out = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, rel = line.strip().partition(" ")
        rel = rel.strip().lstrip("*")
        if len(digest) != 64 or not rel:
            raise ValueError(f"line {lineno}: expected '<sha256>  <path>', got {line[:80]!r}")
        out[rel] = digest.lower()
    return out


def read_url_text(url: str, timeout: float = 60.0, max_bytes: int = MAX_TEXT_BYTES,
                  deadline: float = FILE_DEADLINE_S) -> str:
    """A small text file (index, id or checksum list) from a URL or a local path, at most
    `max_bytes` and `deadline` seconds (an endless or trickling index is an error)."""
    if "://" not in url:
        with open(url, "rb") as fh:
            data = fh.read(max_bytes + 1)
    else:
        started, chunks, got = time.monotonic(), [], 0
        with _open(url, 0, timeout) as resp:
            read = getattr(resp, "read1", resp.read)
            while got <= max_bytes:
                block = read(CHUNK)
                if not block:
                    break
                chunks.append(block)
                got += len(block)
                if time.monotonic() - started > deadline:
                    raise FetchError(f"{url}: not finished after {deadline:.0f} s")
        data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FetchError(f"{url}: larger than the {max_bytes >> 20} MiB cap for an index or "
                         f"list")
    return data.decode("utf-8", "replace")
