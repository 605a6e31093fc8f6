"""Prediction targets: FASTA records -> validated sequences and their MSAs.

Everything here is a pure function of the input files, so every data-parallel rank computes the
same target list (indices, duplicate and file-name-collision checks) before taking its shard.
A problem with one record never stops the others: it is attached to that target (`error`) and
the predictor records the target as rejected. Sequence rules: ASCII letters only (case and
ASCII whitespace are ignored; B/J/O/U/Z/X are unknown residues and become X, as in AF2);
gaps, digits, punctuation, control and non-ASCII characters are errors naming the position.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from protdp.data.parse import MSA_EXTENSIONS as _MSA_FORMAT_EXTENSIONS
from protdp.data.parse import Msa, merge_msas, parse_msa
from protdp.data.residues import RESTYPES
from protdp.data.safeio import check_readable, decode_text, read_bytes, read_raw
from protdp.errors import InputError
from protdp.inference.writers import printable, safe_name

# every MSA format extension, plain or gzip-compressed
MSA_EXTENSIONS = _MSA_FORMAT_EXTENSIONS + tuple(f"{e}.gz" for e in _MSA_FORMAT_EXTENSIONS)
_ASCII_WS = " \t\r\v\f"
_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass
class Target:
    """One FASTA record, in file order."""

    index: int                 # 0-based position in the FASTA (summary order, sharding key)
    target_id: str             # first word of the header, exactly as given (user text)
    header: str                # the whole header line after '>'
    raw_sequence: str          # sequence lines joined, unvalidated
    line: int                  # 1-based line of the header (or of the first headerless line)
    file_name: str = ""        # safe_name(target_id): the output folder / MSA file stem
    error: str | None = None   # a record-level problem found while reading (-> rejected)
    extra: dict = field(default_factory=dict)


def _read_text(path: Path) -> str:
    """Regular file only (never blocks on a FIFO), gzip transparent, CRLF / CR line ends."""
    data = read_bytes(path)
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):     # UTF-16: one line naming it
        decode_text(data, path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # invalid UTF-8 becomes U+FFFD, which the sequence check then names; headers keep the rest
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_targets(path: str | Path) -> list[Target]:
    """FASTA (plain or .gz) -> targets. Lines end at LF, CRLF or a lone CR; any other control
    character inside a header stays in that header. Sequence lines before the first header
    form a rejected record."""
    path = Path(path)
    text = _read_text(path)
    targets: list[Target] = []
    seq_lines: list[str] = []
    current: Target | None = None

    def close():
        if current is not None:
            current.raw_sequence = "".join(seq_lines)
            targets.append(current)

    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line.startswith(">"):
            close()
            header = line[1:]
            words = header.split()
            current = Target(len(targets), words[0] if words else "", header, "", lineno)
            if not words:
                current.error = f"{path}:{lineno}: empty FASTA header (no target id)"
            seq_lines = []
        elif line.strip(_ASCII_WS) == "":
            continue
        else:
            if current is None:
                current = Target(len(targets), f"<no header, line {lineno}>", "", "", lineno,
                                 error=f"{path}:{lineno}: sequence before the first '>' header")
                seq_lines = []
            seq_lines.append(line)
    close()
    if not targets:
        raise InputError("no FASTA records found", path=path)
    _assign_names(targets, path)
    return targets


def _assign_names(targets: list[Target], path: Path) -> None:
    """File names, duplicate ids, and two ids whose file names would collide (also ignoring
    case, for case-insensitive file systems): the later record is rejected."""
    first_line: dict[str, int] = {}
    name_owner: dict[str, str] = {}
    for t in targets:
        if t.error:
            continue
        if t.target_id in first_line:
            t.error = (f"{path}:{t.line}: duplicate target id (first defined at line "
                       f"{first_line[t.target_id]})")
            continue
        first_line[t.target_id] = t.line
        t.file_name = safe_name(t.target_id)
        key = t.file_name.casefold()
        if key in name_owner:
            t.error = (f"{path}:{t.line}: file name '{t.file_name}' collides with that of target "
                       f"'{printable(name_owner[key])}'")
            t.file_name = ""
            continue
        name_owner[key] = t.target_id


def clean_sequence(raw: str, *, max_length: int, max_unknown_fraction: float) -> str:
    """Validated upper-case one-letter sequence (unknown letters kept as given, e.g. 'B'),
    or InputError(field='sequence') saying what is wrong and where."""
    seq = "".join(ch for ch in raw if ch not in _ASCII_WS)
    if not seq:
        raise InputError("empty sequence", field="sequence")
    for pos, ch in enumerate(seq, 1):
        if not ch.isascii() or ch.upper() not in _ASCII_LETTERS:
            what = "gap character" if ch in "-." else "character"
            raise InputError(f"invalid {what} '{printable(ch)}' (U+{ord(ch):04X}) at position "
                             f"{pos}; expected one-letter amino-acid codes", field="sequence")
    seq = seq.upper()
    if len(seq) > max_length:
        raise InputError(f"length {len(seq)} exceeds the configured limit {max_length} "
                         "(--max-length)", field="sequence")
    unknown = sum(1 for ch in seq if ch not in RESTYPES)
    if unknown / len(seq) > max_unknown_fraction:
        raise InputError(f"{unknown} of {len(seq)} residues are unknown (not one of the 20 "
                         f"standard amino acids); at most {max_unknown_fraction:.0%} allowed",
                         field="sequence")
    return seq


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def find_msa_files(msa_dir: Path | None, file_name: str) -> list[Path]:
    """MSA files of a target: `DIR/<file_name>.<ext>` and every MSA file in `DIR/<file_name>/`
    (several database searches of one chain, merged). Only the sanitised name is used, so a
    target id can never point the lookup outside DIR. A matching name that is not a readable
    regular file (FIFO, device, permission denied) is an InputError for this target: its MSA
    must never silently go missing."""
    if msa_dir is None or not file_name:
        return []
    found = [msa_dir / f"{file_name}{ext}" for ext in MSA_EXTENSIONS
             if os.path.lexists(msa_dir / f"{file_name}{ext}")]
    sub = msa_dir / file_name
    if sub.is_dir():
        try:
            found += sorted(p for p in sub.iterdir() if p.name.lower().endswith(MSA_EXTENSIONS))
        except OSError:
            raise InputError("cannot list the target's MSA folder (permission denied?)",
                             path=sub) from None
    for p in found:
        check_readable(p)
    return found


def load_msa(files: list[Path]) -> Msa | None:
    """Parse (and merge, AF2-style) the target's MSA files; None when there are none. Each file
    is read once and parsed from the bytes read, whose sha256s are the Msa's `file_sha256`
    (the predictor checks them against the prediction's identity). Any failure (including a
    reader's internal error) is one InputError naming the file."""
    if not files:
        return None
    msas, digests = [], []
    for f in files:
        raw = read_raw(f)
        digests.append(hashlib.sha256(raw).hexdigest())
        try:
            msas.append(parse_msa(f, raw=raw))
        except InputError:
            raise
        except MemoryError:
            raise InputError("out of memory while reading this MSA", path=f) from None
        except Exception:   # noqa: BLE001  (a library bug must reject this target only)
            raise InputError("could not be read as an MSA: the reader failed on its content "
                             "(malformed or unsupported file)", path=f) from None
    msa = msas[0] if len(msas) == 1 else merge_msas(msas)
    msa.file_sha256 = digests
    return msa
