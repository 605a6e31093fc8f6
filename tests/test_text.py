"""protdp/text.py: one definition of "user text made safe to show", for the review pages and
terminal (display_text) and for summary.tsv (printable). The TSV form keeps non-ASCII letters
("Å" in a gate reason, a non-ASCII target name) and lets no tab/newline/control/bidi through."""

from __future__ import annotations

import re
import unicodedata

import numpy as np

from protdp.gating.policy import GatePolicy
from protdp.gating.route import route
from protdp.inference.writers import SUMMARY_COLUMNS, read_summary, write_summary
from protdp.review.hygiene import display_text as hygiene_display_text
from protdp.text import display_text, printable

HOSTILE = "ctl\x1b[2Jid\u202eexe.\ttab\nnl\r\x00\x85\u2028\\x1b\U000e0001"


def _unescape(s: str) -> str:
    """Reference reader of the TSV form (written independently of protdp/text.py)."""
    return re.sub(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})",
                  lambda m: "\\" if m[1] == "\\" else chr(int(m[1][1:], 16)), s)


def test_one_definition_serves_pages_and_tsv():
    assert hygiene_display_text is display_text
    assert display_text("alice\u202egnp.exe") == "alice<U+202E>gnp.exe"
    assert printable("alice\u202egnp.exe") == "alice\\u202egnp.exe"
    assert printable("Ångström naïve β") == "Ångström naïve β"
    assert printable("a\\x1bb") == "a\\\\x1bb" != printable("a\x1bb") == "a\\x1bb"


def test_summary_tsv_keeps_non_ascii_and_drops_controls_and_bidi(tmp_path):
    decision = route(np.full(30, 95.0), length=30, msa_depth=500, training_crop=None,
                     sequence="MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"[:30], policy=GatePolicy(),
                     interface={"iptm": 0.9, "interface_pae": 99.0})
    reason = decision.details["uncertain_interface"]
    assert "Å" in reason, reason
    targets = ["Ångström-naïve-β", HOSTILE]
    rows = [{"index": i, "target": t, "file_name": f"t{i}", "length": 30, "route": decision.route,
             "reasons": ",".join(decision.reasons), "status": "done", "detail": reason}
            for i, t in enumerate(targets)]
    path = write_summary(tmp_path / "summary.tsv", rows)
    tsv = path.read_text(encoding="utf-8")
    assert "Å" in tsv and "Ångström-naïve-β" in tsv and "\\xc5" not in tsv
    bad = [c for c in tsv if c not in "\t\n" and unicodedata.category(c) in ("Cc", "Cs", "Cf",
                                                                               "Zl", "Zp")]
    assert bad == [], [f"U+{ord(c):04X}" for c in bad]
    assert tsv.count("\n") == 3 and all(line.count("\t") == len(SUMMARY_COLUMNS) - 1
                                        for line in tsv.splitlines())
    back = read_summary(path)
    assert [r["detail"] for r in back] == [reason, reason]
    assert [_unescape(r["target"]) for r in back] == targets     # unambiguous: reads back exactly
