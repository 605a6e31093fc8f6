"""An item's files: stored as its prediction folder plus bare names, served only from there.

At enqueue, `split_paths` turns the predictor's paths into one absolute folder and bare file
names (no separators, no `..`; files of one prediction must share a folder). At serve time
`read_item_file` resolves the folder and the file after following every link and refuses
anything outside the folder, anything but a regular file, a name that does not fit its kind
(`*.pdb`, `*.cif`, `scores.json`, `provenance.json`; other kinds .pdb/.cif/.json), a folder
that is relative or not normalised, and (when the server is given `files_roots`) a folder
outside those roots. The file is opened with O_NOFOLLOW and checked again with fstat, so a link swapped in
after the check is not followed either.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from protdp.errors import InputError
from protdp.review.hygiene import CODE_RE

CONTENT_TYPES = {".pdb": "chemical/x-pdb", ".cif": "chemical/x-mmcif",
                 ".json": "application/json"}
IMPLICIT_FILES = {"scores": "scores.json", "provenance": "provenance.json"}
STRUCTURE_KINDS = ("pdb", "cif")       # the viewer loads the first one present
MAX_FILE_BYTES = 256 * 2**20
MAX_STRUCTURE_BYTES = 20 * 2**20       # served to the 3D view (a 58 MB PDB froze a tab for
                                       # minutes); the server's --max-structure-mb changes it


def _bare_name(name: str) -> bool:
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and "\x00" not in name and len(name) <= 255)


def _name_fits_kind(kind: str, name: str) -> bool:
    """scores/provenance have fixed names; pdb/cif their extension; others .pdb/.cif/.json."""
    suffix = Path(name).suffix.lower()
    if kind in IMPLICIT_FILES:
        return name == IMPLICIT_FILES[kind]
    if kind in STRUCTURE_KINDS:
        return suffix == f".{kind}"
    return suffix in CONTENT_TYPES


def split_paths(paths: dict) -> tuple[str | None, dict[str, str]]:
    """(folder, {kind: bare name}) from {kind: path}; every file must be in one folder."""
    if not isinstance(paths, dict):
        raise InputError("must be a dict of kind -> file path", field="paths")
    folders, names = set(), {}
    for kind, path in paths.items():
        if not isinstance(kind, str) or not CODE_RE.match(kind):
            raise InputError(f"file kind {str(kind)[:40]!r} must be a lowercase identifier",
                             field="paths")
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
        if not text or "\x00" in text:
            raise InputError(f"path of '{kind}' must be a non-empty path without NUL",
                             field="paths")
        p = Path(os.path.abspath(text))
        if not _bare_name(p.name):
            raise InputError(f"path of '{kind}' has no file name", field="paths")
        folders.add(str(p.parent))
        names[kind] = p.name
    if len(folders) > 1:
        raise InputError(f"files of one prediction must share one folder, got {sorted(folders)}",
                         field="paths")
    return (folders.pop() if folders else None), names


def item_files(item: dict) -> dict[str, str]:
    """kind -> name for an item: its stored files plus scores.json/provenance.json."""
    files = dict(item.get("paths") or {})
    if item.get("folder"):
        for kind, name in IMPLICIT_FILES.items():
            files.setdefault(kind, name)
    return files


def resolve_item_file(item: dict, kind: str, files_roots: list[Path] | None = None
                      ) -> Path | None:
    """The real path of the item's `kind` file, or None when it must not be served."""
    name = item_files(item).get(kind)
    folder = item.get("folder")
    if not name or not isinstance(folder, str) or not _bare_name(name) \
            or not os.path.isabs(folder) or os.path.normpath(folder) != folder \
            or ".." in Path(folder).parts or not _name_fits_kind(kind, name):
        return None
    try:
        root = Path(folder).resolve(strict=True)
        target = (root / name).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    if target.parent != root or target.suffix.lower() not in CONTENT_TYPES:
        return None
    if files_roots is not None and not any(root.is_relative_to(r) for r in files_roots):
        return None
    return target if target.is_file() else None


def oversized(path: Path | None, kind: str, max_structure_bytes: int) -> int | None:
    """The size of a structure file above the served limit, else None."""
    if path is None or kind not in STRUCTURE_KINDS:
        return None
    size = path.stat().st_size
    return size if size > max_structure_bytes else None


def read_item_file(item: dict, kind: str, files_roots: list[Path] | None = None,
                   max_structure_bytes: int = MAX_STRUCTURE_BYTES
                   ) -> tuple[bytes, str, str] | None:
    """(content, content type, file name) of a servable file, else None (also a structure
    file over `max_structure_bytes`)."""
    target = resolve_item_file(item, kind, files_roots)
    if target is None or oversized(target, kind, max_structure_bytes):
        return None
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return None
        data = fh.read(MAX_FILE_BYTES + 1)
    return data, CONTENT_TYPES[target.suffix.lower()], target.name
