"""HDF5 store of complexes for fine-tuning (docs/store_format.md, "Complex store"): each complex
of an assembly mmCIF / PDB file, every chain with its own MSA placed on its query, its atom37
ground truth and AlphaFold-Multimer's chain ids (AF-Multimer supplement §2.1 / AlphaFold v2.3.2
`pipeline_multimer.add_assembly_features`): `entity_id` numbers distinct sequences by first
appearance (1-based), `sym_id` numbers the copies of one entity (1-based), `asym_id` the chains
in the manifest's order (1-based).

A separate file kind beside the monomer family store (`protdp.data.store`, whose format is
unchanged): the root attribute `store_kind` = "complexes" and `complex_format_version`; the
monomer reader refuses it by its missing `format_version`, this reader refuses a monomer store
by name.

    /complexes/<complex_id>            attrs: chain_ids (JSON), resolution, source_files (JSON),
                                              source_sha256 (JSON), length, num_chains
    /complexes/<complex_id>/<k>        one group per chain, k = 0..n-1 in asym order;
        msa uint8 [N, L], deletion_matrix uint8 [N, L], residue_index int32 [L],
        all_atom_positions float32 [L, 37, 3], all_atom_mask uint8 [L, 37]
        attrs: chain_id, sequence, asym_id, entity_id, sym_id, msa_files (JSON)
    /index/complex_id, /index/length (int32, residues of all chains)

The manifest is a TSV with the header `complex_id  structure_file  chain  msa_file`, one row per
chain (`msa_file` "-" = the chain's sequence alone; several files comma-separated are merged);
relative paths are read from the manifest's folder. A complex whose file or chain cannot be
read, whose MSA does not fit its chain, with fewer than 2 or more than MAX_CHAINS chains, or
whose manifest rows are bad (a short row, a line that is not UTF-8, a second structure file
for one complex id) is one line naming it, the file and line, and the build goes on; a bad row
without a readable complex id is its own line.

Crash safety (as `protdp data build`): under an exclusive lock `.<name>.lock` (a second build
of the same store is one line), the store is written as `.<name>.building` beside the target,
every complex is read back against its `content_sha256` (sha256 of its chains' arrays), the
file is fsynced and renamed into place. A build killed at any moment (kill -9) leaves the
previous store or none, never a half one; the next build deletes the leftover `.building`
file and starts over. An existing target is replaced only if it is a complex store and `force`
is given; anything else (another file, a link to one, a folder, a device) is one line naming it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.atoms import read_structure
from protdp.data.bounds import dataset_problem, file_bytes
from protdp.data.parse import merge_msas, pair_msa_structure, parse_msa, parse_structure
from protdp.data.residues import sequence_to_ids
from protdp.errors import InputError
from protdp.fileio import commit_file, sha256_file
from protdp.complex.inputs import MAX_CHAINS
from protdp.complex.store_checks import chain_value_problems, complex_header_problems

STORE_KIND = "complexes"
COMPLEX_FORMAT_VERSION = 1
MANIFEST_COLUMNS = ("complex_id", "structure_file", "chain", "msa_file")
NO_MSA = "-"
CHAIN_ARRAYS = ("msa", "deletion_matrix", "residue_index", "all_atom_positions", "all_atom_mask")
BUILDING_SUFFIX = ".building"


@dataclass
class ComplexSpec:
    complex_id: str
    structure_file: Path
    chains: list[tuple[str, list[Path]]] = field(default_factory=list)   # (chain, MSA files)
    line: int = 0
    error: str | None = None           # a manifest problem of this complex (it is rejected)


@dataclass
class ComplexBuildReport:
    path: Path
    built: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)      # one line per bad complex

    def summary(self) -> str:
        return (f"{self.path}: {len(self.built)} complexes stored, {len(self.rejected)} "
                f"rejected")


def _manifest_lines(path: Path) -> list[tuple[int, str, str | None]]:
    """(line number, text, why it is not UTF-8 or None) of every line; an unreadable or binary
    (NUL byte) file is one InputError (a stray non-UTF-8 byte spoils only its own line; CR, CRLF
    and LF all end a line)."""
    from protdp.data.safeio import read_bytes

    data = read_bytes(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(f"not a text file: NUL byte at offset {nul} (binary data)", path=path,
                         line=data.count(b"\n", 0, nul) + 1)
    out = []
    data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            out.append((n, raw.decode("utf-8"), None))
        except UnicodeDecodeError as exc:
            out.append((n, raw.decode("utf-8", errors="replace"),
                        f"not UTF-8: byte 0x{raw[exc.start]:02X} at column {exc.start + 1}"))
    return out


def read_manifest(path: str | Path) -> tuple[list[ComplexSpec], list[str]]:
    """The TSV manifest -> (complexes in first-appearance order, lines naming rows that belong
    to no complex). A bad row (wrong field count, empty field, not UTF-8, a second structure
    file for one complex id, a complex id seen before other complexes' rows) rejects its
    complex with the line number; the rest is read. An
    unreadable file or a wrong header is an InputError."""
    path = Path(path)
    try:
        lines = _manifest_lines(path)
    except OSError as exc:
        raise InputError(f"cannot read the manifest ({type(exc).__name__})", path=path) from None
    header = lines[0][1].split("\t") if lines else []
    if not lines or lines[0][2] or tuple(c.strip() for c in header) != MANIFEST_COLUMNS:
        raise InputError(f"line 1: the header must be {' '.join(MANIFEST_COLUMNS)} "
                         "(tab-separated)", path=path)
    root, specs, orphans, previous = path.parent, {}, [], None
    for n, text, undecodable in lines[1:]:
        row = text.split("\t")
        if not any(c.strip() for c in row):
            continue
        cid = row[0].strip()
        problem = undecodable
        if problem is None and (len(row) != len(MANIFEST_COLUMNS)
                                or not all(c.strip() for c in row)):
            problem = (f"expected {len(MANIFEST_COLUMNS)} non-empty tab-separated fields, "
                       f"got {row!r:.200}")
        if problem is not None and (not cid or undecodable and "\ufffd" in cid):
            orphans.append(f"rejected row (manifest line {n}): {path}:{n}: {problem}")
            continue
        struct = row[1].strip() if len(row) > 1 else ""
        if problem is None and cid in specs and cid != previous:
            problem = (f"complex {cid} again after other complexes (first at line "
                       f"{specs[cid].line}); a complex's rows are consecutive: two complexes "
                       "with one id?")
        previous = cid
        spec = specs.setdefault(cid, ComplexSpec(cid, root / struct, line=n))
        if problem is None and spec.structure_file != root / struct:
            problem = (f"complex {cid} names a second structure file {struct!r} (first: "
                       f"{spec.structure_file}, line {spec.line}); two complexes with one id?")
        if problem is not None:
            spec.error = spec.error or f"{path}:{n}: {problem}"
            continue
        chain, msas = row[2].strip(), row[3].strip()
        files = [] if msas == NO_MSA else [root / m.strip() for m in msas.split(",")]
        spec.chains.append((chain, files))
    return list(specs.values()), orphans


def _chain_record(spec: ComplexSpec, chain_id: str, msa_files: list[Path], data) -> dict:
    """One chain on its MSA query: arrays of CHAIN_ARRAYS + sequence (InputError if unfit)."""
    chain = parse_structure(spec.structure_file, chain_id, data=data)
    if not msa_files:
        query = chain.sequence
        tokens = sequence_to_ids(query)[None].astype(np.uint8)
        dels = np.zeros_like(tokens)
        pos, mask, ridx = chain.all_atom_positions, chain.all_atom_mask, chain.residue_index
    else:
        msa = merge_msas([parse_msa(f) for f in msa_files])
        paired = pair_msa_structure(msa.query, chain, str(msa_files[0]), str(spec.structure_file))
        query, tokens = msa.query, msa.tokens()
        dels = np.minimum(msa.deletion_matrix, 255)
        pos, mask, ridx = paired.all_atom_positions, paired.all_atom_mask, paired.residue_index
    if not len(query):
        raise InputError(f"chain {chain_id}: empty sequence", path=spec.structure_file)
    if not np.asarray(mask)[:, 1].any():
        raise InputError(f"chain {chain_id}: no resolved Cα", path=spec.structure_file)
    return {"sequence": query, "chain_id": chain_id, "resolution": chain.resolution,
            "msa_files": [str(f) for f in msa_files],
            "msa": np.asarray(tokens, np.uint8), "deletion_matrix": np.asarray(dels, np.uint8),
            "residue_index": np.asarray(ridx, np.int32),
            "all_atom_positions": np.where(np.asarray(mask)[..., None], pos, 0).astype(np.float32),
            "all_atom_mask": np.asarray(mask, np.uint8)}


def assembly_ids(sequences: list[str]) -> list[tuple[int, int, int]]:
    """(asym_id, entity_id, sym_id) per chain, in input order (module docstring)."""
    entity_of: dict[str, int] = {}
    copies: dict[int, int] = {}
    out = []
    for asym, s in enumerate(sequences, 1):
        e = entity_of.setdefault(s, len(entity_of) + 1)
        copies[e] = copies.get(e, 0) + 1
        out.append((asym, e, copies[e]))
    return out


def complex_records(spec: ComplexSpec) -> list[dict]:
    """Every chain of one complex with its ids; InputError naming the complex and chain."""
    if not 2 <= len(spec.chains) <= MAX_CHAINS:
        raise InputError(f"complex {spec.complex_id}: {len(spec.chains)} chain(s); a complex "
                         f"for training has 2 to {MAX_CHAINS}", path=spec.structure_file)
    names = [c for c, _ in spec.chains]
    if len(set(names)) != len(names):
        raise InputError(f"complex {spec.complex_id}: a chain is listed twice ({names})",
                         path=spec.structure_file)
    data = read_structure(spec.structure_file)
    chains = []
    for chain_id, files in spec.chains:
        try:
            chains.append(_chain_record(spec, chain_id, files, data))
        except InputError as exc:
            raise InputError(f"complex {spec.complex_id} chain {chain_id}: {exc.reason}",
                             path=exc.path or spec.structure_file) from None
    for rec, (asym, entity, sym) in zip(chains, assembly_ids([c["sequence"] for c in chains])):
        rec.update(asym_id=asym, entity_id=entity, sym_id=sym)
    return chains


def content_sha256(chains: list[dict]) -> str:
    """sha256 over every chain's CHAIN_ARRAYS (dtype, shape, bytes) in asym order."""
    h = hashlib.sha256()
    for c in chains:
        for name in CHAIN_ARRAYS:
            a = np.ascontiguousarray(c[name])
            h.update(f"{name}:{a.dtype.str}:{a.shape}\n".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _write_complex(h5, spec: ComplexSpec, chains: list[dict]) -> None:
    g = h5.create_group(f"complexes/{spec.complex_id}")
    files = sorted({str(spec.structure_file)} | {f for c in chains for f in c["msa_files"]})
    g.attrs.update(chain_ids=json.dumps([c["chain_id"] for c in chains]),
                   resolution=float(chains[0]["resolution"]), source_files=json.dumps(files),
                   source_sha256=json.dumps([sha256_file(f) for f in files]),
                   length=int(sum(len(c["sequence"]) for c in chains)), num_chains=len(chains),
                   content_sha256=content_sha256(chains))
    for k, c in enumerate(chains):
        cg = g.create_group(str(k))
        for name in CHAIN_ARRAYS:
            cg.create_dataset(name, data=c[name], compression="gzip", compression_opts=1)
        cg.attrs.update(chain_id=c["chain_id"], sequence=c["sequence"], asym_id=c["asym_id"],
                        entity_id=c["entity_id"], sym_id=c["sym_id"],
                        msa_files=json.dumps(c["msa_files"]))


def is_complex_store(path: str | Path) -> bool:
    import h5py

    try:
        with h5py.File(path, "r") as h5:
            return h5.attrs.get("store_kind") == STORE_KIND
    except (OSError, ValueError):
        return False


class _BuildLock:
    """Exclusive flock on `.<store>.lock` beside the store (released when the process dies,
    kill -9 included)."""

    def __init__(self, out: Path):
        self.out, self.path = out, out.with_name(f".{out.name}.lock")

    def __enter__(self):
        try:                            # a link planted as the lock is never followed
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                         0o644)
        except OSError as exc:
            raise InputError(f"cannot open the build lock {self.path.name} ({exc.strerror}; "
                             "a link or not a regular file?)", path=self.out) from None
        self.fh = os.fdopen(fd, "a")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise InputError(f"another `protdp complex store` is writing this store (lock "
                             f"{self.path.name} is held)", path=self.out) from None
        return self

    def __exit__(self, *exc):
        self.fh.close()


def _check_target(out: Path, force: bool) -> None:
    """The target may be created, or replaced with `force` when it is a complex store (a
    regular file, links not followed: a link is never replaced nor written through)."""
    if os.path.lexists(out):
        if os.path.islink(out):
            raise InputError("is a symbolic link; a complex store is never written through "
                             "or over a link (give a plain path)", path=out)
        if not (force and out.is_file() and is_complex_store(out)):
            raise InputError("exists (give --force to replace a complex store; anything else "
                             "is never replaced)", path=out)
    if not out.parent.is_dir():
        raise InputError("the store's folder does not exist", path=out.parent)


def verify_complex_store(path: str | Path) -> list[str]:
    """Every complex of the store checked from its headers, then its values and content_sha256,
    and the index (`protdp.complex.store_checks`): the problems found, one line each (empty:
    the store is whole)."""
    import h5py

    problems = []
    try:
        with h5py.File(path, "r") as h5:
            ids, lengths = read_complex_index(h5, path)
            if sorted(ids) != sorted(h5["complexes"].keys()):
                problems.append("the index does not list exactly the stored complexes")
            size = file_bytes(path)
            for cid, length in zip(ids, lengths):
                problems += _complex_problems(h5, cid, int(length), size)
    except InputError as exc:
        problems.append(exc.reason)
    except (KeyError, OSError, ValueError, TypeError) as exc:
        problems.append(f"not a readable complex store ({type(exc).__name__})")
    return problems


def verify_complex_report(path: str | Path):
    """`protdp data verify` of a complex store: a `protdp.data.store.VerifyReport` (its
    "families" are the complexes)."""
    import h5py

    from protdp.data.store import VerifyReport
    report = VerifyReport(str(path), problems=verify_complex_store(path))
    try:
        with h5py.File(path, "r") as h5:
            report.families = len(read_complex_index(h5, path)[0])
    except (InputError, KeyError, OSError, ValueError, TypeError):
        pass
    return report


def _complex_problems(h5, cid: str, length: int, size: int) -> list[str]:
    try:
        g = h5["complexes"][cid]
        found = complex_header_problems(g, cid, size)
        if found:
            return found
        chains = [_read_chain(g[str(k)]) for k in range(int(g.attrs["num_chains"]))]
        found = [p for k, c in enumerate(chains)
                 for p in chain_value_problems(c, f"complex {cid} chain {k}")]
        if content_sha256(chains) != g.attrs.get("content_sha256"):
            found.append(f"complex {cid}: arrays differ from content_sha256")
        if int(g.attrs["length"]) != length:
            found.append(f"complex {cid}: index length {length} differs from the complex's")
        return found
    except (KeyError, OSError, ValueError, TypeError) as exc:
        return [f"complex {cid}: unreadable ({type(exc).__name__})"]


def _read_chain(cg) -> dict:
    rec = {name: cg[name][()] for name in CHAIN_ARRAYS}
    rec["sequence"] = str(cg.attrs["sequence"])
    return rec


def read_complex_index(h5, path) -> tuple[list[str], np.ndarray]:
    """/index as (complex ids, lengths): sizes from the headers first; the two arrays must
    agree in length and name each complex once."""
    idx, size = h5["index"], file_bytes(path)
    for name in ("complex_id", "length"):
        problem = dataset_problem(idx[name], size, f"index/{name}")
        if problem:
            raise InputError(problem, path=path)
    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in idx["complex_id"][()]]
    lengths = np.asarray(idx["length"][()], np.int64)
    if lengths.ndim != 1 or len(ids) != len(lengths) or len(set(ids)) != len(ids):
        raise InputError(f"the index arrays disagree (complex_id {len(ids)}, length "
                         f"{lengths.shape}, {len(set(ids))} distinct ids); rebuild the store "
                         "with `protdp complex store`", path=path)
    return ids, lengths


def build_complex_store(manifest: str | Path, out: str | Path, force: bool = False,
                        log=print) -> ComplexBuildReport:
    """Manifest -> complex store at `out` (module docstring: crash safety)."""
    import h5py

    out = Path(out)
    _check_target(out, force)
    specs, orphans = read_manifest(manifest)
    report = ComplexBuildReport(out)
    for line in orphans:
        report.rejected.append(line)
        log(line)
    tmp = out.with_name(f".{out.name}{BUILDING_SUFFIX}")
    with _BuildLock(out):
        _check_target(out, force)              # again, under the lock
        tmp.unlink(missing_ok=True)            # left by a killed build: ours by name
        try:
            with h5py.File(tmp, "w") as h5:
                h5.attrs.update(store_kind=STORE_KIND,
                                complex_format_version=COMPLEX_FORMAT_VERSION)
                h5.create_group("complexes")
                for spec in specs:
                    try:
                        if spec.error:
                            raise InputError(spec.error)
                        _write_complex(h5, spec, complex_records(spec))
                        report.built.append(spec.complex_id)
                    except Exception as exc:   # noqa: BLE001  (per-complex isolation)
                        if isinstance(exc, OSError) and spec.complex_id in h5["complexes"]:
                            raise                   # the store itself failed to write
                        why = str(exc) if isinstance(exc, InputError) else \
                            f"{spec.structure_file}: {type(exc).__name__}: {exc}"
                        line = f"rejected {spec.complex_id} (manifest line {spec.line}): {why}"
                        report.rejected.append(line)
                        log(line)
                ids = sorted(report.built)
                idx = h5.create_group("index")
                idx.create_dataset("complex_id", data=np.array(ids, dtype=h5py.string_dtype()))
                idx.create_dataset("length", data=np.array(
                    [h5["complexes"][i].attrs["length"] for i in ids], np.int32))
            problems = verify_complex_store(tmp)
            if problems:
                raise InputError(f"the new store failed verification ({problems[0]}); the "
                                 "previous store is unchanged", path=out)
            commit_file(tmp, out)
        except OSError as exc:           # h5py: disk full, quota, I/O error while writing
            raise InputError(f"cannot write the new store ({type(exc).__name__}: {exc}); the "
                             "previous store is unchanged", path=out) from None
        finally:
            tmp.unlink(missing_ok=True)
    return report


class ComplexStore:
    """Reader: `complex_ids`, `length(cid)` (residues), `read(cid)` -> {"complex_id",
    "resolution", "chains": [per-chain dict of CHAIN_ARRAYS + ids + sequence]}."""

    def __init__(self, path: str | Path):
        import h5py

        self.path = Path(path)
        self._size = file_bytes(self.path)      # a read-only store: its size, stat'ed once
        self._hashed: set[str] = set()          # complexes whose content hash was checked here
        if not self.path.is_file():
            raise InputError("complex store not found", path=self.path)
        try:
            with h5py.File(self.path, "r") as h5:
                kind, version = h5.attrs.get("store_kind"), h5.attrs.get("complex_format_version")
                if kind != STORE_KIND:
                    raise InputError("not a complex store (build one with `protdp complex "
                                     "store --manifest complexes.tsv --out complexes.h5`)",
                                     path=self.path)
                if version is None or int(version) != COMPLEX_FORMAT_VERSION:
                    raise InputError(f"complex store format version {version!r}; this protdp "
                                     f"reads {COMPLEX_FORMAT_VERSION}", path=self.path)
                ids, lengths = read_complex_index(h5, self.path)
                self._lengths = dict(zip(ids, (int(n) for n in lengths)))
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise InputError(f"not a readable HDF5 file ({exc})", path=self.path) from None
        self.complex_ids = ids
        self.family_ids = ids              # the trainer's name for the examples of a store

    def __len__(self) -> int:
        return len(self.complex_ids)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def length(self, complex_id: str) -> int:
        return self._lengths[complex_id]

    def read(self, complex_id: str) -> dict:
        import h5py

        try:
            with h5py.File(self.path, "r") as h5:
                g = h5["complexes"][complex_id]
                problems = complex_header_problems(g, complex_id, self._size)
                chains = []
                for k in range(0 if problems else int(g.attrs["num_chains"])):
                    cg = g[str(k)]
                    rec = {name: cg[name][()] for name in CHAIN_ARRAYS}
                    rec.update({a: cg.attrs[a] for a in ("chain_id", "sequence")})
                    rec.update({a: int(cg.attrs[a]) for a in ("asym_id", "entity_id", "sym_id")})
                    problems += chain_value_problems(rec, f"complex {complex_id} chain {k}")
                    chains.append(rec)
                resolution = float(g.attrs["resolution"])
                if not problems and complex_id not in self._hashed:   # once per process
                    if content_sha256(chains) != g.attrs.get("content_sha256"):
                        problems = [f"complex {complex_id}: arrays differ from content_sha256"]
                    else:
                        self._hashed.add(complex_id)
        except (KeyError, OSError, ValueError, TypeError) as exc:
            raise InputError(f"complex {complex_id!r} cannot be read ({type(exc).__name__}); "
                             f"check it with `protdp data verify {self.path}`",
                             path=self.path) from None
        if problems:               # featurizing it would train on garbage or crash later
            raise InputError(f"{problems[0]}; check the store with `protdp data verify "
                             f"{self.path}`", path=self.path)
        return {"complex_id": complex_id, "resolution": resolution, "chains": chains}
