"""Resumable, checksummed downloads for the dataset recipes (stdlib urllib: http(s) and file).

One file at a time, the same for every archive:
  * bytes go to `<dest>.part`; a retry (or a rerun after kill -9) asks for the rest with an HTTP
    `Range` request and appends when the server answers 206, else starts over;
  * the finished bytes are checked (an expected sha256 when the caller has one, then the
    caller's `check`, e.g. gzip CRC or a parse) before the rename to `dest`, so `dest` is
    always a whole, checked file; a mismatch deletes the partial file and fetches again;
  * every accepted file is appended to a sha256sum-format log (`checksums.sha256`) that a rerun
    trusts only after re-hashing: a file changed on disk since is fetched again.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CHUNK = 1 << 16
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


def _download_part(url: str, part: Path, timeout: float) -> bool:
    """Append the missing bytes of `url` to `part`; True when it resumed an earlier part."""
    offset = part.stat().st_size if part.exists() else 0
    resp = _open(url, offset, timeout)
    if resp is None:
        return True
    with resp:
        status = getattr(resp, "status", None) or 200
        resumed = offset > 0 and status == 206
        expected = resp.headers.get("Content-Length")
        with open(part, "ab" if resumed else "wb") as fh:
            got = 0
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                fh.write(block)
                got += len(block)
            fh.flush()
            os.fsync(fh.fileno())
        if expected is not None and got != int(expected):
            raise FetchError(f"{url}: connection closed after {got} of {expected} bytes")
    return resumed


def fetch(url: str, dest: Path, *, sha256: str | None = None,
          check: Callable[[Path], None] | None = None, retries: int = 3, timeout: float = 60.0,
          backoff: float = 0.5) -> Fetched:
    """Download `url` to `dest` (resuming `dest.part`), verify, rename. Raises NotFound or
    FetchError naming the URL and the last problem."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    resumed_any, last = False, "no attempt"
    for attempt in range(1, retries + 2):
        try:
            resumed_any |= _download_part(url, part, timeout)
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
        except NotFound:
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


def read_url_text(url: str, timeout: float = 60.0) -> str:
    """A small text file (index, id or checksum list) from a URL or a local path."""
    if "://" not in url:
        return Path(url).read_text()
    resp = _open(url, 0, timeout)
    with resp:
        return resp.read().decode("utf-8", "replace")
