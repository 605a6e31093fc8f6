"""Sequence databases: FASTA, FASTA.gz or HMMER's preformatted daemon database (hmmpgmd: a
`#` statistics line, then FASTA; what `hmmpgmd` serves), streamed in bounded blocks,
checksummed once.

A database is never loaded whole: `SequenceDatabase.blocks` yields `DigitalSequenceBlock`s of at
most `residues` residues, each record read and checked by `protdp.msa.sanitize` (bounded
names and lengths; a bad record skipped and recorded, not the whole database failed) and
digitized by Easel (pyhmmer). A gzip file is decompressed by Python's `gzip`
module under a reader that keeps the real error, so a truncated or corrupt archive is an error
naming the file (Easel's own `.gz` path pipes through `gzip -dc` and would silently stop at the
damage). The sha256 of each database is computed once and cached in `databases.json` beside the
search output, keyed by path, size and modification time.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from protdp.errors import ConfigError, InputError
from protdp.data.safeio import check_readable, os_reason
from protdp.fileio import sha256_file
from protdp.msa.sanitize import DatabaseScan, check_searchable, protein_records

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas", ".fsa", ".pep", ".seq", ".hmmpgmd")
CACHE_NAME = "databases.json"
DEFAULT_BLOCK_RESIDUES = 2_000_000   # ~2 MB of residues per block: memory, not results


class _CheckedGzip(io.RawIOBase):
    """Raw reader over `gzip.open(path)` that remembers the decompression error: Easel turns an
    exception raised inside its read callback into an unrelated message."""

    def __init__(self, path: Path):
        self._fh = gzip.open(path, "rb")
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            return self._fh.readinto(buffer)
        except (EOFError, OSError, zlib.error) as exc:
            self.error = exc
            raise

    def close(self) -> None:
        self._fh.close()
        super().close()


@dataclass(frozen=True)
class SequenceDatabase:
    """One target database (one MSA per query is searched in each)."""

    path: Path
    name: str                 # output file stem, e.g. 'uniref90' for uniref90.fasta.gz

    @classmethod
    def open(cls, path: str | Path) -> "SequenceDatabase":
        """Validate the path (exists, readable, FASTA/FASTA.gz name) without reading it all."""
        path = Path(path).expanduser()
        if not path.exists():
            raise InputError("sequence database not found (expected a FASTA or FASTA.gz file)",
                             path=path)
        check_readable(path)       # a directory, FIFO or device (/dev/zero) is named as such
        return cls(path.resolve(), database_name(path))

    @property
    def compressed(self) -> bool:
        return self.path.suffix.lower() == ".gz"

    @property
    def easel_format(self) -> str:
        """'hmmpgmd' when the (decompressed) file starts with its '#' statistics line."""
        opener = gzip.open if self.compressed else open
        try:
            with opener(self.path, "rb") as fh:
                head = fh.read(4096).lstrip()
        except (OSError, EOFError, zlib.error):
            return "fasta"        # the stream itself reports the damage, naming the file
        return "hmmpgmd" if head.startswith(b"#") else "fasta"

    def blocks(self, residues: int = DEFAULT_BLOCK_RESIDUES,
               scan: DatabaseScan | None = None) -> Iterator:
        """Stream the database as `DigitalSequenceBlock`s of about `residues` residues, record
        by record through `protdp.msa.sanitize` (bounded names and records; a bad record is
        skipped and listed in `scan.skipped`, the rest searched). Ends with an InputError
        naming the file when nothing in it can be searched."""
        from pyhmmer.easel import Alphabet, DigitalSequenceBlock, TextSequence

        alphabet = Alphabet.amino()
        scan = scan if scan is not None else DatabaseScan()
        raw = _CheckedGzip(self.path) if self.compressed else None
        try:
            stream = io.BufferedReader(raw if raw is not None else io.FileIO(str(self.path)),
                                       1 << 20)
        except OSError as exc:
            raise InputError(os_reason(exc), path=self.path) from None
        block, size = DigitalSequenceBlock(alphabet), 0
        try:
            for name, seq in protein_records(stream, scan, self.path):
                block.append(TextSequence(name=name, sequence=seq.decode("ascii"))
                             .digitize(alphabet))
                size += len(seq)
                if size >= residues:
                    yield block
                    block, size = DigitalSequenceBlock(alphabet), 0
            if len(block):
                yield block
        except (OSError, EOFError, zlib.error) as exc:
            if raw is not None and raw.error is not None:
                raise self._gzip_error(raw.error) from None
            raise InputError(os_reason(exc), path=self.path) from None
        finally:
            stream.close()
        check_searchable(scan, self.path)

    def _gzip_error(self, exc: BaseException) -> InputError:
        return InputError(f"corrupt or truncated gzip archive ({exc})", path=self.path)


def database_name(path: str | Path) -> str:
    """'uniref90' for uniref90.fasta.gz, 'mgy_clusters' for mgy_clusters.fa, ..."""
    name = Path(path).name
    if name.lower().endswith(".gz"):
        name = name[:-3]
    stem, suffix = os.path.splitext(name)
    return stem if suffix.lower() in FASTA_SUFFIXES and stem else name


def open_databases(paths: list[str | Path]) -> list[SequenceDatabase]:
    """Validate every database; two with the same output name are a ConfigError."""
    if not paths:
        raise ConfigError("give at least one sequence database (--db)")
    dbs = [SequenceDatabase.open(p) for p in paths]
    seen: dict[str, Path] = {}
    for db in dbs:
        if db.name in seen:
            raise ConfigError(f"databases {seen[db.name]} and {db.path} would write the same "
                              f"MSA file name '{db.name}.a3m'; rename one")
        seen[db.name] = db.path
    return dbs


class ChecksumCache:
    """sha256 (and sequence count once searched) of each database, cached in `databases.json`
    under `folder` and reused while the file's size and modification time are unchanged."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / CACHE_NAME
        try:
            self._data = json.loads(self.path.read_text())
            if not isinstance(self._data, dict):
                self._data = {}
        except (OSError, ValueError):
            self._data = {}

    @staticmethod
    def _stamp(db: SequenceDatabase) -> dict:
        st = db.path.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def describe(self, db: SequenceDatabase) -> dict:
        """{name, path, sha256, size} (the provenance entry), hashing the file when needed."""
        key = str(db.path)
        entry = self._data.get(key, {})
        stamp = self._stamp(db)
        if {k: entry.get(k) for k in stamp} != stamp or not entry.get("sha256"):
            entry = {**stamp, "sha256": sha256_file(db.path)}
            self._data[key] = entry
            self._save()
        return {"name": db.name, "path": key, "sha256": entry["sha256"], "size": entry["size"]}

    def sequences(self, db: SequenceDatabase) -> int | None:
        return self._data.get(str(db.path), {}).get("sequences")

    def record_sequences(self, db: SequenceDatabase, count: int) -> None:
        entry = self._data.get(str(db.path))
        if entry is not None and entry.get("sequences") != count:
            entry["sequences"] = count
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
