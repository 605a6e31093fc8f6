"""Project exception types raised at user-facing boundaries.

A user-facing error names the file, the line or field, and what was expected
(DESIGN.md § Conventions). Entry points catch `ProtdpError` and print its message
without a traceback.
"""

from __future__ import annotations

from pathlib import Path


class ProtdpError(Exception):
    """Base class for errors that are shown to the user without a traceback."""


class InputError(ProtdpError):
    """Malformed or unusable input; names where the problem is.

    >>> str(InputError("row length 71 != query length 70", path="x.a3m", line=12))
    'x.a3m:12: row length 71 != query length 70'
    """

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = ""
        if self.path is not None:
            where = self.path
            if line is not None:
                where += f":{line}"
            where += ": "
        if field is not None:
            where += f"field '{field}': "
        super().__init__(where + message)


class ConfigError(ProtdpError):
    """An invalid configuration value or flag combination."""


class DistributedError(ProtdpError):
    """A collective failed, timed out or ranks disagree; names the rank and operation."""
