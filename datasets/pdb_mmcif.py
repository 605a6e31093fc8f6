"""PDB mmCIF files from an archive laid out like the wwPDB FTP tree.

    <base>/pub/pdb/data/structures/divided/mmCIF/<id[1:3]>/<id>.cif.gz   one entry
    <base>/pub/pdb/derived_data/index/entries.idx                       entry index

`entries.idx` is tab-separated after two header lines: IDCODE, HEADER, ACCESSION DATE
(MM/DD/YY, the deposition date), COMPOUND, SOURCE, AUTHOR LIST, RESOLUTION ('NOT' when none),
EXPERIMENT TYPE. Entries are chosen from a list of ids or by deposition date, resolution and
method read from it. Each file is fetched whole (gzip CRC checked), decompressed and parsed by
gemmi before it is kept as `<out>/mmcif/<id>.cif` (protdp's structure reader takes .cif).
"""

from __future__ import annotations

import datetime as dt
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE = "https://files.wwpdb.org"
ENTRY_PATH = "pub/pdb/data/structures/divided/mmCIF/{mid}/{id}.cif.gz"
INDEX_PATH = "pub/pdb/derived_data/index/entries.idx"
_ID = re.compile(r"^[0-9][A-Za-z0-9]{3}$")


def entry_path(pdb_id: str) -> str:
    """Archive-relative path of one entry (the wwPDB 'divided' layout: middle two characters)."""
    pid = pdb_id.lower()
    return ENTRY_PATH.format(mid=pid[1:3], id=pid)


def normalize_id(text: str, where: str) -> str:
    pid = text.strip().lower()
    if not _ID.match(pid):
        raise ValueError(f"{where}: '{text.strip()}' is not a 4-character PDB id")
    return pid


def read_id_list(text: str, source: str) -> list[str]:
    """One id per line (or comma/space separated); '#' comments; duplicates dropped."""
    ids: dict[str, None] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0]
        for word in re.split(r"[\s,]+", line.strip()):
            if word:
                ids.setdefault(normalize_id(word[:4] if "_" in word else word,
                                            f"{source}:{lineno}"), None)
    return list(ids)


@dataclass
class IndexEntry:
    pdb_id: str
    deposited: dt.date | None
    resolution: float | None
    methods: tuple[str, ...]


def _date(text: str) -> dt.date | None:
    try:
        month, day, year = (int(x) for x in text.strip().split("/"))
    except ValueError:
        return None
    year += 1900 if year >= 70 else 2000      # two-digit years: PDB entries start in 1970s
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def parse_entries_idx(text: str) -> list[IndexEntry]:
    """entries.idx -> entries (lines that do not parse are skipped: the index is big and old)."""
    out = []
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) < 8 or not _ID.match(cols[0].strip()):
            continue
        try:
            res = float(cols[6].split(",")[0])
        except ValueError:
            res = None
        methods = tuple(m.strip().upper() for m in cols[7].split(",") if m.strip())
        out.append(IndexEntry(cols[0].strip().lower(), _date(cols[2]), res, methods))
    return out


def select_entries(entries: list[IndexEntry], *, deposited_after: dt.date | None = None,
                   deposited_before: dt.date | None = None, max_resolution: float | None = None,
                   methods: tuple[str, ...] = ()) -> list[str]:
    """Ids passing every given filter (an entry without the needed field fails that filter)."""
    keep = []
    for e in entries:
        if deposited_after and (e.deposited is None or e.deposited < deposited_after):
            continue
        if deposited_before and (e.deposited is None or e.deposited > deposited_before):
            continue
        if max_resolution is not None and (e.resolution is None or e.resolution > max_resolution):
            continue
        if methods and not set(methods) & set(e.methods):
            continue
        keep.append(e.pdb_id)
    return keep


MAX_CIF_BYTES = 2 << 30      # largest decompressed mmCIF accepted (a gzip bomb stops here)


def check_cif_gz(path: Path, max_bytes: int = MAX_CIF_BYTES) -> None:
    """Whole gzip stream (CRC and length checked by the gzip module) holding an mmCIF block
    with atoms, decompressed in chunks up to `max_bytes` (a gzip bomb is refused, not held)."""
    import gemmi

    chunks, total = [], 0
    with gzip.open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                break
            total += len(block)
            if total > max_bytes:
                raise ValueError(f"decompresses to more than {max_bytes >> 20} MiB (a gzip "
                                 f"bomb or not an mmCIF entry)")
            chunks.append(block)
    doc = gemmi.cif.read_string(b"".join(chunks).decode("utf-8", "replace"))
    if len(doc) == 0 or doc[0].find_value("_entry.id") is None:
        raise ValueError("no mmCIF data block with _entry.id")
    if not len(doc[0].find_values("_atom_site.Cartn_x")):
        raise ValueError("no atoms (_atom_site table missing or empty)")


def unpack(gz_path: Path, cif_path: Path) -> None:
    """Decompress to `cif_path` atomically (temp + rename)."""
    tmp = cif_path.with_name(cif_path.name + ".tmp")
    with gzip.open(gz_path, "rb") as src, open(tmp, "wb") as dst:
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            dst.write(block)
    tmp.replace(cif_path)
