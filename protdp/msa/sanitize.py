"""Record checks of a sequence database before the search: bounded names, bounded records, bad
records skipped and recorded, the rest searched.

Easel's FASTA reader fails the whole database on one bad record without naming it (a record
over HMMER's 100,000-residue limit, a digit in a sequence), and keeps the whole header line in
memory; pyhmmer's Stockholm writer then pads every alignment row to the longest name (a 50 MiB
header on one hit took 13.6 GB and crashed). Here the file is read in blocks of `_BLOCK` bytes
cut after the last whole record, each record checked at once with C-speed `bytes` methods
(~10x faster than reading it line by line; benchmarks/msa_db_read.py); a record that does not
fit in a block, and a bad record (for its reason), is checked as the line-by-line reader did,
every line in pieces of at most `_LINE_PIECE` bytes, so the result is the same to the byte
(tests/test_msa_db_reader.py):

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
_LINE_PIECE = 1 << 16              # bytes of one line checked at a time (the careful path)
_BLOCK = 1 << 20                   # bytes read at a time; a longer record is read in pieces
_AMINO = b"ACDEFGHIKLMNPQRSTVWYBJZOUX*"              # Easel's amino alphabet, gaps excluded
_AMINO_SET = frozenset(_AMINO)
_NUCLEOTIDE = b"ACGTUN"
_REMOVED = b" \t\r\n\v\f-."                           # whitespace and gap characters
_HEADER_START = ord(">")
_UPPER = bytes(range(256)).upper()                    # bytes.upper() as a translate table
_UPPER_OR_ZERO = bytes(c if c in _AMINO else 0 for c in _UPPER)   # 0: not an amino acid
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


class _Blocks:
    """The stream read in blocks of `_BLOCK` bytes: `buf[pos:]` is what is not yet consumed.
    `piece()` returns what `stream.readline(_LINE_PIECE)` would (a line, or `_LINE_PIECE` bytes
    of a longer one), so the careful path reads exactly the pieces the line reader did."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.buf, self.pos, self.eof = stream, b"", 0, False

    def fill(self) -> bool:
        """Append one more block (dropping what is consumed); False at the end of the stream."""
        block = b"" if self.eof else self.stream.read(_BLOCK)
        if not block:
            self.eof = True
            return False
        self.buf, self.pos = self.buf[self.pos:] + block, 0
        return True

    def piece(self) -> bytes:
        while True:
            buf, pos = self.buf, self.pos
            end = buf.find(b"\n", pos, pos + _LINE_PIECE)
            if end >= 0 or len(buf) - pos >= _LINE_PIECE or not self.fill():
                stop = end + 1 if end >= 0 else min(len(buf), pos + _LINE_PIECE)
                self.pos = stop
                return buf[pos:stop]

    def skip_line(self, piece: bytes) -> None:
        """Consume the rest of the line `piece` began."""
        while piece and not piece.endswith(b"\n"):
            piece = self.piece()

    def skip_record(self) -> None:
        """From a line start, consume up to the next line starting with '>' (or the end)."""
        while True:
            at = self.buf.find(b"\n>", self.pos)
            if at >= 0:
                self.pos = at + 1
                return
            self.pos = max(self.pos, len(self.buf) - 1)     # a '\n' that a '>' may follow
            if not self.fill():
                self.pos = len(self.buf)
                return

    def peek(self) -> int | None:
        """The next byte, None at the end of the stream."""
        while self.pos >= len(self.buf):
            if not self.fill():
                return None
        return self.buf[self.pos]


def _record_name(header: bytes) -> bytes:
    words = header[1:].split(None, 1)
    return words[0][:MAX_NAME_BYTES].translate(_NAME_SAFE) if words else b""


class _Record:
    """One record checked piece by piece (the careful path): held only while it is good."""

    def __init__(self, number: int, name: bytes):
        self.number, self.name = number, name
        self.parts: list[bytes] = []
        self.length = 0
        self.problem: str | None = None

    def add(self, piece: bytes) -> None:
        if self.problem is not None:
            return
        residues = piece.translate(_UPPER, _REMOVED)
        self.length += len(residues)
        if self.length > MAX_TARGET_RESIDUES:
            self.problem = (f"longer than HMMER's {MAX_TARGET_RESIDUES:,}-residue limit on a "
                            "target sequence")
            self.parts = []
            return
        if residues.translate(None, _AMINO):
            char = min(set(residues) - _AMINO_SET)
            shown = chr(char) if 0x21 <= char <= 0x7E else f"byte 0x{char:02X}"
            self.problem = f"illegal character {shown!r} in the sequence (not an amino acid)"
            self.parts = []
            return
        self.parts.append(residues)

    def add_lines(self, body: bytes) -> None:
        """The sequence lines `body` (in memory), in the pieces the line reader read them."""
        for line in body.split(b"\n"):
            for at in range(0, len(line), _LINE_PIECE):
                self.add(line[at:at + _LINE_PIECE])
                if self.problem is not None:
                    return


def _finish(rec: _Record, scan: DatabaseScan):
    """(name, residues) of a good record, None for a bad one (then recorded in `scan`)."""
    scan.records += 1
    if rec.problem is None and rec.length == 0:
        rec.problem = "header without a sequence"
    if rec.problem is not None:
        scan.skipped.append(SkippedRecord(rec.number, rec.name.decode("ascii"), rec.problem))
        return None
    seq = b"".join(rec.parts)
    scan.sequences += 1
    if not seq.strip(_NUCLEOTIDE):                          # A/C/G/T/U/N only
        scan.nucleotide_like += 1
    return rec.name, seq


def _streamed_record(src: _Blocks, header: bytes, scan: DatabaseScan):
    """The record whose header line began with the piece `header`, read piece by piece up to
    the next line starting with '>' (a record that does not fit a block, and the first one)."""
    rec = _Record(scan.records + 1, _record_name(header))
    src.skip_line(header)
    while src.peek() not in (None, _HEADER_START):       # up to the next header line
        if rec.problem is not None:                       # known bad: nothing more to check
            src.skip_record()
            break
        piece = src.piece()
        rec.add(piece)
        while not piece.endswith(b"\n") and piece:      # the rest of a long line
            piece = src.piece()
            rec.add(piece)
    return _finish(rec, scan)


def _chunk_records(chunk: bytes, scan: DatabaseScan) -> Iterator[tuple[bytes, bytes]]:
    """The whole records in `chunk` (records without their leading '>', joined by b"\\n>"),
    each checked at once; a bad one is re-read in the line reader's pieces for its reason
    (the first piece over the length limit or with a bad character decides it)."""
    piece, most = _LINE_PIECE - 1, MAX_TARGET_RESIDUES
    for text in chunk.split(b"\n>"):
        header, _, body = text.partition(b"\n")
        words = header[:piece].split(None, 1)               # the name from the first piece
        name = words[0][:MAX_NAME_BYTES].translate(_NAME_SAFE) if words else b""
        seq = body.translate(_UPPER_OR_ZERO, _REMOVED)
        if 0 < len(seq) <= most and b"\0" not in seq:
            scan.records += 1
            scan.sequences += 1
            if not seq.strip(_NUCLEOTIDE):                  # A/C/G/T/U/N only
                scan.nucleotide_like += 1
            yield name, seq
            continue
        rec = _Record(scan.records + 1, name)
        rec.add_lines(body)
        done = _finish(rec, scan)
        if done is not None:
            yield done


def _first_header(src: _Blocks, path) -> bytes | None:
    """Skip what precedes the first record (BOM, blank lines, an hmmpgmd '#' line); its header
    line's first piece, None for a file without one. InputError when the file is not FASTA."""
    from protdp.errors import InputError

    line_no, statistics = 0, False
    while True:
        piece = src.piece()
        if not piece:
            return None
        line_no += 1
        if statistics:                      # after the '#' line: up to the first header
            if piece.startswith(b">"):
                return piece
            src.skip_line(piece)
            continue
        whole = piece
        piece = piece.removeprefix(b"\xef\xbb\xbf")
        if piece.startswith(b"#"):          # hmmpgmd statistics line
            statistics = True
            src.skip_line(whole)
            continue
        if not piece.strip():
            src.skip_line(whole)
            continue
        if not piece.startswith(b">"):
            shown = piece[:40].decode("ascii", "backslashreplace")
            raise InputError(f"not a FASTA / hmmpgmd sequence database: line {line_no} "
                             f"starts with {shown!r}, expected a '>' header", path=path)
        return piece


def protein_records(stream: BinaryIO, scan: DatabaseScan, path) -> Iterator[tuple[bytes, bytes]]:
    """(name, upper-case residues) of every good record of a FASTA / hmmpgmd byte stream; bad
    records go to `scan.skipped`. InputError when the file is not FASTA at all.

    Read in blocks of `_BLOCK` bytes cut after the last whole record (at the last b"\\n>"),
    each record checked with a few C-speed `bytes` calls; a record that does not fit in a block
    is read piece by piece instead, never held past `MAX_TARGET_RESIDUES` residues."""
    src = _Blocks(stream)
    header = _first_header(src, path)
    if header is None:
        return
    done = _streamed_record(src, header, scan)      # its header may have lost a BOM
    if done is not None:
        yield done
    while src.peek() is not None:                     # at a header line
        cut = src.buf.rfind(b"\n>", src.pos)
        if cut >= 0:                                  # whole records, up to the last one
            chunk, src.pos = src.buf[src.pos + 1:cut], cut + 1
            yield from _chunk_records(chunk, scan)
        elif len(src.buf) - src.pos < _BLOCK and src.fill():
            continue                                  # the record may end in the next block
        elif src.eof:                                 # the last record
            chunk, src.pos = src.buf[src.pos + 1:], len(src.buf)
            yield from _chunk_records(chunk, scan)
        else:                                         # a record longer than a block
            done = _streamed_record(src, src.piece(), scan)
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
