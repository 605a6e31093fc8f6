"""Record checks of a sequence database before the search: bounded names, bounded records, bad
records skipped and recorded, the rest searched.

Easel's FASTA reader fails the whole database on one bad record without naming it (a record
over HMMER's 100,000-residue limit, a digit in a sequence), and keeps the whole header line in
memory; pyhmmer's Stockholm writer then pads every alignment row to the longest name (a 50 MiB
header on one hit took 13.6 GB and crashed). Here each record is read line by line with every
line read in bounded pieces:

* the name is the header's first word, at most `MAX_NAME_BYTES` bytes, printable ASCII (other
  bytes become '_'); the description is not kept (the search output never shows it);
* a record longer than `MAX_TARGET_RESIDUES` residues, with a character outside the amino-acid
  alphabet, or with no residues is skipped and recorded (`SkippedRecord`: its number, name and
  why), and stops being held as soon as it is known to be bad;
* a UTF-8 byte-order mark is dropped (as `protdp data build` does); an hmmpgmd file's '#'
  statistics line is skipped.

`check_searchable` then turns the cases that used to run silently with 0 hits into one line
naming the file: nothing searchable, or only nucleotide sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

MAX_NAME_BYTES = 128               # longest database record name kept (the first header word)
MAX_TARGET_RESIDUES = 100_000      # HMMER's limit on a target sequence's length
MAX_REPORTED = 20                  # skipped records listed one by one in the output
_LINE_PIECE = 1 << 16              # bytes read at a time from one line
_AMINO = frozenset(b"ACDEFGHIKLMNPQRSTVWYBJZOUX*")    # Easel's amino alphabet, gaps excluded
_NUCLEOTIDE = frozenset(b"ACGTUN")
_REMOVED = b" \t\r\n\v\f-."                           # whitespace and gap characters
_NAME_SAFE = bytes(c if 0x21 <= c <= 0x7E else ord("_") for c in range(256))


@dataclass(frozen=True)
class SkippedRecord:
    """A database record not searched: its 1-based number in the file, name and why."""

    number: int
    name: str
    reason: str


@dataclass
class DatabaseScan:
    """What one pass over a database held: searchable records, skipped ones, nucleotide-like."""

    sequences: int = 0
    nucleotide_like: int = 0
    records: int = 0
    skipped: list[SkippedRecord] = field(default_factory=list)


def _pieces(stream: BinaryIO) -> Iterator[tuple[bytes, bool]]:
    """(piece, starts_a_line) for the stream read in pieces of at most `_LINE_PIECE` bytes:
    a line longer than that comes as several pieces, only the first starting the line."""
    at_start = True
    while True:
        piece = stream.readline(_LINE_PIECE)
        if not piece:
            return
        yield piece, at_start
        at_start = piece.endswith(b"\n")


def _record_name(header: bytes) -> bytes:
    words = header[1:].split(None, 1)
    return words[0][:MAX_NAME_BYTES].translate(_NAME_SAFE) if words else b""


class _Record:
    def __init__(self, number: int, name: bytes):
        self.number, self.name = number, name
        self.parts: list[bytes] = []
        self.length = 0
        self.problem: str | None = None

    def add(self, piece: bytes) -> None:
        if self.problem is not None:
            return
        residues = piece.translate(None, _REMOVED).upper()
        self.length += len(residues)
        if self.length > MAX_TARGET_RESIDUES:
            self.problem = (f"longer than HMMER's {MAX_TARGET_RESIDUES:,}-residue limit on a "
                            "target sequence")
            self.parts = []
            return
        bad = set(residues) - _AMINO
        if bad:
            char = min(bad)
            shown = chr(char) if 0x21 <= char <= 0x7E else f"byte 0x{char:02X}"
            self.problem = f"illegal character {shown!r} in the sequence (not an amino acid)"
            self.parts = []
            return
        self.parts.append(residues)


def protein_records(stream: BinaryIO, scan: DatabaseScan, path) -> Iterator[tuple[bytes, bytes]]:
    """(name, upper-case residues) of every good record of a FASTA / hmmpgmd byte stream; bad
    records go to `scan.skipped`. InputError when the file is not FASTA at all."""
    from protdp.errors import InputError

    first = True
    current: _Record | None = None

    def finish(rec: _Record):
        scan.records += 1
        if rec.problem is None and rec.length == 0:
            rec.problem = "header without a sequence"
        if rec.problem is not None:
            scan.skipped.append(SkippedRecord(rec.number, rec.name.decode("ascii"), rec.problem))
            return None
        seq = b"".join(rec.parts)
        scan.sequences += 1
        if set(seq) <= _NUCLEOTIDE:
            scan.nucleotide_like += 1
        return rec.name, seq

    line_no, in_header = 0, False
    for piece, line_start in _pieces(stream):
        if not line_start:                    # the rest of a long line
            if not in_header and current is not None:
                current.add(piece)
            continue
        line_no += 1
        if first:
            piece = piece.removeprefix(b"\xef\xbb\xbf")
            if piece.startswith(b"#"):          # hmmpgmd statistics line
                first, in_header = False, True
                continue
            if not piece.strip():
                continue
            if not piece.startswith(b">"):
                shown = piece[:40].decode("ascii", "backslashreplace")
                raise InputError(f"not a FASTA / hmmpgmd sequence database: line {line_no} "
                                 f"starts with {shown!r}, expected a '>' header", path=path)
            first = False
        in_header = piece.startswith(b">")
        if in_header:
            if current is not None:
                done = finish(current)
                if done is not None:
                    yield done
            current = _Record(scan.records + 1, _record_name(piece))
        elif current is not None:
            current.add(piece)
    if current is not None:
        done = finish(current)
        if done is not None:
            yield done


def check_searchable(scan: DatabaseScan, path) -> None:
    """One line naming the file when the database has nothing a protein search can hit."""
    from protdp.errors import InputError

    if scan.sequences == 0:
        why = "the file is empty"
        if scan.skipped:
            reasons = sorted({s.reason for s in scan.skipped})
            why = (f"all {len(scan.skipped)} record(s) skipped: {'; '.join(reasons[:3])}")
        raise InputError(f"the sequence database holds no searchable protein sequence ({why})",
                         path=path)
    if scan.nucleotide_like == scan.sequences:
        raise InputError(f"the sequence database looks like nucleotides (all {scan.sequences} "
                         "sequence(s) are A/C/G/T/U/N only); give a protein database",
                         path=path)


def skipped_lines(skipped: list[SkippedRecord], path) -> list[str]:
    """One line per skipped record (the first `MAX_REPORTED`, then a count)."""
    lines = [f"{path}: record {s.number} ('{s.name}') skipped: {s.reason}"
             for s in skipped[:MAX_REPORTED]]
    if len(skipped) > MAX_REPORTED:
        lines.append(f"{path}: ... and {len(skipped) - MAX_REPORTED} more record(s) skipped")
    return lines
