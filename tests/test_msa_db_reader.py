"""The block reader of `protdp.msa.sanitize` against the line-by-line reader it replaced
(tests/msa_reference_reader.py): the same records, names, residues, skipped records and reasons,
the same counts and the same error, on random databases with long lines and records, BOMs,
CRLF, gaps, bad characters, empty records and hmmpgmd '#' lines. The limits (line piece, block,
record length, name length) are shrunk so that every path is taken on small inputs."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msa_reference_reader import reference_records
from protdp.errors import InputError
from protdp.msa import sanitize
from protdp.msa.sanitize import DatabaseScan, protein_records


class _Trickle(io.RawIOBase):
    """A raw stream returning at most `step` bytes per read (as a pipe or gzip may)."""

    def __init__(self, data: bytes, step: int):
        self._data, self._at, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._step, len(self._data) - self._at)
        buffer[:n] = self._data[self._at:self._at + n]
        self._at += n
        return n


def _run(reader, data: bytes, stream=None):
    scan = DatabaseScan()
    try:
        records = list(reader(stream or io.BytesIO(data), scan, "db.fasta"))
        error = None
    except InputError as exc:
        records, error = None, str(exc)
    return records, error, scan


def _same(data: bytes, trickle: int = 0) -> None:
    want = _run(reference_records, data)
    stream = io.BufferedReader(_Trickle(data, trickle), 7) if trickle else None
    got = _run(protein_records, data, stream)
    assert got == want


_LINE = st.one_of(
    st.sampled_from([b"MKV", b"acde", b"ACGT", b"ac-gu..n", b"", b"  ", b"WY*x", b"XBZJOU",
                     b"MK1V", b"M\x00K", b"\xff", b"\xef\xbb\xbf", b"#stats", b"MK V\tL",
                     b"\x0bK\x0c", b">", b"-----"]),
    st.binary(max_size=12),
    st.text("ACDEFGHIKLMNPQRSTVWYacgtun-. \t\r", max_size=40).map(str.encode))
_HEADER = st.one_of(
    st.sampled_from([b">", b">a", b"> b c", b">\tname desc", b">n\xffm\x01e x", b">  ",
                     b">" + b"N" * 30, b">" + b" " * 12 + b"late", b">id\r"]),
    st.binary(max_size=20).map(lambda b: b">" + b),
    st.tuples(st.integers(0, 12), st.sampled_from([b"longword", b"ab cd", b"x"])).map(
        lambda t: b">" + b" " * t[0] + t[1]))


@st.composite
def _databases(draw) -> bytes:
    lines = draw(st.lists(st.sampled_from(
        [b"\xef\xbb\xbf", b"#3 1000 1 2", b"\xef\xbb\xbf#x", b"", b"  \t", b"junk",
         b"\xef\xbb\xbf\xef\xbb\xbf", b"\xef\xbb\xbf  ", b"#2345678>x", b"12345678>y",
         b" " * 9 + b">z", b"\xef\xbb\xbf" + b" " * 6 + b"w"]), max_size=3))
    bom = draw(st.booleans())                # a BOM on the first header line
    for _ in range(draw(st.integers(0, 8))):
        lines.append(draw(_HEADER))
        if bom:
            lines[-1], bom = b"\xef\xbb\xbf" + lines[-1], False
        for _ in range(draw(st.integers(0, 5))):
            line = draw(_LINE)
            lines.append(line * draw(st.sampled_from([1, 1, 1, 5, 23])))
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = eol.join(lines)
    return data + eol if draw(st.booleans()) else data


@pytest.fixture
def small_limits(monkeypatch):
    monkeypatch.setattr(sanitize, "_LINE_PIECE", 8)
    monkeypatch.setattr(sanitize, "_BLOCK", 24)
    monkeypatch.setattr(sanitize, "MAX_TARGET_RESIDUES", 40)
    monkeypatch.setattr(sanitize, "MAX_NAME_BYTES", 5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=_databases(), trickle=st.sampled_from([0, 0, 1, 5]))
def test_block_reader_equals_line_reader(small_limits, data, trickle):
    _same(data, trickle)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=120))
def test_block_reader_equals_line_reader_on_any_bytes(small_limits, data):
    _same(data)


def test_real_limits_long_lines_and_records():
    """At the real limits: a header of 2 blocks, a 70,000-residue line, a record over 100,000
    residues in 60-column lines and in one line, a bad byte after the limit, a long gap line."""
    block = sanitize._BLOCK
    good = b">ok1 d\n" + b"ACDEFGHIKL" * 30 + b"\n"
    cases = [
        good + b">" + b"h" * (2 * block) + b" x\nMKV\n" + good,
        good + b">wide\n" + b"M" * 70_000 + b"\n" + good,
        good + b">late\n" + b" " * 70_000 + b"name\nMKV\n",
        good + b">" + b" " * 65_533 + b"name\nMKV\n" + good,
        good + b">long\n" + (b"A" * 60 + b"\n") * 1700 + good,
        good + b">oneline\n" + b"A" * 100_001 + b"\n" + good,
        good + b">badlate\n" + b"A" * 99_999 + b"1" * 10 + b"\n" + good,
        good + b">badpiece\n" + b"A" * 65_530 + b"1" + b"A" * 40_000 + b"\n" + good,
        good + b">gaps\n" + b"-" * (block + 10) + b"\nMKV\n" + good,
        good + b">big\n" + (b"A" * 60 + b"\n") * (block // 50) + good,
        b"\xef\xbb\xbf>" + b"n" * 65_534 + b"\nMKV\n" + good,
        b"\xef\xbb\xbf>" + b" " * 65_531 + b"name\nMKV\n" + good,
        b"\n" * 3 + b" " * 70_000 + b"q\n" + good,
    ]
    for data in cases:
        _same(data)
        _same(data, trickle=50_000)
