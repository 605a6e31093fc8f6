"""HDF5 family store: build once from raw files (parallel, idempotent), read lazily per process.

Layout (the contract, docs/store_format.md): `/families/<family_id>` with datasets `msa`
(uint8 [N_seq, L] AF2 token ids), `deletion_matrix` (uint8 [N_seq, L]), `backbone_positions`
(float32 [L, 5, 3] N, CA, C, O, CB in Å), `backbone_mask` (uint8 [L, 5]), `residue_index`
(int32 [L]) and attributes `sequence`, `resolution`, `source_files`, `source_sha256`.
`/index/{family_id,length,num_seq}` lists every family so readers need not walk the groups.

Building is the data pipeline's map step: workers parse + pair + filter one family each
(`process_family`, a pure function of its inputs) and the parent process is the single
writer. Bad input never stops a build: every rejected file or family goes to rejects.jsonl.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import multiprocessing as mp
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.filters import FILTER_NAMES, FilterConfig, check_family, load_screening
from protdp.data.parse import (_EXT_TO_FMT, merge_msas, pair_msa_structure, parse_msa,
                               parse_structure, list_chains)
from protdp.data.residues import sequence_to_ids
from protdp.errors import InputError
from protdp.fileio import sha256_file  # noqa: F401  (re-exported)

FORMAT_VERSION = 1
STRUCTURE_EXTS = (".pdb", ".cif", ".ent", ".mmcif")
_COMPRESSION = dict(compression="gzip", compression_opts=4, shuffle=True)


# ------------------------------------------------------------------------------ discovery

@dataclass
class FamilySpec:
    """What one family is built from (paths absolute). chain None = every protein chain."""
    family_id: str | None
    msa_files: list[str]
    structure_file: str | None
    chain: str | None = ""

    def files(self) -> list[str]:
        return list(self.msa_files) + ([self.structure_file] if self.structure_file else [])


def read_pairs(pairs: str | Path) -> list[FamilySpec]:
    """PAIRS TSV (columns msa_file, structure_file, chain; optional pair_id; paths relative to
    the TSV) -> one FamilySpec per (pair_id) or (structure_file, chain); MSAs are merged."""
    pairs = Path(pairs)
    try:
        text = pairs.read_text()
    except OSError as exc:
        raise InputError(f"cannot read pairs file: {exc.strerror}", path=pairs) from None
    reader = csv.DictReader(text.splitlines(), delimiter="\t")
    need = {"msa_file", "structure_file", "chain"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise InputError(f"pairs TSV needs columns {sorted(need)}, has {reader.fieldnames}",
                         path=pairs, line=1)
    groups: dict[tuple, FamilySpec] = {}
    for lineno, row in enumerate(reader, 2):
        if not (row.get("structure_file") or "").strip():
            raise InputError("empty structure_file", path=pairs, line=lineno,
                             field="structure_file")
        struct = str((pairs.parent / row["structure_file"].strip()).resolve())
        chain = (row.get("chain") or "").strip()
        fid = (row.get("pair_id") or "").strip() or f"{Path(struct).name.split('.')[0]}_{chain}"
        key = (fid, struct, chain)
        clash = next((k for k in groups if k[0] == fid and k != key), None)
        if clash is not None:
            raise InputError(f"family '{fid}' is paired with two different structures/chains "
                             f"({Path(clash[1]).name}:{clash[2]!r} and "
                             f"{Path(struct).name}:{chain!r}); give each its own pair_id",
                             path=pairs, line=lineno)
        spec = groups.setdefault(key, FamilySpec(fid, [], struct, chain))
        if (row.get("msa_file") or "").strip():
            spec.msa_files.append(str((pairs.parent / row["msa_file"].strip()).resolve()))
    return list(groups.values())


def discover_by_name(msa_dir: str | Path | None, structure_dir: str | Path | None
                     ) -> list[FamilySpec]:
    """Pair `<pdb>_<chain>.*.a3m|sto` with `<pdb>.pdb|cif` (or `<pdb>_<chain>.pdb`) by name.
    Structures without an MSA become single-sequence families (every protein chain);
    MSAs without a structure become specs without structure (rejected with a reason)."""
    msas = sorted(p for p in Path(msa_dir).iterdir()
                  if p.is_file() and p.suffix.lower() in _EXT_TO_FMT) if msa_dir else []
    structs = sorted(p for p in Path(structure_dir).iterdir()
                     if p.is_file() and p.suffix.lower() in STRUCTURE_EXTS) if structure_dir else []
    by_stem = {p.name.split(".")[0].lower(): p for p in structs}
    specs: dict[str, FamilySpec] = {}
    used = set()
    for m in msas:
        name = m.name.split(".")[0]
        pdb, _, chain = name.rpartition("_") if "_" in name else (name, "", "")
        cands = [name.lower(), pdb.lower(), f"{pdb.lower()}-assembly1"]
        struct = next((by_stem[c] for c in cands if c in by_stem), None)
        spec = specs.setdefault(name, FamilySpec(name, [], str(struct.resolve()) if struct else None,
                                                 chain))
        spec.msa_files.append(str(m.resolve()))
        if struct is not None:
            used.add(struct)
    for s in structs:
        if s not in used:
            specs[f"structure:{s.name}"] = FamilySpec(None, [], str(s.resolve()), None)
    return list(specs.values())


# ------------------------------------------------------------------------------ map step

def _reject(kind: str, file: str | None, reason: str, family_id: str | None = None,
            line: int | None = None, rule: str | None = None) -> dict:
    return {"kind": kind, "family_id": family_id, "file": file, "line": line, "rule": rule,
            "reason": reason}


def _from_input_error(exc: InputError, kind: str, family_id: str | None, rule: str) -> dict:
    return _reject(kind, exc.path, exc.reason if exc.field is None else
                   f"field '{exc.field}': {exc.reason}", family_id, exc.line, rule)


def _build_one(fid: str, spec: FamilySpec, chain_id: str, msas, cfg: FilterConfig, screen):
    """One chain -> (family dict | None, family reject | None)."""
    try:
        chain = parse_structure(spec.structure_file, chain_id)
    except InputError as exc:
        return None, _from_input_error(exc, "family", fid, "structure")
    try:
        if msas:
            msa = merge_msas(msas)
            query = msa.query
            tokens, dels = msa.tokens(), msa.deletion_matrix
            positions, mask, _ = pair_msa_structure(query, chain, msa.sources[0],
                                                    spec.structure_file)
        else:                                   # single-sequence family
            query = chain.sequence
            tokens = sequence_to_ids(query)[None]
            dels = np.zeros_like(tokens)
            positions, mask = chain.positions, chain.mask
    except InputError as exc:
        return None, _from_input_error(exc, "family", fid, "pairing")
    failed = check_family(query, chain.resolution, int(mask[:, 1].sum()), cfg, screen)
    if failed is not None:
        return None, _reject("family", spec.structure_file, failed[1], fid, rule=failed[0])
    family = {
        "family_id": fid,
        "msa": tokens.astype(np.uint8),                              # [N, L]
        "deletion_matrix": np.minimum(dels, cfg.deletion_clip).astype(np.uint8),  # [N, L]
        "backbone_positions": positions.astype(np.float32),          # [L, 5, 3]
        "backbone_mask": mask.astype(np.uint8),                      # [L, 5]
        "residue_index": np.arange(len(query), dtype=np.int32),      # [L]
        "sequence": query,
        "resolution": float(chain.resolution),
        "chain": chain.chain_id,
        "structure_file": spec.structure_file,
        "msa_files": [m for msa in msas for m in msa.sources],
    }
    return family, None


def process_family(spec: FamilySpec, cfg: FilterConfig, screen=None) -> dict:
    """Parse, merge, pair and filter one spec (runs in a worker). Returns
    {'families': [family dict, ...], 'rejects': [reject record, ...]}."""
    out = {"families": [], "rejects": []}
    msas = []
    for f in spec.msa_files:
        try:
            msas.append(parse_msa(f))
        except InputError as exc:
            out["rejects"].append(_from_input_error(exc, "file", spec.family_id, "parse"))
    if spec.structure_file is None:
        for m in msas:
            out["rejects"].append(_reject("file", m.sources[0], "no structure file found for "
                                          "this MSA (expected <pdb>.pdb|cif beside it)",
                                          spec.family_id, rule="unpaired"))
        return out
    if spec.msa_files and not msas:
        out["rejects"].append(_reject("family", spec.structure_file,
                                      f"all {len(spec.msa_files)} MSA file(s) of this family "
                                      f"failed to parse", spec.family_id, rule="parse"))
        return out
    if spec.chain is None:      # structure without MSA: one family per protein chain
        try:
            chains = list_chains(spec.structure_file)
        except InputError as exc:
            out["rejects"].append(_from_input_error(exc, "family", None, "structure"))
            return out
        if not chains:              # let the parser say why (header-only, ions only, ...)
            try:
                parse_structure(spec.structure_file, None)
                why = "no protein chain found"
            except InputError as exc:
                why = exc.reason
            out["rejects"].append(_reject("family", spec.structure_file, why, None,
                                          rule="structure"))
        stem = Path(spec.structure_file).name.split(".")[0]
        todo = [(f"{stem}_{c}" if c else stem, c) for c in chains]
    else:
        todo = [(spec.family_id, spec.chain)]
    for fid, chain_id in todo:
        fam, rej = _build_one(fid, spec, chain_id, msas, cfg, screen)
        if fam is not None:
            out["families"].append(fam)
        else:
            out["rejects"].append(rej)
    return out


_WORKER: dict = {}


def _init_worker(cfg: FilterConfig, screen) -> None:
    _WORKER["cfg"], _WORKER["screen"] = cfg, screen


def _work(spec: FamilySpec) -> tuple[FamilySpec, dict]:
    return spec, process_family(spec, _WORKER["cfg"], _WORKER["screen"])


# ------------------------------------------------------------------------------ writer

def _write_family(h5, fam: dict, hashes: dict[str, str], root: Path, extra_rejects: list) -> None:
    grp_path = f"families/{fam['family_id']}"
    if grp_path in h5:
        del h5[grp_path]
    g = h5.create_group(grp_path)
    n, L = fam["msa"].shape
    chunk_rows = max(1, min(n, 512))
    g.create_dataset("msa", data=fam["msa"], chunks=(chunk_rows, L), **_COMPRESSION)
    g.create_dataset("deletion_matrix", data=fam["deletion_matrix"], chunks=(chunk_rows, L),
                     **_COMPRESSION)
    g.create_dataset("backbone_positions", data=fam["backbone_positions"], **_COMPRESSION)
    g.create_dataset("backbone_mask", data=fam["backbone_mask"], **_COMPRESSION)
    g.create_dataset("residue_index", data=fam["residue_index"])
    files = list(fam["msa_files"]) + [fam["structure_file"]]
    g.attrs["sequence"] = fam["sequence"]
    g.attrs["resolution"] = fam["resolution"]
    g.attrs["source_files"] = [_rel(f, root) for f in files]
    g.attrs["source_sha256"] = [hashes[f] for f in files]
    g.attrs["chain"] = fam["chain"]
    g.attrs["length"] = L
    g.attrs["num_seq"] = n
    g.attrs["observed_residues"] = int(fam["backbone_mask"][:, 1].sum())
    g.attrs["file_rejects"] = json.dumps(extra_rejects)


def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def _write_index(h5) -> None:
    import h5py
    fams = h5.require_group("families")
    ids = sorted(fams.keys())
    if "index" in h5:
        del h5["index"]
    idx = h5.create_group("index")
    idx.create_dataset("family_id", data=np.array(ids, dtype=object),
                       dtype=h5py.string_dtype())
    idx.create_dataset("length", data=np.array([fams[i].attrs["length"] for i in ids], np.int32))
    idx.create_dataset("num_seq", data=np.array([fams[i].attrs["num_seq"] for i in ids], np.int32))


@dataclass
class BuildReport:
    """Outcome of `build_store`: counts that must add up, per-rule rejections, timings."""
    out: str
    rejects_path: str
    input_files: int = 0
    accepted_files: int = 0
    rejected_files: int = 0
    candidate_families: int = 0
    accepted_families: int = 0
    rejected_families: int = 0
    written: int = 0
    unchanged: int = 0
    removed: int = 0
    rejected_by_rule: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def balanced(self) -> bool:
        """Every input file and candidate family is accounted for exactly once."""
        return (self.input_files == self.accepted_files + self.rejected_files and
                self.candidate_families == self.accepted_families + self.rejected_families)

    def summary(self) -> str:
        rules = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected_by_rule.items()) if v)
        return (f"store {self.out}: {self.accepted_families} families "
                f"({self.written} written, {self.unchanged} unchanged, {self.removed} removed) "
                f"in {self.seconds:.1f}s\n"
                f"files:    inputs {self.input_files} = accepted {self.accepted_files} + "
                f"rejected {self.rejected_files}  [{'ok' if self.balanced else 'MISMATCH'}]\n"
                f"families: candidates {self.candidate_families} = accepted "
                f"{self.accepted_families} + rejected {self.rejected_families}\n"
                f"rejections by rule: {rules or 'none'}\n"
                f"rejects report: {self.rejects_path}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["balanced"] = self.balanced
        return d


def build_store(out: str | Path, *, pairs: str | Path | None = None,
                msa_dir: str | Path | None = None, structure_dir: str | Path | None = None,
                config: FilterConfig | str | Path | dict | None = None, workers: int = 1,
                rejects_path: str | Path | None = None, progress: bool = True,
                force: bool = False) -> BuildReport:
    """Build or update the HDF5 store at `out`. Families whose source files (sha256), spec and
    filter config are unchanged are skipped unless `force`. Returns a BuildReport; rejects go
    to `rejects_path` (default: rejects.jsonl beside `out`)."""
    import h5py
    from tqdm import tqdm

    t0 = time.time()
    cfg = FilterConfig.load(config)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rejects_path = Path(rejects_path) if rejects_path else out.parent / "rejects.jsonl"
    if pairs is not None:
        specs = read_pairs(pairs)
        root = Path(pairs).resolve().parent
    elif msa_dir or structure_dir:
        specs = discover_by_name(msa_dir, structure_dir)
        dirs = [Path(d).resolve() for d in (msa_dir, structure_dir) if d]
        root = Path(os.path.commonpath(dirs)) if len(dirs) > 1 else dirs[0]
    else:
        raise InputError("nothing to build: give --pairs or --msa-dir/--structure-dir")
    screen = load_screening(cfg)
    cfg_json = json.dumps(dataclasses.asdict(cfg), sort_keys=True)

    report = BuildReport(str(out), str(rejects_path))
    rejects: list[dict] = []
    all_files = sorted({f for s in specs for f in s.files()})
    hashes: dict[str, str] = {}
    for f in all_files:
        try:
            hashes[f] = sha256_file(f)
        except OSError as exc:
            rejects.append(_reject("file", f, f"cannot read file: {exc.strerror}"))
    missing = set(all_files) - set(hashes)
    runnable = []
    for s in specs:
        s.msa_files = [f for f in s.msa_files if f not in missing]
        if s.structure_file in missing:
            rejects.append(_reject("family", s.structure_file, "structure file is missing",
                                   s.family_id, rule="structure"))
            continue
        runnable.append(s)

    fam_files: dict[str, set] = {}        # kept family id -> files it uses
    owner: dict[str, str] = {}            # query sequence -> family id (duplicate rule)
    fam_status: dict[str, str] = {}       # family id -> 'written' | 'unchanged'
    try:
        h5file = h5py.File(out, "a")
    except OSError as exc:
        raise InputError(f"cannot open the store for writing (not an HDF5 file, or in use by "
                         f"another process?): {exc}", path=out) from None
    with h5file as h5:
        fams = h5.require_group("families")
        if force or h5.attrs.get("filter_config") != cfg_json:
            stale = list(fams.keys())
            for k in stale:
                del fams[k]
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["filter_config"] = cfg_json
        h5.attrs["source_root"] = str(root)

        todo = []
        for s in runnable:
            g = fams.get(s.family_id) if s.family_id and s.chain is not None else None
            if g is not None and list(g.attrs["source_files"]) == [_rel(f, root) for f in
                                                                   s.files()] \
                    and list(g.attrs["source_sha256"]) == [hashes[f] for f in s.files()]:
                fam_status[s.family_id] = "unchanged"
                owner.setdefault(str(g.attrs["sequence"]), s.family_id)
                old = json.loads(g.attrs.get("file_rejects", "[]"))
                rejects.extend(old)
                fam_files[s.family_id] = set(s.files()) - {r["file"] for r in old}
            else:
                todo.append(s)

        def accept(fam: dict, file_rejects: list) -> None:
            fid, seq = fam["family_id"], fam["sequence"]
            if cfg.deduplicate_chains and seq in owner and owner[seq] != fid:
                keep, drop = sorted([owner[seq], fid])
                rejects.append(_reject("family", None, f"exact duplicate of family '{keep}' "
                                       f"(same {len(seq)}-residue query)", drop,
                                       rule="duplicate_chain"))
                if drop == fid:
                    return
                if drop in fams:
                    del fams[drop]
                fam_status.pop(drop, None)
                fam_files.pop(drop, None)
            owner[seq] = fid
            _write_family(h5, fam, hashes, root, file_rejects)
            fam_status[fid] = "written"
            fam_files[fid] = set(fam["msa_files"]) | {fam["structure_file"]}

        if workers > 1 and len(todo) > 1:
            ctx = mp.get_context("spawn" if os.name == "nt" else "fork")
            with ctx.Pool(workers, initializer=_init_worker, initargs=(cfg, screen)) as pool:
                it = pool.imap_unordered(_work, todo, chunksize=1)
                for spec, res in tqdm(it, total=len(todo), desc="build", disable=not progress):
                    _consume(res, accept, rejects)
        else:
            for spec in tqdm(todo, desc="build", disable=not progress):
                res = process_family(spec, cfg, screen)
                _consume(res, accept, rejects)

        wanted = set(fam_status)
        for k in list(fams.keys()):
            if k not in wanted:
                del fams[k]
                report.removed += 1
        _write_index(h5)

    # Accounting: a file is accepted if it feeds a kept family; every other file gets a
    # file-level record (its own parse error, or why its family was rejected).
    used_files = set().union(*(fam_files.get(f, set()) for f in fam_status))
    recorded = {r["file"] for r in rejects if r["kind"] == "file"}
    for f in all_files:
        if f in used_files or f in recorded:
            continue
        fids = {s.family_id for s in specs if f in s.files()}
        why = [r["reason"] for r in rejects if r["kind"] == "family" and r["file"] == f] or \
              [f"its family '{r['family_id']}' was rejected: {r['reason']}" for r in rejects
               if r["kind"] == "family" and r["family_id"] in fids]
        rejects.append(_reject("file", f, why[0] if why else "not used by any family"))
    rejected = {r["file"] for r in rejects if r["kind"] == "file"} - used_files
    report.input_files = len(all_files)
    report.accepted_files = len(used_files)
    report.rejected_files = len(rejected & set(all_files))
    fam_rejects = [r for r in rejects if r["kind"] == "family"]
    report.accepted_families = len(fam_status)
    report.rejected_families = len(fam_rejects)
    report.candidate_families = report.accepted_families + report.rejected_families
    report.written = sum(v == "written" for v in fam_status.values())
    report.unchanged = sum(v == "unchanged" for v in fam_status.values())
    counts = Counter(r["rule"] for r in fam_rejects)
    report.rejected_by_rule = {name: counts.get(name, 0) for name in FILTER_NAMES}
    for k, v in counts.items():
        report.rejected_by_rule.setdefault(k, v)
    report.seconds = time.time() - t0
    with open(rejects_path, "w") as fh:
        for r in rejects:
            fh.write(json.dumps(r) + "\n")
    return report


def _consume(res: dict, accept, rejects: list) -> None:
    file_rejects = [r for r in res["rejects"] if r["kind"] == "file"]
    rejects.extend(res["rejects"])
    for fam in sorted(res["families"], key=lambda f: f["family_id"]):
        accept(fam, file_rejects)


# ------------------------------------------------------------------------------ reader

class FamilyStore:
    """Read-only view of a built store; the HDF5 handle is opened lazily in each process
    (safe with DataLoader workers and several ranks reading the same file)."""

    def __init__(self, path: str | Path):
        import h5py
        self.path = Path(path)
        if not self.path.exists():
            raise InputError("store not found (build it with `protdp data build`)",
                             path=self.path)
        self._h5 = None
        self._pid = None
        try:
            with h5py.File(self.path, "r") as h5:
                idx = h5["index"]
                self.family_ids: list[str] = [x.decode() if isinstance(x, bytes) else str(x)
                                              for x in idx["family_id"][()]]
                self.lengths = np.asarray(idx["length"][()], np.int64)      # [F]
                self.num_seqs = np.asarray(idx["num_seq"][()], np.int64)    # [F]
                self.attrs = dict(h5.attrs)
        except OSError as exc:
            raise InputError(f"cannot open the store (not HDF5, or a build is writing it?): "
                             f"{exc}", path=self.path) from None
        except KeyError as exc:
            raise InputError(f"not a protdp family store (missing {exc}); rebuild it with "
                             f"`protdp data build`", path=self.path) from None
        self._pos = {f: i for i, f in enumerate(self.family_ids)}

    def __len__(self) -> int:
        return len(self.family_ids)

    def __contains__(self, family_id: str) -> bool:
        return family_id in self._pos

    def length(self, family_id: str) -> int:
        return int(self.lengths[self._pos[family_id]])

    def _file(self):
        import h5py
        if self._h5 is None or self._pid != os.getpid():
            self._h5 = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._h5

    def read(self, family_id: str) -> dict:
        """Arrays (numpy) and attributes of one family, plus 'family_id'."""
        if family_id not in self._pos:
            raise InputError(f"family '{family_id}' is not in the store", path=self.path)
        g = self._file()["families"][family_id]
        out = {k: g[k][()] for k in ("msa", "deletion_matrix", "backbone_positions",
                                     "backbone_mask", "residue_index")}
        for k, v in g.attrs.items():
            out[k] = v.tolist() if isinstance(v, np.ndarray) else v
        out["resolution"] = float(out["resolution"])
        out["family_id"] = family_id
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
