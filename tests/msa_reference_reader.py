"""Reference for `protdp.msa.sanitize.protein_records`: the plain line-by-line reader it
replaced (every line read with `readline` in pieces of at most `_LINE_PIECE` bytes, every
record checked piece by piece). Slow (~9 MB/s) but obviously right; the block reader must
yield the same records, names and skipped records with the same reasons, in the same order.

It reads the limits from `protdp.msa.sanitize` at call time, so a test that shrinks them
(monkeypatch) shrinks them for both readers.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

from protdp.errors import InputError
from protdp.msa import sanitize as S

_AMINO = frozenset(b"ACDEFGHIKLMNPQRSTVWYBJZOUX*")    # Easel's amino alphabet, gaps excluded
_NUCLEOTIDE = frozenset(b"ACGTUN")
_NAME_SAFE = bytes(c if 0x21 <= c <= 0x7E else ord("_") for c in range(256))


def _pieces(stream: BinaryIO) -> Iterator[tuple[bytes, bool]]:
    at_start = True
    while True:
        piece = stream.readline(S._LINE_PIECE)
        if not piece:
            return
        yield piece, at_start
        at_start = piece.endswith(b"\n")


class _Record:
    def __init__(self, number: int, name: bytes):
        self.number, self.name = number, name
        self.parts: list[bytes] = []
        self.length = 0
        self.problem: str | None = None

    def add(self, piece: bytes) -> None:
        if self.problem is not None:
            return
        residues = piece.translate(None, b" \t\r\n\v\f-.").upper()
        self.length += len(residues)
        if self.length > S.MAX_TARGET_RESIDUES:
            self.problem = (f"longer than HMMER's {S.MAX_TARGET_RESIDUES:,}-residue limit on a "
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


def _record_name(header: bytes) -> bytes:
    words = header[1:].split(None, 1)
    return words[0][:S.MAX_NAME_BYTES].translate(_NAME_SAFE) if words else b""


def reference_records(stream: BinaryIO, scan: S.DatabaseScan,
                      path) -> Iterator[tuple[bytes, bytes]]:
    """(name, upper-case residues) of every good record; bad ones in `scan.skipped`."""
    first = True
    current: _Record | None = None

    def finish(rec: _Record):
        scan.records += 1
        if rec.problem is None and rec.length == 0:
            rec.problem = "header without a sequence"
        if rec.problem is not None:
            scan.skipped.append(S.SkippedRecord(rec.number, rec.name.decode("ascii"),
                                                rec.problem))
            return None
        seq = b"".join(rec.parts)
        scan.sequences += 1
        if set(seq) <= _NUCLEOTIDE:
            scan.nucleotide_like += 1
        return rec.name, seq

    line_no, in_header = 0, False
    for piece, line_start in _pieces(stream):
        if not line_start:
            if not in_header and current is not None:
                current.add(piece)
            continue
        line_no += 1
        if first:
            piece = piece.removeprefix(b"\xef\xbb\xbf")
            if piece.startswith(b"#"):
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
