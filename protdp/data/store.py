"""HDF5 family store, format version 2 (docs/store_format.md is the contract): write, read,
verify.

`/families/<family_id>` holds `msa` (uint8 [N_seq, L] AF2 token ids), `deletion_matrix`
(uint8 [N_seq, L]), `residue_index` (int32 [L]), `all_atom_positions` (float32 [L, 37, 3], Å,
AF2 atom37 order), `all_atom_mask` (uint8 [L, 37]) and `between_segment_residues` (uint8 [L]),
plus attributes (`sequence`, `resolution`, `source_files`, `source_sha256`, `content_sha256`,
...). `/index/{family_id,length,num_seq}` lists every family so readers need not walk the
groups. `FamilyStore.read` also derives the v1 backbone view (`backbone_positions` [L, 5, 3],
`backbone_mask` [L, 5]: N, CA, C, O, CB; virtual CB for glycine) so older code keeps working.

Compatibility rule: `format_version` is checked on every open. An older store is refused with
the command that rebuilds it; a newer or unknown version is refused (never read silently).
Readers ignore datasets and attributes they do not know; a change of meaning bumps the version.

Building (`protdp.data.build.build_store`, re-exported here) writes a temporary file beside the
target and renames it into place only after `verify_store` passed, so a killed build leaves the
previous store untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.atoms import COORD_LIMIT, backbone_from_atom37
from protdp.data.bounds import (MAX_MSA_ROWS, MAX_RESIDUES, MAX_TEMPLATES, dataset_problem,
                                file_bytes)
from protdp.data.residue_constants import NUM_ATOM37
from protdp.data.residues import GAP_ID, sequence_to_ids
from protdp.errors import InputError
from protdp.fileio import sha256_file  # noqa: F401  (re-exported)

FORMAT_VERSION = 2
REBUILD_COMMAND = ("protdp data build --pairs PAIRS.tsv --out {path} --force "
                   "(or --msa-dir/--structure-dir instead of --pairs)")
# gzip (readable by any HDF5 tool). Level 1 without byte shuffling: coordinates' mantissas are
# noise, so shuffle and higher levels cost time and save nothing (benchmarks/store_scale.py)
_COMPRESSION = dict(compression="gzip", compression_opts=1)
MSA_CHUNK_ROWS = 512


def family_array_specs(n_seq: int, length: int) -> dict[str, tuple[np.dtype, tuple]]:
    """The arrays of one family in store v2: name -> (dtype, shape). Hash and check order."""
    return {"msa": (np.dtype(np.uint8), (n_seq, length)),
            "deletion_matrix": (np.dtype(np.uint8), (n_seq, length)),
            "residue_index": (np.dtype(np.int32), (length,)),
            "all_atom_positions": (np.dtype(np.float32), (length, NUM_ATOM37, 3)),
            "all_atom_mask": (np.dtype(np.uint8), (length, NUM_ATOM37)),
            "between_segment_residues": (np.dtype(np.uint8), (length,))}


FAMILY_ARRAYS = tuple(family_array_specs(1, 1))


def content_sha256(arrays: dict) -> str:
    """sha256 over every family array (name, dtype, shape, bytes; fixed order): what an
    incremental rebuild and `verify_store` compare against the `content_sha256` attribute."""
    h = hashlib.sha256()
    for name in FAMILY_ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- versioning

def check_format_version(attrs, path: str | Path) -> int:
    """The store's format version if this protdp reads it; otherwise one clear InputError
    (an older store names the command that rebuilds it; newer/unknown ones are refused)."""
    raw = attrs.get("format_version")
    if raw is None:
        raise InputError("not a protdp family store (no format_version attribute); build one "
                         f"with: {REBUILD_COMMAND.format(path=path)}", path=path)
    try:
        if isinstance(raw, (str, bytes, bool, np.bool_)):    # "2" is not version 2 (issue 47)
            raise TypeError
        version = int(raw)
        if version != float(raw):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"unknown store format_version {raw!r}; refusing to read it (this "
                         f"protdp reads version {FORMAT_VERSION})", path=path) from None
    if version < FORMAT_VERSION:
        raise InputError(f"store format version {version} is older than the version "
                         f"{FORMAT_VERSION} this protdp reads (v2 adds all-atom positions); "
                         f"rebuild it: {REBUILD_COMMAND.format(path=path)}", path=path)
    if version > FORMAT_VERSION:
        raise InputError(f"store format version {version} is newer than this protdp "
                         f"understands ({FORMAT_VERSION}); upgrade protdp or rebuild the store "
                         f"with this version", path=path)
    return version


# ----------------------------------------------------------------------------------- write

def new_store_file(path: str | Path, filter_config: str, source_root: str):
    """Create an empty v2 store (h5py.File, mode w). HDF5 >= 1.10 object formats: single-chunk
    datasets need no B-tree, which makes a family ~20 % smaller (benchmarks/store_scale.py)."""
    import h5py
    h5 = h5py.File(path, "w", libver=("v110", "latest"))
    h5.attrs["format_version"] = FORMAT_VERSION
    h5.attrs["filter_config"] = filter_config
    h5.attrs["source_root"] = source_root
    h5.create_group("families")
    return h5


def write_family(h5, fam: dict, source_files: list[str], source_sha256: list[str],
                 file_rejects: list) -> str:
    """Write one family group (replacing a group of that id); returns its content hash."""
    grp_path = f"families/{fam['family_id']}"
    if grp_path in h5:
        del h5[grp_path]
    g = h5.create_group(grp_path)
    n, L = fam["msa"].shape
    rows = max(1, min(n, MSA_CHUNK_ROWS))
    for name, (dtype, shape) in family_array_specs(n, L).items():
        data = np.asarray(fam[name], dtype)
        if data.shape != shape:
            raise ValueError(f"family {fam['family_id']}: {name} has shape {data.shape}, "
                             f"expected {shape}")
        if name in ("msa", "deletion_matrix"):
            g.create_dataset(name, data=data, chunks=(rows, max(L, 1)), **_COMPRESSION)
        elif name in ("all_atom_positions", "all_atom_mask"):
            g.create_dataset(name, data=data, **_COMPRESSION)
        else:
            g.create_dataset(name, data=data)
    digest = content_sha256(fam)
    g.attrs["sequence"] = fam["sequence"]
    g.attrs["resolution"] = float(fam["resolution"])
    g.attrs["source_files"] = list(source_files)
    g.attrs["source_sha256"] = list(source_sha256)
    g.attrs["content_sha256"] = digest
    g.attrs["chain"] = fam["chain"]
    g.attrs["length"] = L
    g.attrs["num_seq"] = n
    g.attrs["observed_residues"] = int(np.asarray(fam["all_atom_mask"])[:, 1].sum())
    g.attrs["placement"] = fam.get("placement", "")
    g.attrs["warnings"] = json.dumps(fam.get("warnings", []))
    g.attrs["pairing"] = json.dumps(fam.get("pairing", {}))
    g.attrs["dropped_atoms"] = int(fam.get("dropped_atoms", 0))
    g.attrs["file_rejects"] = json.dumps(file_rejects)
    return digest


def write_index(h5) -> None:
    import h5py
    fams = h5.require_group("families")
    ids = sorted(fams.keys())
    if "index" in h5:
        del h5["index"]
    idx = h5.create_group("index")
    idx.create_dataset("family_id", data=np.array(ids, dtype=object), dtype=h5py.string_dtype())
    idx.create_dataset("length", data=np.array([fams[i].attrs["length"] for i in ids], np.int32))
    idx.create_dataset("num_seq", data=np.array([fams[i].attrs["num_seq"] for i in ids],
                                                np.int32))


def read_arrays(g) -> dict:
    """The v2 arrays of one family group (numpy)."""
    return {k: g[k][()] for k in FAMILY_ARRAYS}


def header_problems(g, fid: str, file_size: int) -> list[str]:
    """What one family group declares, checked from the HDF5 headers alone before any array is
    read (issue 47): num_seq / length within protdp.data.bounds and at least 1, every array's
    dtype and shape as `family_array_specs`, and no array declaring more bytes than the file
    can hold (`bounds.dataset_problem`) - a 278 KB file declaring 20 GB costs no memory."""
    try:
        n, L = int(g.attrs["num_seq"]), int(g.attrs["length"])
    except H5_ERRORS:
        return [f"{fid}: num_seq / length attributes missing or unreadable"]
    if not (1 <= n <= MAX_MSA_ROWS and 1 <= L <= MAX_RESIDUES):
        return [f"{fid}: num_seq {n} / length {L} outside [1, {MAX_MSA_ROWS}] / "
                f"[1, {MAX_RESIDUES}] (an empty family or a declared size beyond "
                "protdp.data.bounds)"]
    out = []
    for name, (dtype, shape) in family_array_specs(n, L).items():
        try:
            ds = g[name]
            got = (ds.dtype, tuple(ds.shape or ()))
        except H5_ERRORS + (AttributeError,):
            out.append(f"{fid}: {name} missing or unreadable (damaged data)")
            continue
        if got != (dtype, shape):
            out.append(f"{fid}: {name} is {got[0]} {got[1]}, expected {dtype} {shape}")
            continue
        problem = dataset_problem(ds, file_size, f"{fid}: {name}")
        if problem:
            out.append(problem)
    if not out and "templates" in g:
        out += template_header_problems(g["templates"], fid, L, file_size)
    return out


# the datasets of a family's templates group that are checked, and so the only ones read
TEMPLATE_DATASETS = ("aatype", "all_atom_positions", "all_atom_mask", "domain_names")


def template_header_problems(t, fid: str, L: int, file_size: int) -> list[str]:
    """The optional templates group (protdp.templates.training layout) from its headers."""
    want = {"aatype": (L,), "all_atom_positions": (L, NUM_ATOM37, 3),
            "all_atom_mask": (L, NUM_ATOM37), "domain_names": ()}     # TEMPLATE_DATASETS
    out, count = [], None
    for name, tail in want.items():
        try:
            shape = tuple(t[name].shape or ())
        except H5_ERRORS + (AttributeError,):
            return [f"{fid}: templates/{name} missing or unreadable"]
        if len(shape) != 1 + len(tail) or shape[1:] != tail or \
                (count is not None and shape[0] != count):
            return [f"{fid}: templates/{name} has shape {shape}, expected [T, "
                    f"{', '.join(map(str, tail))}]".replace(", ]", "]")]
        count = shape[0]
        problem = dataset_problem(t[name], file_size, f"{fid}: templates/{name}")
        if problem:
            out.append(problem)
    if not out and not 0 <= count <= MAX_TEMPLATES:
        out.append(f"{fid}: {count} templates (at most {MAX_TEMPLATES}, protdp.data.bounds)")
    return out


def template_value_problems(stored: dict, fid: str) -> list[str]:
    """Finite, in-range template coordinates and 0/1 masks (what add-to-store checks)."""
    pos, mask = stored["all_atom_positions"], stored["all_atom_mask"]
    if not np.isfinite(pos).all() or (np.abs(pos) > COORD_LIMIT).any():
        return [f"{fid}: templates/all_atom_positions holds NaN/Inf or |x| > {COORD_LIMIT}"]
    if (mask > 1).any() or (stored["aatype"] < 0).any() or (stored["aatype"] > GAP_ID).any():
        return [f"{fid}: templates/all_atom_mask is not 0/1 or aatype out of range"]
    return []


# ------------------------------------------------------------------------------------ read

H5_ERRORS = (KeyError, OSError, RuntimeError, ValueError, TypeError)   # h5py on damaged files


def damaged(path: str | Path, what: str = "its metadata") -> InputError:
    return InputError(f"the store is damaged: {what} cannot be read; check it with `protdp "
                      f"data verify {path}` or rebuild it: {REBUILD_COMMAND.format(path=path)}",
                      path=path)


def store_attrs(h5, path: str | Path) -> dict:
    """Root attributes of an open store, format version checked."""
    try:
        attrs = dict(h5.attrs)
    except H5_ERRORS:
        raise damaged(path) from None
    check_format_version(attrs, path)
    return attrs


def open_store_h5(path: Path):
    """h5py.File opened read-only, with unreadable files turned into one clear line."""
    import h5py
    if Path(path).is_dir():
        raise InputError("a directory, not a store file (the HDF5 file `protdp data build "
                         "--out` wrote)", path=path)
    try:
        return h5py.File(path, "r")
    except (OSError, ValueError):
        pass
    try:
        hdf5 = h5py.is_hdf5(path)
    except (OSError, ValueError):
        hdf5 = True                    # unreadable: say so below, as before
    if not hdf5:   # another file given as the store: no rebuild hint, whose --force replaces it
        raise InputError("cannot open the store: not an HDF5 file (a store is the file "
                         "`protdp data build --out` writes; was another file given?)", path=path)
    raise InputError("cannot open the store: damaged or unreadable; "
                     f"rebuild it with: {REBUILD_COMMAND.format(path=path)}", path=path)


def read_index(h5, path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """/index as (family ids, lengths int64 [F], num_seqs int64 [F]); sizes checked from the
    headers first, and the three arrays must agree in length (a family must never drop out
    of training unseen) and hold no family id twice."""
    idx, size = h5["index"], file_bytes(path)
    for name in ("family_id", "length", "num_seq"):
        problem = dataset_problem(idx[name], size, f"index/{name}")
        if problem:
            raise InputError(problem, path=path)
    ids = [x.decode() if isinstance(x, bytes) else str(x) for x in idx["family_id"][()]]
    lengths = np.asarray(idx["length"][()], np.int64)                  # [F]
    num_seqs = np.asarray(idx["num_seq"][()], np.int64)                # [F]
    if not len(ids) == len(lengths) == len(num_seqs) or len(set(ids)) != len(ids) or \
            lengths.ndim != 1 or num_seqs.ndim != 1:
        raise InputError(f"the index arrays disagree (family_id {len(ids)}, length "
                         f"{lengths.shape}, num_seq {num_seqs.shape}, {len(set(ids))} distinct "
                         "ids); check it with `protdp data verify` or rebuild it: "
                         f"{REBUILD_COMMAND.format(path=path)}", path=path)
    return ids, lengths, num_seqs


class FamilyStore:
    """Read-only view of a built store; the HDF5 handle is opened lazily in each process
    (safe with DataLoader workers and several ranks reading the same file)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise InputError("store not found (build it with `protdp data build`)",
                             path=self.path)
        self._h5 = None
        self._pid = None
        self._size = file_bytes(self.path)      # a read-only store: its size, stat'ed once
        self._checked: set[str] = set()         # families whose headers were checked here
        with open_store_h5(self.path) as h5:
            self.attrs = store_attrs(h5, self.path)
            self.format_version = int(self.attrs["format_version"])
            try:
                self.family_ids, self.lengths, self.num_seqs = read_index(h5, self.path)
            except H5_ERRORS:
                raise InputError("not a complete protdp family store (no readable /index); "
                                 "rebuild it "
                                 f"with: {REBUILD_COMMAND.format(path=self.path)}",
                                 path=self.path) from None
        self._pos = {f: i for i, f in enumerate(self.family_ids)}

    def __len__(self) -> int:
        return len(self.family_ids)

    def __contains__(self, family_id: str) -> bool:
        return family_id in self._pos

    def length(self, family_id: str) -> int:
        return int(self.lengths[self._pos[family_id]])

    def _file(self):
        if self._h5 is None or self._pid != os.getpid():
            self._h5 = open_store_h5(self.path)
            self._pid = os.getpid()
        return self._h5

    def read(self, family_id: str) -> dict:
        """Arrays (numpy) and attributes of one family, plus 'family_id' and the derived
        'backbone_positions' float32 [L, 5, 3] / 'backbone_mask' uint8 [L, 5]."""
        if family_id not in self._pos:
            raise InputError(f"family '{family_id}' is not in the store", path=self.path)
        try:
            g = self._file()["families"][family_id]
            problems = [] if family_id in self._checked else [
                f"family '{family_id}': {p.split(': ', 1)[1]}"
                for p in header_problems(g, family_id, self._size)]
            if not problems:                      # sizes checked before anything is read
                self._checked.add(family_id)      # (once per family and process: read-only)
                out = read_arrays(g)
                attrs = dict(g.attrs)
                if "templates" in g:  # optional template hits (docs/store_format.md, issue 31)
                    out["templates"] = {k: g["templates"][k][()]      # only the checked ones
                                        for k in TEMPLATE_DATASETS if k in g["templates"]}
                    problems = template_value_problems(out["templates"], family_id)
        except H5_ERRORS:
            raise InputError(f"family '{family_id}' cannot be read (damaged store?); check it "
                             f"with `protdp data verify {self.path}`", path=self.path) from None
        problems = problems or read_problems(out, attrs, family_id)
        if problems:                 # featurizing it would train on garbage or crash later
            raise InputError(f"{problems[0]}; the store is damaged or was not written by "
                             f"`protdp data build` (check it with `protdp data verify "
                             f"{self.path}`)", path=self.path)
        for k, v in attrs.items():
            out[k] = v.tolist() if isinstance(v, np.ndarray) else v
        out["resolution"] = float(out["resolution"])
        out["family_id"] = family_id
        out["backbone_positions"], out["backbone_mask"] = backbone_from_atom37(
            str(out["sequence"]), out["all_atom_positions"], out["all_atom_mask"])
        return out

    def close(self) -> None:
        if self._h5 is not None and self._pid == os.getpid():
            self._h5.close()
        self._h5 = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_h5"], state["_pid"] = None, None
        return state

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------- verify

@dataclass
class VerifyReport:
    """`verify_store` outcome: families read and every problem found (one line each)."""
    path: str
    families: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (f"store {self.path}: {self.families} families read, "
                f"{len(self.problems)} problem(s)")
        shown = self.problems[:50]
        more = len(self.problems) - len(shown)
        return "\n".join([head] + [f"  {p}" for p in shown] +
                         ([f"  ... and {more} more"] if more else []))


def read_problems(arrays: dict, attrs: dict, fid: str) -> list[str]:
    """Problems of one family as read for training: shapes and dtypes against its num_seq /
    length attributes, then `value_problems` (no content hash: that is `verify`'s)."""
    try:
        n, L = int(attrs["num_seq"]), int(attrs["length"])
    except (KeyError, TypeError, ValueError):
        return [f"family '{fid}': num_seq / length attributes missing"]
    out = []
    for name, (dtype, shape) in family_array_specs(n, L).items():
        a = arrays.get(name)
        if a is None:
            out.append(f"family '{fid}': {name} missing")
        elif a.dtype != dtype or a.shape != shape:
            out.append(f"family '{fid}': {name} is {a.dtype} {a.shape}, expected {dtype} {shape}")
    return out or [f"family '{fid}': {p.split(': ', 1)[1]}"
                   for p in value_problems(arrays, attrs, fid, n, L)]


def family_problems(g, fid: str, file_size: int | None = None) -> list[str]:
    """Everything wrong with one family group (empty list = sound); sizes from the headers
    first (`header_problems`), so nothing oversized is ever read."""
    try:
        attrs = dict(g.attrs)
        n, L = int(attrs["num_seq"]), int(attrs["length"])
    except H5_ERRORS:
        return [f"{fid}: attributes missing or unreadable"]
    templates = []
    if file_size is not None:
        out = header_problems(g, fid, file_size)
        if out:
            return out
        if "templates" in g:
            t = g["templates"]
            templates = template_value_problems(
                {k: t[k][()] for k in ("aatype", "all_atom_positions", "all_atom_mask")}, fid)
    out = []
    arrays = {}
    for name, (dtype, shape) in family_array_specs(n, L).items():
        try:
            a = g[name][()]
        except H5_ERRORS:
            out.append(f"{fid}: {name} missing or unreadable (damaged data)")
            continue
        if a.dtype != dtype or a.shape != shape:
            out.append(f"{fid}: {name} is {a.dtype} {a.shape}, expected {dtype} {shape}")
        arrays[name] = a
    if out:
        return out
    if content_sha256(arrays) != attrs.get("content_sha256"):
        out.append(f"{fid}: content hash differs from content_sha256 (data changed or damaged)")
    return out + value_problems(arrays, attrs, fid, n, L) + templates


def value_problems(arrays: dict, attrs: dict, fid: str, n: int, L: int) -> list[str]:
    """Coordinates finite and in range, masks 0/1, residue_index increasing, MSA token ids in
    range and row 0 the sequence (what `verify` and every training read check)."""
    out = []
    pos, mask = arrays["all_atom_positions"], arrays["all_atom_mask"]
    if not np.isfinite(pos).all() or (np.abs(pos) > COORD_LIMIT).any():
        out.append(f"{fid}: non-finite or absurd (|x| > {COORD_LIMIT}) coordinates")
    if (mask > 1).any() or (pos[mask == 0] != 0).any():
        out.append(f"{fid}: all_atom_mask is not 0/1 or a masked atom has coordinates")
    if L and (np.diff(arrays["residue_index"].astype(np.int64)) <= 0).any():
        out.append(f"{fid}: residue_index is not strictly increasing")
    if (arrays["msa"] > GAP_ID).any():
        out.append(f"{fid}: msa holds token ids above {GAP_ID}")
    elif n and not np.array_equal(arrays["msa"][0], sequence_to_ids(str(attrs.get("sequence")))):
        out.append(f"{fid}: msa row 0 is not the family's sequence")
    return out


def _check_families(path: str, items: list[tuple[str, int, int]]) -> list[str]:
    """Problems of the families `items` ((id, index length, index num_seq)) of the store at
    `path`."""
    problems = []
    size = file_bytes(path)
    with open_store_h5(Path(path)) as h5:
        for fid, L, n in items:
            try:
                g = h5["families"][fid]
                found = family_problems(g, fid, size)
                if not found and (int(g.attrs["length"]), int(g.attrs["num_seq"])) != (L, n):
                    found = [f"{fid}: index length/num_seq {L}/{n} differ from the family's "
                             f"{int(g.attrs['length'])}/{int(g.attrs['num_seq'])}"]
            except H5_ERRORS:
                found = [f"{fid}: group missing or unreadable (damaged metadata)"]
            problems += found
    return problems


def verify_store(path: str | Path, workers: int = 1) -> VerifyReport:
    """Open a store (format version checked), compare the index with the groups and read and
    check every family (content hash, dtypes, shapes, finite coordinates, masks); `workers`
    processes read disjoint parts of the family list."""
    path = Path(path)
    report = VerifyReport(str(path))
    if not path.exists():
        raise InputError("store not found", path=path)
    with open_store_h5(path) as h5:
        store_attrs(h5, path)
        try:
            ids, lengths, num_seqs = read_index(h5, path)
            groups = set(h5["families"].keys())
        except InputError as exc:
            report.problems.append(exc.reason)
            return report
        except H5_ERRORS:
            report.problems.append("index or families group missing or unreadable")
            return report
    if sorted(ids) != sorted(groups):
        report.problems.append(f"index lists {len(ids)} families, the file holds "
                               f"{len(groups)} (missing: {sorted(set(ids) - groups)[:5]}, "
                               f"unlisted: {sorted(groups - set(ids))[:5]})")
    items = [(f, int(L), int(n)) for f, L, n in zip(ids, lengths, num_seqs) if f in groups]
    report.families = len(items)
    if workers <= 1 or len(items) < 2 * workers:
        report.problems += _check_families(str(path), items)
        return report
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    parts = [items[k::workers] for k in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
        for found in pool.map(_check_families, [str(path)] * workers, parts):
            report.problems += found
    return report


_REEXPORTED = {"build_store": "build", "BuildReport": "build", "process_family": "families",
               "FamilySpec": "discover", "discover_by_name": "discover",
               "read_pairs": "discover"}


def __getattr__(name: str):
    """`from protdp.data.store import build_store` keeps working (v1 callers); resolved lazily
    because protdp.data.build imports this module."""
    if name in _REEXPORTED:
        import importlib
        return getattr(importlib.import_module(f"protdp.data.{_REEXPORTED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
