"""What a store build reads: a pairs TSV, or folders paired by file name, with every file seen
accounted for (used, rejected later, or skipped here with a reason).

A bad pairs row (no structure file, a family id paired with two structures) is a rejected item
naming the TSV line, never the end of the build; only an unreadable TSV or one without the
required columns stops it. Folder discovery looks at every entry: regular files with an MSA or
structure extension (optionally `.gz`) are inputs; directories, FIFOs, devices, broken links,
hidden files and unknown extensions are skipped with the reason; two files of the same entry
(`4hhb.cif`, `4hhb.pdb`) keep the mmCIF one (it carries `label_seq_id` and `_entity_poly_seq`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from protdp.data.atoms import STRUCTURE_FORMATS
from protdp.data.parse import MSA_EXTENSIONS
from protdp.data.safeio import os_reason, read_text, split_suffix
from protdp.errors import InputError

# preferred first when one entry comes in several formats
STRUCTURE_PREFERENCE = (".cif", ".mmcif", ".pdb", ".ent")


@dataclass
class FamilySpec:
    """What one family is built from (paths absolute). chain None = every protein chain."""
    family_id: str | None
    msa_files: list[str]
    structure_file: str | None
    chain: str | None = ""

    def files(self) -> list[str]:
        return list(self.msa_files) + ([self.structure_file] if self.structure_file else [])


@dataclass
class Inputs:
    """Specs to build plus the items refused before any parsing."""
    specs: list[FamilySpec]
    root: Path                                        # source_files are relative to this
    skipped: list[tuple[str, str]] = field(default_factory=list)    # (path, reason)
    bad_rows: list[tuple[int, str, str | None]] = field(default_factory=list)  # line, why, fid


def is_mmcif(path: str | None) -> bool:
    return path is not None and STRUCTURE_FORMATS.get(split_suffix(path)[1]) == "cif"


def read_pairs(pairs: str | Path) -> Inputs:
    """PAIRS TSV (columns msa_file, structure_file, chain; optional pair_id; paths relative to
    the TSV) -> one FamilySpec per pair_id (or structure_file + chain); MSAs are merged."""
    pairs = Path(pairs)
    lines = read_text(pairs).splitlines()
    need = {"msa_file", "structure_file", "chain"}
    # plain tab splitting, no csv quoting: a stray '"' or a 200 KB cell is a cell, not a
    # csv error traceback, and line numbers stay file line numbers across blank lines
    header = lines[0].split("\t") if lines else []
    if not need <= set(header):
        has = f"has {header}" if lines else "the file is empty"
        raise InputError(f"pairs TSV needs tab-separated columns {sorted(need)}, {has}",
                         path=pairs, line=1)
    out = Inputs([], pairs.resolve().parent)
    groups: dict[tuple, FamilySpec] = {}
    for lineno, line in enumerate(lines[1:], 2):
        cells = line.split("\t")
        row = dict(zip(header, cells))          # a missing trailing cell reads as empty
        if not any(v.strip() for v in cells):
            continue                                           # blank line
        struct_cell = (row.get("structure_file") or "").strip()
        if not struct_cell:
            out.bad_rows.append((lineno, "empty structure_file", row.get("pair_id")))
            continue
        struct = str((pairs.parent / struct_cell).resolve())
        chain = (row.get("chain") or "").strip()
        fid = (row.get("pair_id") or "").strip() or \
            f"{split_suffix(struct)[0].split('.')[0]}_{chain}"
        key = (fid, struct, chain)
        clash = next((k for k in groups if k[0] == fid and k != key), None)
        if clash is not None:
            out.bad_rows.append((lineno, f"family '{fid}' is already paired with "
                                         f"{Path(clash[1]).name} chain {clash[2]!r}; this row "
                                         f"names {Path(struct).name} chain {chain!r} (give each "
                                         f"its own pair_id)", fid))
            continue
        spec = groups.setdefault(key, FamilySpec(fid, [], struct, chain))
        msa_cell = (row.get("msa_file") or "").strip()
        if msa_cell:
            spec.msa_files.append(str((pairs.parent / msa_cell).resolve()))
    out.specs = list(groups.values())
    return out


def _classify(entry: os.DirEntry, structures_too: bool, msas_too: bool) -> tuple[str, str]:
    """('msa' | 'structure' | 'skip', reason) for one folder entry (symlinks followed)."""
    if entry.name.startswith("."):
        return "skip", "hidden file"
    try:
        mode = os.stat(entry.path).st_mode
    except OSError:
        return "skip", "broken symbolic link or unreadable entry"
    if stat.S_ISDIR(mode):
        return "skip", "a directory (discovery does not descend into folders)"
    if not stat.S_ISREG(mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "not a regular file"
        return "skip", f"{kind}; only regular files are read"
    ext = split_suffix(entry.name)[1]
    if msas_too and ext in MSA_EXTENSIONS:
        return "msa", ""
    if structures_too and ext in STRUCTURE_FORMATS:
        return "structure", ""
    known = sorted(MSA_EXTENSIONS if msas_too else ()) + \
        sorted(STRUCTURE_FORMATS if structures_too else ())
    return "skip", f"unknown extension '{ext}' (expected one of {known}, optionally .gz)"


def _scan(folders: dict[str, Path]) -> tuple[list[Path], list[Path], list[tuple[str, str]]]:
    msas, structs, skipped = [], [], []
    for folder in sorted({p.resolve() for p in folders.values()}):
        roles = {k for k, v in folders.items() if v.resolve() == folder}
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"cannot list the folder: {os_reason(exc)}", path=folder) from None
        for e in entries:
            path = Path(e.path)                   # absolute: the folder was resolved
            kind, why = _classify(e, "structure" in roles, "msa" in roles)
            if kind == "msa":
                msas.append(path)
            elif kind == "structure":
                structs.append(path)
            else:
                skipped.append((str(path), why))
    return msas, structs, skipped


def _by_stem(structs: list[Path], skipped: list) -> dict[str, Path]:
    """Entry name -> preferred structure file (mmCIF over PDB, plain over .gz)."""
    rank = lambda p: (STRUCTURE_PREFERENCE.index(split_suffix(p)[1]), p.name.endswith(".gz"))
    by: dict[str, Path] = {}
    for p in sorted(structs, key=rank):
        stem = split_suffix(p)[0].split(".")[0].lower()
        if stem in by:
            skipped.append((str(p), f"same entry as {by[stem].name} (mmCIF preferred over PDB, "
                                    f"plain over .gz)"))
        else:
            by[stem] = p
    return by


def discover_by_name(msa_dir: str | Path | None, structure_dir: str | Path | None) -> Inputs:
    """Pair `<pdb>_<chain>.*.a3m|sto|...` with `<pdb>.cif|pdb` (or `<pdb>_<chain>.pdb`) by name.
    Structures without an MSA become specs without MSA (one family per protein chain, kept
    only with allow_single_sequence); MSAs without a structure become specs without structure
    (rejected with a reason); every other entry is skipped with a reason."""
    folders = {k: Path(v) for k, v in (("msa", msa_dir), ("structure", structure_dir)) if v}
    for p in folders.values():
        if not p.is_dir():
            raise InputError("not a folder (give --msa-dir / --structure-dir folders)", path=p)
    msas, structs, skipped = _scan(folders)
    by_stem = _by_stem(structs, skipped)
    specs: dict[str, FamilySpec] = {}
    used = set()
    for m in msas:
        name = split_suffix(m)[0].split(".")[0]
        pdb, _, chain = name.rpartition("_") if "_" in name else (name, "", "")
        cands = [name.lower(), pdb.lower(), f"{pdb.lower()}-assembly1"]
        struct = next((by_stem[c] for c in cands if c in by_stem), None)
        spec = specs.setdefault(name, FamilySpec(name, [], str(struct) if struct else None,
                                                 chain))
        spec.msa_files.append(str(m))
        if struct is not None:
            used.add(struct)
    for s in by_stem.values():
        if s not in used:
            specs[f"structure:{s.name}"] = FamilySpec(None, [], str(s), None)
    dirs = [p.resolve() for p in folders.values()]
    root = Path(os.path.commonpath(dirs)) if len(dirs) > 1 else dirs[0]
    return Inputs(list(specs.values()), root, skipped)
