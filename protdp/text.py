"""User text made safe to show: one definition for pages, terminals and TSV cells.

Target names, details and gate messages come from FASTA headers and so from anyone. Shown as
given, a control character (ESC, BEL, NUL, a tab or newline in a TSV cell) is obeyed by the
terminal or breaks the table, and a bidi override or other invisible format character (Unicode
Cf, Zl, Zp) reorders or hides what surrounds it ("alice\\u202egnp.exe"). `display_text` makes
both visible and keeps every other character, so "Å" in a gate reason and a non-ASCII target
name read as written.
"""

from __future__ import annotations

import unicodedata

_ESCAPED = ("Cc", "Cs")              # controls, lone surrogates: as \\xNN / \\uNNNN
_SHOWN = ("Cf", "Zl", "Zp")          # bidi/format, line/paragraph separators: as <U+XXXX>


def escape_char(ch: str) -> str:
    """`ch` as a Python-style escape: \\xNN, \\uNNNN or \\UNNNNNNNN (never ambiguous)."""
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_text(text, *, keep_newlines: bool = False, unambiguous: bool = False) -> str:
    """`text` for a page, terminal or TSV cell: controls escaped (\\x1b), bidi/format characters
    shown as `<U+202E>`, every other character kept. `keep_newlines` keeps "\\n" and "\\t"
    (multi-line page text). `unambiguous` (TSV cells, single-line terminal output) also writes a
    backslash as "\\\\" and format characters as "\\u202e", so every backslash in the result
    starts an escape and the original text can be read back exactly."""
    s = "" if text is None else str(text)
    out = []
    for c in s:
        cat = unicodedata.category(c)
        if keep_newlines and c in "\n\t":
            out.append(c)
        elif cat in _ESCAPED:
            out.append(escape_char(c))
        elif cat in _SHOWN:
            out.append(escape_char(c) if unambiguous else f"<U+{ord(c):04X}>")
        elif unambiguous and c == "\\":
            out.append("\\\\")
        else:
            out.append(c)
    return "".join(out)


def printable(text) -> str:
    """One line of user text for a TSV cell or a terminal message: `display_text` in its
    unambiguous form (no tab, newline, control or bidi character survives)."""
    return display_text(text, unambiguous=True)
