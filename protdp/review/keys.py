"""The audit key: a server secret kept outside the database, so that a database credential
alone cannot forge the audit log, a session or a reviewer.

The key (32 random bytes, hex) lives in a file created with mode 0600 when the queue is created
or migrated (`protdp review init-db`). Its path is `PROTDP_REVIEW_KEY_FILE` when set (the
administrator sets it for the web server and the admin CLI), else `<queue file>.key` next to a
SQLite queue, else `~/.config/protdp/review-keys/<host>_<port>_<database>.key` for PostgreSQL.

What it signs (`protdp.review.audit`): every audit event but `enqueued`/`superseded` carries
`mac = HMAC-SHA256(key, event hash)`; web session tokens are stored as HMAC(key, token). The
predictor (enqueue role) needs no key: its unsigned events can only ever make an item pending.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from protdp.review.errors import QueueError

KEY_ENV = "PROTDP_REVIEW_KEY_FILE"


def default_key_path(url) -> Path:
    """Where the key of the queue at `url` (a sqlalchemy URL) lives unless KEY_ENV says."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    if url.get_backend_name() == "sqlite":
        return Path(url.database + ".key")
    name = f"{url.host or 'local'}_{url.port or 5432}_{url.database}".replace("/", "_")
    return Path.home() / ".config" / "protdp" / "review-keys" / f"{name}.key"


def read_key(path: Path) -> bytes | None:
    """The key, None when the file does not exist (or is not readable by this user)."""
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise QueueError(f"{path}: the review audit key file is not hex") from None
    if len(key) < 16:
        raise QueueError(f"{path}: the review audit key is shorter than 16 bytes")
    return key


def create_key(path: Path) -> bytes:
    """A new key file (mode 0600, never replacing an existing one); returns the key in it.
    Written to a private temporary file and hard-linked into place, so a process racing to
    create the same queue never reads a half-written key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_bytes(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.hex() + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        existing = read_key(path)
        if existing is None:
            raise QueueError(f"{path}: review audit key exists but cannot be read") from None
        return existing
    finally:
        tmp.unlink(missing_ok=True)
    return key


def mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a, b)
