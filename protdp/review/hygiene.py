"""Input hygiene for the review queue: what may be stored, and how user text is displayed.

Stored text (target names, prediction ids, details, scores) comes from FASTA headers and so
from anyone: control characters (NUL included: PostgreSQL `text` refuses it and a terminal
obeys escape sequences) are escaped to visible `\\xNN` at enqueue, so a hostile header is
queued, never crashes the batch. Reviewer comments refuse them instead (the reviewer can fix
the text, and the draft is kept). Bidi overrides and other invisible format characters are
stored as given but neutralised on display (`display_text`), so "alice\\u202egnp.exe" cannot
pose as another name. Integers from URLs and forms are range-checked (`int_in_range`).
"""

from __future__ import annotations

import math
import re
import unicodedata

from protdp.errors import InputError
from protdp.text import display_text  # noqa: F401  (one definition; callers import it here)
from protdp.text import escape_char as _escape

MAX_COMMENT_CHARS = 10_000
LIST_TEXT_CHARS = 80                 # target names etc. in lists; the item page shows all
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
CODE_RE = re.compile(r"^[a-z0-9_]{1,64}$")
_COMMENT_OK = "\n\r\t"


def escape_controls(text: str) -> str:
    """Control characters (Unicode Cc) and lone surrogates as visible escapes."""
    return "".join(_escape(c) if unicodedata.category(c) in ("Cc", "Cs") else c for c in text)


def clean_json(obj, where: str):
    """JSON-able `obj` with every string (keys too) control-escaped and non-finite floats as
    null; numpy scalars/arrays become plain numbers/lists."""
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        obj = obj.tolist()
    if isinstance(obj, dict):
        return {escape_controls(str(k)): clean_json(v, where) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v, where) for v in obj]
    if isinstance(obj, str):
        return escape_controls(obj)
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    raise InputError(f"value of type {type(obj).__name__} is not JSON-serialisable", field=where)


def check_comment(comment: str | None) -> str:
    """A reviewer's comment, stripped; refuses control characters and overlong text."""
    comment = (comment or "").strip()
    if len(comment) > MAX_COMMENT_CHARS:
        raise InputError(f"comment longer than {MAX_COMMENT_CHARS} characters", field="comment")
    bad = sorted({f"U+{ord(c):04X}" for c in comment
                  if unicodedata.category(c) in ("Cc", "Cs") and c not in _COMMENT_OK})
    if bad:
        raise InputError(f"comment contains control characters {', '.join(bad)}",
                         field="comment")
    return comment


def check_filter_text(value: str | None, field: str, max_chars: int = 200) -> str | None:
    """A free-text filter from a URL: bounded, no control characters."""
    if not value:
        return None
    if len(value) > max_chars:
        raise InputError(f"longer than {max_chars} characters", field=field)
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise InputError("contains control characters", field=field)
    return value


def truncate(text, limit: int = LIST_TEXT_CHARS) -> str:
    """Display text cut to `limit` characters with an ellipsis (lists; full text elsewhere)."""
    s = display_text(text)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def int_in_range(value, field: str, lo: int, hi: int) -> int:
    """An integer parameter within [lo, hi], else InputError (HTTP 400, never a 500)."""
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise InputError(f"must be an integer, got {str(value)[:40]!r}", field=field) from None
    if not lo <= n <= hi:
        raise InputError(f"must be between {lo} and {hi}", field=field)
    return n
