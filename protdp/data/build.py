"""`protdp data build`: raw files -> HDF5 family store v2, crash-safe, incremental, accounted.

Workers run the map step (`protdp.data.families.process_family`: parse + pair + filter one
family, never raising: every problem becomes a reject record); the build process is the single
writer. The build writes a temporary file beside the target
(`.<name>.building`), copies the families it can keep from the previous store (only after
re-hashing their arrays against `content_sha256`), writes the new ones, verifies the whole file
(`protdp.data.store.verify_store`) and renames it into place: a build killed at any moment
leaves the previous store, never a mixture. A lock file beside the store stops two builds.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import multiprocessing as mp
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from protdp.data.discover import FamilySpec, Inputs, discover_by_name, is_mmcif, read_pairs
from protdp.data.families import process_family, reject_record, run_specs  # noqa: F401
from protdp.data.filters import FILTER_NAMES, INPUT_RULES, FilterConfig, load_screening
from protdp.data.safeio import atomic_write_text, sha256_file, writable_output
from protdp.fileio import commit_file
from protdp.data.store import (H5_ERRORS, check_format_version, content_sha256, new_store_file,
                               open_store_h5, read_arrays, verify_store, write_family,
                               write_index)
from protdp.errors import InputError

# ------------------------------------------------------------------------------ report

@dataclass
class BuildReport:
    """Outcome of `build_store`: counts that must add up, per-rule rejections, timings."""
    out: str
    rejects_path: str
    input_files: int = 0
    accepted_files: int = 0
    rejected_files: int = 0
    skipped_files: int = 0
    candidate_families: int = 0
    accepted_families: int = 0
    rejected_families: int = 0
    written: int = 0
    unchanged: int = 0
    rebuilt_damaged: int = 0
    removed: int = 0
    families_with_warnings: int = 0
    dropped_atoms: int = 0
    upgraded_from_version: int | None = None
    rejected_by_rule: dict = field(default_factory=dict)        # families, by rule
    rejected_files_by_rule: dict = field(default_factory=dict)  # files and skips, by rule
    seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def balanced(self) -> bool:
        """Every input file and candidate family is accounted for exactly once."""
        return (self.input_files == self.accepted_files + self.rejected_files +
                self.skipped_files and
                self.candidate_families == self.accepted_families + self.rejected_families)

    def summary(self) -> str:
        rules = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected_by_rule.items()) if v)
        file_rules = ", ".join(f"{k}={v}" for k, v in
                               sorted(self.rejected_files_by_rule.items()) if v)
        upgraded = (f"\nupgraded from store format version {self.upgraded_from_version}: "
                    f"every family rebuilt" if self.upgraded_from_version else "")
        return (f"store {self.out}: {self.accepted_families} families "
                f"({self.written} written, {self.unchanged} unchanged, {self.rebuilt_damaged} "
                f"damaged and rebuilt, {self.removed} removed) in {self.seconds:.1f}s "
                f"(verify {self.verify_seconds:.1f}s){upgraded}\n"
                f"files:    inputs {self.input_files} = accepted {self.accepted_files} + "
                f"rejected {self.rejected_files} + skipped {self.skipped_files}  "
                f"[{'ok' if self.balanced else 'MISMATCH'}]\n"
                f"families: candidates {self.candidate_families} = accepted "
                f"{self.accepted_families} + rejected {self.rejected_families}\n"
                f"warnings: {self.families_with_warnings} families stored with warnings, "
                f"{self.dropped_atoms} invalid atom records dropped\n"
                f"rejections by rule: {rules or 'none'}\n"
                f"file rejections by rule: {file_rules or 'none'}\n"
                f"rejects report: {self.rejects_path}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["balanced"] = self.balanced
        return d


# ------------------------------------------------------------------------------ writer

def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def _inputs(pairs, msa_dir, structure_dir) -> Inputs:
    if pairs is not None:
        return read_pairs(pairs)
    if msa_dir or structure_dir:
        return discover_by_name(msa_dir, structure_dir)
    raise InputError("nothing to build: give --pairs or --msa-dir/--structure-dir")


def _open_previous(out: Path, force: bool, cfg_json: str):
    """(previous store for incremental reuse or None, its version if it is older, its family
    ids). None when absent, forced, older or built with another filter config. A file that is
    not HDF5 or a newer store is never replaced; a damaged store only with --force."""
    if not out.exists():
        return None, None, set()
    h5 = open_store_h5(out)
    try:
        attrs = dict(h5.attrs)
        ids = set(h5["families"].keys()) if "families" in h5 else set()
    except H5_ERRORS:
        h5.close()
        if force:
            return None, None, set()
        raise InputError("refusing to replace it: the existing store is damaged (its metadata "
                         "cannot be read); pass --force to rebuild it from scratch",
                         path=out) from None
    try:
        check_format_version(attrs, out)
    except InputError as exc:
        raw = attrs.get("format_version")
        h5.close()
        if raw is not None and "older" in exc.reason:
            return None, int(raw), ids                 # upgrade: rebuild every family
        raise InputError(f"refusing to replace it: {exc.reason}", path=out) from None
    if force or attrs.get("filter_config") != cfg_json:
        h5.close()
        return None, None, ids
    return h5, None, ids


class _Lock:
    """Exclusive lock on `.<store>.lock` beside the store (released when the process dies)."""

    def __init__(self, out: Path):
        self.path = out.with_name(f".{out.name}.lock")

    def __enter__(self):
        self.fh = open(self.path, "a")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise InputError("another `protdp data build` is writing this store (lock "
                             f"{self.path.name} is held)", path=self.path.parent) from None
        return self

    def __exit__(self, *exc):
        self.fh.close()


@dataclass
class _State:
    """Bookkeeping of one build while the temporary store is written."""
    h5: object
    root: Path
    hashes: dict
    cfg: FilterConfig
    rejects: list = field(default_factory=list)
    status: dict = field(default_factory=dict)      # family id -> written|unchanged|rebuilt
    files: dict = field(default_factory=dict)       # family id -> files it uses
    structure: dict = field(default_factory=dict)   # family id -> structure file
    owner: dict = field(default_factory=dict)       # query sequence -> family id
    damaged: set = field(default_factory=set)       # unchanged sources, arrays damaged
    with_warnings: int = 0
    dropped_atoms: int = 0

    def priority(self, fid: str) -> tuple:
        return (0 if is_mmcif(self.structure.get(fid)) else 1, fid)

    def drop(self, fid: str) -> None:
        del self.h5["families"][fid]
        for d in (self.status, self.files, self.structure):
            d.pop(fid, None)

    def claim(self, fid: str, seq: str, structure: str | None) -> bool:
        """Duplicate-chain rule: True if `fid` may be stored (an earlier holder of the same
        query may be dropped: mmCIF over PDB, then the first id)."""
        self.structure[fid] = structure
        if not self.cfg.deduplicate_chains or seq not in self.owner or self.owner[seq] == fid:
            self.owner[seq] = fid
            return True
        other = self.owner[seq]
        keep, drop = sorted([other, fid], key=self.priority)
        why = "; mmCIF preferred over PDB" if self.priority(keep)[0] < self.priority(drop)[0] \
            else ""
        self.rejects.append(reject_record("family", self.structure.get(drop),
                                    f"exact duplicate of family '{keep}' (same {len(seq)}-"
                                    f"residue query{why})", drop, rule="duplicate_chain"))
        if drop == fid:
            self.structure.pop(fid, None)
            return False
        self.drop(other)
        self.owner[seq] = fid
        return True


def _reusable(st: _State, fams, s: FamilySpec):
    """(old group, intact) when the spec's sources are unchanged, else (None, False)."""
    files = s.files()
    try:
        g = fams.get(s.family_id) if s.family_id and s.chain is not None else None
        if g is None or not all(f in st.hashes for f in files) or \
                list(g.attrs.get("source_files", [])) != [_rel(f, st.root) for f in files] or \
                list(g.attrs.get("source_sha256", [])) != [st.hashes[f] for f in files]:
            return None, False
    except H5_ERRORS:
        return None, False                 # unreadable metadata: rebuilt like a new family
    try:
        return g, content_sha256(read_arrays(g)) == g.attrs.get("content_sha256")
    except H5_ERRORS:
        return g, False


def _keep_unchanged(st: _State, old, specs: list[FamilySpec]) -> list[FamilySpec]:
    """Copy the families whose sources are unchanged and whose arrays still hash to their
    content_sha256; return the specs that must be (re)built."""
    todo = []
    fams = old["families"] if old is not None and "families" in old else {}
    for s in specs:
        g, intact = _reusable(st, fams, s)
        if g is None or not intact:
            if g is not None:
                st.damaged.add(s.family_id)           # rebuilt below; counted as such
            todo.append(s)
            continue
        if not st.claim(s.family_id, str(g.attrs["sequence"]), s.structure_file):
            continue
        old.copy(g, st.h5["families"], name=s.family_id)
        st.status[s.family_id] = "unchanged"
        prior = json.loads(g.attrs.get("file_rejects", "[]"))
        st.rejects.extend(prior)
        st.files[s.family_id] = set(s.files()) - {r["file"] for r in prior}
        st.with_warnings += bool(json.loads(g.attrs.get("warnings", "[]")))
        st.dropped_atoms += int(g.attrs.get("dropped_atoms", 0))
    return todo


def _accept(st: _State, res: dict) -> None:
    file_rejects = [r for r in res["rejects"] if r["kind"] == "file"]
    st.rejects.extend(res["rejects"])
    for fam in sorted(res["families"], key=lambda f: f["family_id"]):
        fid = fam["family_id"]
        if st.status.get(fid) in ("written", "unchanged", "rebuilt"):
            st.rejects.append(reject_record("family", fam["structure_file"], f"family id '{fid}' "
                                      f"is produced twice (another input has the same id)",
                                      fid, rule="duplicate_chain"))
            continue
        if not st.claim(fid, fam["sequence"], fam["structure_file"]):
            continue
        files = list(fam["msa_files"]) + [fam["structure_file"]]
        write_family(st.h5, fam, [_rel(f, st.root) for f in files],
                     [st.hashes.get(f) or sha256_file(f) for f in files], file_rejects)
        st.status[fid] = "rebuilt" if fid in st.damaged else "written"
        st.files[fid] = set(files)
        st.with_warnings += bool(fam["warnings"])
        st.dropped_atoms += fam["dropped_atoms"]


def _hash_inputs(files: list[str]) -> dict[str, str]:
    hashes = {}
    for f in files:
        try:
            hashes[f] = sha256_file(f)
        except InputError:
            pass                 # unreadable: its parse reports why (one record, not two)
    return hashes


class _WriteFailures:
    """While the new store is written: h5py reports a failed flush while freeing its handles as
    an "Exception ignored" traceback on stderr, not as an exception. Catch those (the build
    then fails with one line) instead of letting them print."""

    def __enter__(self):
        self.failed = False
        self.hooks = sys.unraisablehook, sys.excepthook   # Cython prints through both
        sys.unraisablehook, sys.excepthook = self._unraisable, self._except
        return self

    def _unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, (OSError, RuntimeError)):   # HDF5 write errors
            self.failed = True
        else:
            self.hooks[0](unraisable)

    def _except(self, kind, value, tb) -> None:
        if isinstance(value, (OSError, RuntimeError)):
            self.failed = True
        else:
            self.hooks[1](kind, value, tb)

    def __exit__(self, *exc):
        import gc
        gc.collect()                                 # free failed handles while we listen
        sys.unraisablehook, sys.excepthook = self.hooks


def build_store(out: str | Path, *, pairs: str | Path | None = None,
                msa_dir: str | Path | None = None, structure_dir: str | Path | None = None,
                config: FilterConfig | str | Path | dict | None = None, workers: int = 1,
                rejects_path: str | Path | None = None, progress: bool = True,
                force: bool = False) -> BuildReport:
    """Build or update the store at `out` (see the module docstring). Families whose source
    files (sha256), spec, filter config and stored arrays are unchanged are copied unless
    `force`. Rejects go to `rejects_path` (default: rejects.jsonl beside `out`).

    The build runs in a child process: HDF5 crashes the interpreter when a write fails (a full
    disk segfaults h5py), and the caller must still get one clear line, the previous store
    untouched."""
    kwargs = dict(pairs=pairs, msa_dir=msa_dir, structure_dir=structure_dir, config=config,
                  workers=workers, rejects_path=rejects_path, progress=progress, force=force)
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_build_child, args=(send, out, kwargs))
    child.start()
    send.close()
    try:
        kind, value = receive.recv()
    except EOFError:
        child.join()
        code = child.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        raise InputError(f"the build process died ({how}) while writing the new store (disk "
                         f"full, or an HDF5 error); the previous store is unchanged",
                         path=out) from None
    finally:
        receive.close()
    child.join()
    if kind == "bug":
        raise RuntimeError(f"protdp data build failed with an internal error:\n{value}")
    if kind == "error":
        raise value
    return value


def _build_child(send, out, kwargs) -> None:
    """Child side of `build_store`: run the build, send back ('ok', report), ('error',
    ProtdpError) or ('bug', traceback text). Dies with its parent (PR_SET_PDEATHSIG)."""
    import traceback

    from protdp.errors import ProtdpError
    _die_with_parent()
    try:
        message = ("ok", _build(out, **kwargs))
    except ProtdpError as exc:
        message = ("error", exc)
    except Exception:       # noqa: BLE001  (re-raised in the parent with its traceback)
        message = ("bug", traceback.format_exc())
    send.send(message)
    send.close()


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


def _build(out: str | Path, *, pairs, msa_dir, structure_dir, config, workers, rejects_path,
           progress, force) -> BuildReport:
    """The build itself (in the child process of `build_store`)."""
    from tqdm import tqdm

    t0 = time.time()
    cfg = FilterConfig.load(config)
    out = writable_output(out, "store", "hdf5", force=force, inputs=(pairs,))
    rejects_path = writable_output(rejects_path or out.parent / "rejects.jsonl",
                                   "rejects report", "jsonl", force=force, inputs=(pairs, out))
    inputs = _inputs(pairs, msa_dir, structure_dir)
    screen = load_screening(cfg)
    cfg_json = json.dumps(dataclasses.asdict(cfg), sort_keys=True)
    report = BuildReport(str(out), str(rejects_path))
    all_files = sorted({f for s in inputs.specs for f in s.files()})
    tmp = out.with_name(f".{out.name}.building")
    with _Lock(out):
        old, report.upgraded_from_version, previous = _open_previous(out, force, cfg_json)
        tmp.unlink(missing_ok=True)                      # left by a killed build
        try:
            with _WriteFailures() as quiet:
                st = _State(new_store_file(tmp, cfg_json, str(inputs.root)), inputs.root,
                            _hash_inputs(all_files), cfg)
                try:
                    todo = _keep_unchanged(st, old, inputs.specs)
                    for _, res in tqdm(run_specs(todo, cfg, screen, workers), total=len(todo),
                                       desc="build", disable=not progress):
                        _accept(st, res)
                    write_index(st.h5)
                finally:
                    st.h5.close()
            if quiet.failed:
                raise OSError("flush failed")
        except OSError:                 # h5py: disk full, quota, I/O error while writing
            tmp.unlink(missing_ok=True)
            raise InputError("cannot write the new store (disk full or an I/O error in its "
                             "folder); the previous store is unchanged", path=out) from None
        finally:
            if old is not None:
                old.close()
        t1 = time.time()
        check = verify_store(tmp, workers=workers)
        report.verify_seconds = time.time() - t1
        if not check.ok:
            tmp.unlink(missing_ok=True)
            raise InputError(f"the new store failed verification ({check.problems[0]}); the "
                             f"previous store is unchanged", path=out)
        _account(report, st, inputs, all_files)
        atomic_write_text(rejects_path, "".join(json.dumps(r) + "\n" for r in st.rejects))
        commit_file(tmp, out)
    report.removed = len(previous - set(st.status))
    report.seconds = time.time() - t0
    return report


def _account(report: BuildReport, st: _State, inputs: Inputs, all_files: list[str]) -> None:
    """Every file gets accepted (feeds a kept family), a file record (its own error or why its
    family was rejected) or a skip record; every candidate family is kept or rejected."""
    for line, why, fid in inputs.bad_rows:
        st.rejects.append(reject_record("family", None, f"pairs row: {why}", fid, line, "parse"))
    for path, why in inputs.skipped:
        st.rejects.append(reject_record("skipped", path, why, rule="skipped"))
    used = set().union(*st.files.values()) if st.files else set()
    recorded = {r["file"] for r in st.rejects if r["kind"] == "file"}
    fam_rejects = [r for r in st.rejects if r["kind"] == "family"]
    for f in all_files:
        if f in used or f in recorded:
            continue
        fids = {s.family_id for s in inputs.specs if f in s.files()}
        why = [r["reason"] for r in fam_rejects if r["file"] == f] or \
              [f"its family '{r['family_id']}' was rejected: {r['reason']}" for r in fam_rejects
               if r["family_id"] in fids and r["family_id"] is not None]
        st.rejects.append(reject_record("file", f, why[0] if why else "not used by any family"))
    rejected = {r["file"] for r in st.rejects if r["kind"] == "file"} - used
    report.input_files = len(all_files) + len(inputs.skipped)
    report.accepted_files = len(used & set(all_files))
    report.rejected_files = len(rejected & set(all_files))
    report.skipped_files = len(inputs.skipped)
    report.accepted_families = len(st.status)
    report.rejected_families = len(fam_rejects)
    report.candidate_families = report.accepted_families + report.rejected_families
    report.written = sum(v == "written" for v in st.status.values())
    report.unchanged = sum(v == "unchanged" for v in st.status.values())
    report.rebuilt_damaged = sum(v == "rebuilt" for v in st.status.values())
    report.families_with_warnings = st.with_warnings
    report.dropped_atoms = st.dropped_atoms
    counts = Counter(r["rule"] for r in fam_rejects)
    report.rejected_by_rule = {name: counts.get(name, 0) for name in FILTER_NAMES + INPUT_RULES}
    for k, v in counts.items():
        report.rejected_by_rule.setdefault(str(k), v)
    report.rejected_files_by_rule = dict(Counter(str(r["rule"] or "family_rejected")
                                                 for r in st.rejects
                                                 if r["kind"] in ("file", "skipped")))
