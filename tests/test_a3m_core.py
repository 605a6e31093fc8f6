"""One vectorised a3m core (`protdp.data.parse.a3m_columns`) behind both a3m readers: the plain
reader (`parse_a3m`) and ColabFold's complex a3m (`protdp.complex.colabfold_a3m.decode_rows`)
give each row the aligned letters and deletion counts a plain per-row loop gives (insertions
at a row's start, end and in runs; rows after long insertions), so the two readers cannot
drift apart."""

from __future__ import annotations

import random

import numpy as np

from protdp.complex.colabfold_a3m import decode_rows
from protdp.data.parse import parse_a3m

LETTERS = "ACDEFGHIKLMNPQRSTVWY"


def _reference(row: str) -> tuple[str, list[int]]:
    """(aligned letters, deletions before each aligned column) by walking the row."""
    aligned, dels, pending = [], [], 0
    for ch in row:
        if ch.islower():
            pending += 1
        else:
            aligned.append(ch)
            dels.append(pending)
            pending = 0
    return "".join(aligned), dels


def _rows(rng: random.Random, width: int, n: int) -> list[str]:
    rows = ["".join(rng.choice(LETTERS) for _ in range(width))]          # the query: no gaps
    for _ in range(n - 1):
        row = []
        for _ in range(width):
            row.append(rng.choice(LETTERS).lower() * rng.choice([0, 0, 0, 1, 3]))
            row.append(rng.choice(LETTERS + "--"))
        row.append(rng.choice(LETTERS).lower() * rng.choice([0, 2]))     # trailing insertion
        rows.append("".join(row))
    return rows


def test_both_readers_match_a_per_row_walk():
    rng = random.Random(7)
    for trial in range(20):
        width, n = rng.randint(1, 12), rng.randint(1, 9)
        rows = _rows(rng, width, n)
        text = "".join(f">r{i}\n{r}\n" for i, r in enumerate(rows))
        want = [_reference(r) for r in rows]
        got = decode_rows(text, "x.a3m", width)                       # ColabFold reader
        assert [g[1] for g in got] == [w[0] for w in want], trial
        assert [g[2].tolist() for g in got] == [w[1] for w in want], trial
        msa = parse_a3m(text, "x.a3m")                                 # plain reader (dedup)
        for seq, dels in zip(msa.sequences, msa.deletion_matrix):
            i = next(k for k, w in enumerate(want) if w[0] == seq)
            assert dels.tolist() == [min(d, 255) for d in want[i][1]], trial
        assert np.issubdtype(msa.deletion_matrix.dtype, np.integer)
