"""JSON text of the prediction files: values made JSON-plain by one function (`json_plain`),
and float matrices (the PAE [L, L]) rounded once and encoded once (`JsonMatrix`), however many
files hold them.

At L = 2000 a PAE matrix is 4M floats. The top-ranked model's stands in its `pae_<m>.json`,
the AFDB file and scores.json (1 decimal), and in its ColabFold scores and
`<name>_predicted_aligned_error_v1.json` (2 decimals). Python's `json` writes an `indent=1`
document with its pure-Python encoder (a generator step per float, ~1 s per million floats),
and even its C encoder spends ~0.3 µs on each float's repr. A rounded matrix has few distinct
values (k / 10^decimals: ~320 for a PAE to 1 decimal), so a `JsonMatrix` writes each of them
once (`value_codes`) and builds every text by looking its entries up, joined with the
separators json.dumps puts between them (for indent=1: ",\n" and the indentation); its rows
hold the table's float objects, 8 bytes a value instead of a float's 32. Where the values
are not exactly such a table (NaN / Inf, -0.0, a wide range) the C encoder writes the rows,
one by one, with the same separators. Either way the text is json.dumps's byte for byte
(tests/test_json_text.py; cost: benchmarks/output_writing.py). A document is encoded with a
placeholder string where each matrix stands, then the matrix's cached text is put in its
place (`strict_json`, `compact_json`).
"""

from __future__ import annotations

import json
import math
import secrets
from pathlib import Path
from typing import Callable

import numpy as np


VALUE_TABLE_MAX = 1 << 20
"""Most distinct values a matrix's values are looked up from (`value_codes`)."""


class JsonMatrix(list):
    """A float matrix as JSON lists (rows of floats: what json.loads gives back) that keeps its
    encodings, so a matrix written into several files is encoded once. `finite`: it holds no
    NaN / Inf. A list subclass: readers of the document see the plain nested lists."""

    def __init__(self, rows: list, finite: bool, coded: tuple | None = None):
        super().__init__(rows)
        self.finite = finite
        self._coded = coded               # (value texts [n], codes [L, L]): `value_codes`
        self._strict: JsonMatrix | None = None
        self._texts: dict[tuple, str] = {}

    @classmethod
    def rounded(cls, matrix, decimals: int) -> "JsonMatrix":
        """`matrix` [L, L] rounded to `decimals` in float64 (float32 would print its noise,
        3.1400001049041748), as AlphaFold's `confidence.pae_json` rounds."""
        values = np.round(np.asarray(matrix, np.float64), decimals)              # [L, L]
        if values.ndim != 2:
            raise ValueError(f"a matrix has 2 axes, not {values.ndim} ({values.shape})")
        coded = value_codes(values, decimals)
        if coded is None:
            return cls(values.tolist(), bool(np.isfinite(values).all()))
        floats, texts, codes = coded
        # the rows hold the table's float objects: 8 bytes a value, not a float's 32
        return cls(floats[codes].tolist(), True, (texts, codes))

    def strict(self) -> "JsonMatrix":
        """This matrix with null where it holds NaN / Inf (strict JSON); itself if none."""
        if self.finite:
            return self
        if self._strict is None:
            self._strict = JsonMatrix([[v if math.isfinite(v) else None for v in row]
                                       for row in self], True)
        return self._strict

    def compact_text(self) -> str:
        """json.dumps(self, separators=(",", ":")) (NaN / Inf as json.dumps writes them)."""
        key = ("compact",)
        if key not in self._texts:
            self._texts[key] = "[" + ",".join(f"[{r}]" for r in self._rows_text(",")) + "]"
        return self._texts[key]

    def indented_text(self, lead: str, step: str) -> str:
        """The strict matrix as json.dumps(..., indent=len(step)) writes it where its line
        starts with `lead`: each row on a line at lead + step, each value at lead + 2 step."""
        key = ("indented", lead, step)
        if key not in self._texts:
            row_pad, item_pad = "\n" + lead + step, "\n" + lead + step + step
            rows = [f"[{item_pad}{r}{row_pad}]" if r else "[]"
                    for r in self.strict()._rows_text("," + item_pad)]
            self._texts[key] = "[]" if not rows else (
                "[" + row_pad + ("," + row_pad).join(rows) + "\n" + lead + "]")
        return self._texts[key]

    def _rows_text(self, separator: str) -> list[str]:
        """Each row's values as json.dumps writes them, joined by `separator`."""
        coded = self._coded
        if coded is not None:
            table, codes = coded
            return [separator.join(table[row]) for row in codes]
        return [json.dumps(row, separators=(separator, ":"))[1:-1] for row in self]


def value_codes(values: np.ndarray, decimals: int) -> tuple | None:
    """(floats [n], texts [n], codes [L, L] int32) of a matrix rounded to `decimals`: its
    distinct values, each k / 10^decimals, as Python floats and as json writes them (a
    float's repr, ~0.3 µs each, paid once per distinct value; a row's texts are then one numpy
    lookup), and each entry's index into them. None where that does not hold exactly (NaN /
    Inf, -0.0, a range wider than `VALUE_TABLE_MAX`): the matrix is listed and json writes it
    then."""
    scale = 10 ** decimals
    if values.size == 0 or not np.isfinite(values).all() or \
            np.signbit(values[values == 0]).any():
        return None
    k = np.rint(values * scale)                                                  # [L, L]
    lo, hi = int(k.min()), int(k.max())
    if hi - lo >= VALUE_TABLE_MAX or not np.array_equal(k / scale, values):
        return None
    floats = np.array([i / scale for i in range(lo, hi + 1)], dtype=object)    # [n]
    texts = np.array([repr(f) for f in floats], dtype=object)                   # [n]
    return floats, texts, (k - lo).astype(np.int32)


def json_plain(obj, matrix: Callable | None = None):
    """`obj` as its JSON round trip: keys str, tuples lists, numpy arrays / scalars (and any
    scalar with `.item()`, a torch one) numbers, NaN / Inf null, a Path its str. A
    `JsonMatrix` stays one (`strict`), or becomes `matrix(m)` when that is given."""
    if isinstance(obj, JsonMatrix):
        return obj.strict() if matrix is None else matrix(obj.strict())
    if isinstance(obj, dict):
        return {str(k): json_plain(v, matrix) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_plain(v, matrix) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_plain(obj.tolist(), matrix)
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def strict_json(doc, indent: int = 1) -> str:
    """json.dumps(json_plain(doc), indent=indent, ensure_ascii=True, allow_nan=False), byte
    for byte, each `JsonMatrix` in `doc` written from its cached text."""
    parked = _Parking()
    text = json.dumps(json_plain(doc, parked.park), indent=indent, ensure_ascii=True,
                      allow_nan=False)
    return parked.unpark(text, lambda m, lead: m.indented_text(lead, " " * indent))


def compact_json(doc) -> str:
    """json.dumps(doc, separators=(",", ":")) (AlphaFold's / AFDB's compact form, NaN as
    json.dumps writes it), byte for byte, each `JsonMatrix` written from its cached text."""
    parked = _Parking()
    text = json.dumps(_park_matrices(doc, parked.park), separators=(",", ":"))
    return parked.unpark(text, lambda m, lead: m.compact_text())


def _park_matrices(obj, park: Callable):
    """`obj` with each JsonMatrix swapped for `park(m)`; nothing else converted."""
    if isinstance(obj, JsonMatrix):
        return park(obj)
    if isinstance(obj, dict):
        return {k: _park_matrices(v, park) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_park_matrices(v, park) for v in obj]
    return obj


class _Parking:
    """Placeholder strings for matrices while the rest of a document is encoded: a random
    nonce makes them strings no document holds."""

    def __init__(self):
        self.nonce = secrets.token_hex(8)
        self.matrices: list[JsonMatrix] = []

    def park(self, m: JsonMatrix) -> str:
        self.matrices.append(m)
        return f"@json-matrix-{self.nonce}-{len(self.matrices) - 1}@"

    def unpark(self, text: str, body: Callable[[JsonMatrix, str], str]) -> str:
        """`text` with each placeholder (a JSON string) replaced by `body(matrix, lead)`,
        `lead` the spaces its line starts with."""
        spots = []
        for k, m in enumerate(self.matrices):
            token = f'"@json-matrix-{self.nonce}-{k}@"'
            at = text.index(token)
            line = text[text.rfind("\n", 0, at) + 1:at]
            spots.append((at, len(token), body(m, line[:len(line) - len(line.lstrip(" "))])))
        parts, done = [], 0
        for at, size, body_text in sorted(spots, key=lambda s: s[0]):
            parts += [text[done:at], body_text]
            done = at + size
        return "".join(parts) + text[done:]
