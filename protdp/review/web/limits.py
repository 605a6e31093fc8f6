"""Request limits of the review server (issue 47): a declared `Content-Length` beyond
MAX_REQUEST_BYTES (the UI sends small forms and JSON: a decision, a comment, a login) or one
that is not a number is answered 413 / 400 at once, with `Connection: close`, instead of the
server waiting for 99,999,999,999 bytes that will never come."""

from __future__ import annotations

MAX_REQUEST_BYTES = 1024 * 1024
"""Largest request body the review server reads (1 MiB; a comment is at most a few KiB)."""


def body_refusal(headers) -> tuple[int, str] | None:
    """(HTTP status, message) when the declared body size is refused, else None."""
    declared = headers.get("content-length")
    if declared is None:
        return None
    if not declared.strip().isdigit():
        return 400, "Content-Length is not a number"
    if int(declared) > MAX_REQUEST_BYTES:
        return 413, (f"request body of {int(declared)} bytes refused: this server reads at "
                     f"most {MAX_REQUEST_BYTES} bytes")
    return None
