"""Predictions from other tools' files (and protdp's own), read the way ipsae.py reads them:

* AlphaFold2 / ColabFold / protdp: a scores JSON with `pae` (or `predicted_aligned_error`),
  `plddt` per residue and optionally `iptm` + the PDB (or mmCIF) of the model; AlphaFold 2.3's
  `pae_<model>.json` has no pLDDT, which then comes from a `plddt` sibling
  (`confidence_<model>.json`, `confidenceScore`);
* AlphaFold 3: `*_full_data_*.json` (or `confidences.json`) with `pae` over tokens and
  `atom_plddts` by atom serial + the model's mmCIF; `chain_pair_iptm` from the sibling
  `*_summary_confidences_*.json` when present;
* Boltz: `pae_*.npz` (`pae` over tokens) + mmCIF or PDB; pLDDT from the sibling `plddt_*.npz`
  (×100 when <= 1), `pair_chains_iptm` from the sibling `confidence_*.json` when present.

Siblings are found by name (`sibling_files`) unless given. Every file is read once through an
`InputBytes` (`protdp.interface.inputs`): the numbers are parsed from the very bytes a caller
then hashes and copies (`protdp gate` binds them for review), and each JSON is parsed once.
Every problem (unknown format, PAE size != residue count, non-finite values, a chain without
residues, fewer than two chains, a file too large) is one `InputError` naming the file. Never
unpickles.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protdp.data.npz_headers import HEADER_ERRORS, declared_problem, read_npz_headers
from protdp.errors import InputError
from protdp.interface.inputs import MAX_INPUT_BYTES, InputBytes
from protdp.interface.scores import Residues
from protdp.interface.structure import StructureTokens, read_structure_tokens

FORMATS = ("alphafold2", "alphafold3", "boltz")
SIBLING_ROLES = ("summary", "plddt")        # besides "pae" and "structure"


@dataclass(frozen=True)
class Prediction:
    """One complex ready for `interface_scores`."""
    pae: np.ndarray              # [N, N] Å
    plddt: np.ndarray            # [N] at Cα
    cb_plddt: np.ndarray         # [N] at the distance atom (= plddt for per-residue files)
    residues: Residues
    format: str                  # one of FORMATS
    iptm: dict                   # (chain_1, chain_2) -> the tool's own ipTM (ipsae.py ipTM_af)
    reported: dict               # {"iptm", "ptm"}: the tool's whole-complex numbers it wrote
    missing: frozenset = frozenset()   # of "plddt", "iptm", "chain_pair_iptm": not in the
                                       # files (pLDDT / pair ipTM then 0.0, ipTM -1.0 above)


def _finite(values, what: str, path: Path) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{what} is not numeric (null or text among its values)",
                         path=path, field=what) from None
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{what} has non-finite values", path=path, field=what)
    return arr


def _parse_json(data: bytes, path: Path) -> dict:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"not a readable JSON file ({type(exc).__name__})", path=path) from None
    if isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], dict):
        doc = doc[0]                     # AlphaFold DB style [{"predicted_aligned_error": ...}]
    if not isinstance(doc, dict):
        raise InputError("expected a JSON object", path=path)
    return doc


def _npz_array(data: bytes, path: Path, key: str, shape: tuple) -> np.ndarray:
    """The `key` array of an .npz's bytes, whose header must declare `shape` and the bytes the
    member holds (`protdp.data.npz_headers.declared_problem`), both checked before anything is
    inflated: a small file cannot make np.load allocate gigabytes."""
    try:
        headers = read_npz_headers(io.BytesIO(data), {key})
        if key not in headers:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                names = [n.removesuffix(".npy") for n in z.namelist()]
            raise InputError(f"no '{key}' array (has {', '.join(names) or 'none'})", path=path)
        declared, dtype = headers[key].shape, headers[key].dtype
        if declared != tuple(shape) or dtype.hasobject or headers[key].declared > MAX_INPUT_BYTES:
            raise InputError(f"{key} is declared {'x'.join(map(str, declared))} ({dtype}) "
                             f"but the structure has {shape[0]} tokens", path=path, field=key)
        problem = declared_problem(key, headers[key])
        if problem:
            raise InputError(problem.removeprefix(f"{key}: "), path=path, field=key)
        with zipfile.ZipFile(io.BytesIO(data)) as z, z.open(f"{key}.npy") as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)
    except HEADER_ERRORS + (NotImplementedError,) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"not a readable .npz ({first})", path=path) from None


def detect_format(pae_path: Path, doc: dict | None) -> str:
    if pae_path.suffix == ".npz":
        return "boltz"
    if doc is None:
        raise InputError("unknown PAE file format (expected a .json scores file or a Boltz "
                         ".npz)", path=pae_path)
    if "atom_plddts" in doc or "token_chain_ids" in doc:
        return "alphafold3"
    if "pae" in doc or "predicted_aligned_error" in doc:
        return "alphafold2"
    raise InputError("unknown PAE file format: no 'pae' / 'predicted_aligned_error' (AF2, "
                     "ColabFold, protdp) nor 'atom_plddts' (AlphaFold 3)", path=pae_path)


def _sibling(path: Path, old: str, new: str, suffix: str | None = None) -> Path | None:
    if old not in path.name:
        return None
    p = path.with_name(path.name.replace(old, new))
    p = p.with_suffix(suffix) if suffix else p
    return p if p.is_file() else None


def sibling_files(pae_path: str | Path, fmt: str) -> dict[str, Path]:
    """{role: path} of the files beside a `fmt` PAE file that feed its numbers: AF3's summary
    confidences (ipTM, pTM, chain-pair ipTM); Boltz's confidence JSON and pLDDT npz."""
    pae_path = Path(pae_path)
    found = {}
    if fmt == "alphafold3":
        found["summary"] = (_sibling(pae_path, "full_data", "summary_confidences")
                            or _sibling(pae_path, "confidences", "summary_confidences"))
    elif fmt == "boltz":
        found["summary"] = _sibling(pae_path, "pae", "confidence", ".json")
        found["plddt"] = _sibling(pae_path, "pae", "plddt")
    return {role: p for role, p in found.items() if p is not None}


def _pair_matrix(matrix, chains: list[str], path: Path) -> dict:
    """A [C][C] list (AF3) or {"i": {"j": v}} (Boltz) chain-pair ipTM keyed by chain ids."""
    out = {}
    try:
        for i, a in enumerate(chains):
            for j, b in enumerate(chains):
                if a != b:
                    row = matrix[i] if isinstance(matrix, list) else matrix[str(i)]
                    v = row[j] if isinstance(row, list) else row[str(j)]
                    out[(a, b)] = float(v) if not isinstance(v, bool) else float("nan")
    except (KeyError, IndexError, TypeError, ValueError):
        raise InputError("chain-pair ipTM does not match the structure's chains",
                         path=path) from None
    if not all(np.isfinite(v) for v in out.values()):
        raise InputError("chain-pair ipTM has non-finite or non-numeric values", path=path)
    return out


def _reported(doc: dict) -> dict:
    """ipTM / pTM as the tool wrote them (finite numbers only)."""
    return {k: float(doc[k]) for k in ("iptm", "ptm") if isinstance(doc.get(k), (int, float))
            and not isinstance(doc.get(k), bool) and np.isfinite(doc[k])}


def _check_chains(tokens: StructureTokens, path: Path, ligands_allowed: bool) -> None:
    """Two or more chains with residues; in AF2-style files (no ligand tokens) every chain
    must have residues: its PAE rows would otherwise be missing."""
    present = set(tokens.residues.chain_ids.tolist())
    for chain, atoms in tokens.chain_atoms.items():
        if chain not in present and (atoms == 0 or not ligands_allowed):
            raise InputError(f"chain {chain} has no residues (no Cα / C1' atom)", path=path)
    if len(present) < 2:
        raise InputError(f"{len(present)} chain(s) with residues; interface scores need two or "
                         "more", path=path)


def _per_residue_plddt(values, n: int, what: str, path: Path) -> np.ndarray:
    plddt = _finite(values, what, path) if isinstance(values, list) else np.zeros(0)
    if plddt.shape != (n,):
        raise InputError(f"{what} must be {n} finite values (one per residue of the structure), "
                         f"has {plddt.size}", path=path, field=what)
    return plddt


def _alphafold2(doc: dict, pae_path: Path, tokens: StructureTokens, siblings: dict,
                inputs: InputBytes):
    pae = _finite(doc.get("pae", doc.get("predicted_aligned_error")), "pae", pae_path)
    n = len(tokens.residues.chain_ids)
    missing = set()
    if "plddt" in doc:
        plddt = _per_residue_plddt(doc["plddt"], n, "plddt", pae_path)
    elif "plddt" in siblings:                # AlphaFold 2.3's confidence_<model>.json
        path = siblings["plddt"]
        conf = _parse_json(inputs.read(path, "plddt"), path)
        plddt = _per_residue_plddt(conf.get("confidenceScore"), n, "confidenceScore", path)
    else:
        plddt, missing = np.zeros(n), {"plddt"}
    chains = tokens.residues.chains
    reported = _reported(doc)
    iptm = reported.get("iptm", -1.0)
    if "iptm" not in reported:
        missing.add("iptm")
    return pae, plddt, plddt, {(a, b): iptm for a in chains for b in chains if a != b}, \
        reported, missing


def _summary(siblings: dict, inputs: InputBytes, key: str, chains: list[str]):
    """(chain-pair ipTM, reported ipTM / pTM, missing) from an AF3 / Boltz summary JSON;
    without one (or without `key`) the pairs are 0.0, as ipsae.py prints them, and "missing"
    says so."""
    iptm = {(a, b): 0.0 for a in chains for b in chains if a != b}
    path = siblings.get("summary")
    if path is None:
        return iptm, {}, {"iptm", "chain_pair_iptm"}
    s = _parse_json(inputs.read(path, "summary"), path)
    missing = set()
    if key in s:
        iptm = _pair_matrix(s[key], chains, path)
    else:
        missing.add("chain_pair_iptm")
    reported = _reported(s)
    return iptm, reported, missing if "iptm" in reported else missing | {"iptm"}


def _alphafold3(doc: dict, pae_path: Path, tokens: StructureTokens, siblings: dict,
                inputs: InputBytes):
    if "pae" not in doc:
        raise InputError("no 'pae' in the AlphaFold 3 confidences file", path=pae_path)
    full = _finite(doc["pae"], "pae", pae_path)
    pae = _token_subset(full, tokens, pae_path)
    n = len(tokens.residues.chain_ids)
    plddt = cb_plddt = np.zeros(n)
    missing = {"plddt"}
    if "atom_plddts" in doc:
        atoms = _finite(doc["atom_plddts"], "atom_plddts", pae_path)
        last = int(max(tokens.ca_serial.max(initial=-1), tokens.cb_serial.max(initial=-1)))
        if atoms.ndim != 1:
            raise InputError("atom_plddts must be a flat list of numbers", path=pae_path,
                             field="atom_plddts")
        if last >= len(atoms):
            raise InputError(f"atom_plddts has {atoms.size} values; the structure's atom "
                             f"serials go to {last + 1}", path=pae_path, field="atom_plddts")
        plddt, cb_plddt, missing = atoms[tokens.ca_serial], atoms[tokens.cb_serial], set()
    iptm, reported, no_iptm = _summary(siblings, inputs, "chain_pair_iptm",
                                       tokens.residues.chains)
    return pae, plddt, cb_plddt, iptm, reported, missing | no_iptm


def _token_subset(full: np.ndarray, tokens: StructureTokens, pae_path: Path) -> np.ndarray:
    t = len(tokens.token_mask)
    if full.ndim != 2 or full.shape != (t, t):
        raise InputError(f"PAE is {'x'.join(map(str, full.shape))} but the structure has {t} "
                         f"tokens ({len(tokens.residues.chain_ids)} residues)", path=pae_path,
                         field="pae")
    return full[np.ix_(tokens.token_mask, tokens.token_mask)]


def _boltz(pae_path: Path, tokens: StructureTokens, siblings: dict, inputs: InputBytes):
    t = len(tokens.token_mask)
    raw_pae = _npz_array(inputs.read(pae_path, "pae"), pae_path, "pae", (t, t))
    pae = _token_subset(_finite(raw_pae, "pae", pae_path), tokens, pae_path)
    n = len(tokens.residues.chain_ids)
    plddt, missing = np.zeros(n), {"plddt"}
    plddt_path = siblings.get("plddt")
    if plddt_path is not None:
        raw = _finite(_npz_array(inputs.read(plddt_path, "plddt"), plddt_path, "plddt", (t,)),
                      "plddt", plddt_path)
        raw = raw * 100.0 if raw.max(initial=0.0) <= 1.0 else raw
        plddt, missing = raw[tokens.token_mask], set()
    iptm, reported, no_iptm = _summary(siblings, inputs, "pair_chains_iptm",
                                       tokens.residues.chains)
    return pae, plddt, plddt, iptm, reported, missing | no_iptm


def read_prediction(pae_path: str | Path, structure_path: str | Path, *,
                    siblings: dict | None = None, inputs: InputBytes | None = None
                    ) -> Prediction:
    """A prediction from its PAE file, its structure and the `siblings` ({role: path}, default
    `sibling_files`) that carry pLDDT / ipTM (see the module docstring). Every file is read
    through `inputs` (default a fresh `InputBytes`), which afterwards holds each one's bytes."""
    pae_path, structure_path = Path(pae_path), Path(structure_path)
    inputs = InputBytes() if inputs is None else inputs
    structure_bytes = inputs.read(structure_path, "structure")
    doc = None
    if pae_path.suffix.lower() == ".json":
        doc = _parse_json(inputs.read(pae_path, "pae"), pae_path)
    fmt = detect_format(pae_path, doc)
    siblings = sibling_files(pae_path, fmt) if siblings is None else siblings
    tokens = read_structure_tokens(structure_path, structure_bytes)
    _check_chains(tokens, structure_path, ligands_allowed=fmt != "alphafold2")
    if fmt == "alphafold2":
        parts = _alphafold2(doc, pae_path, tokens, siblings, inputs)
    elif fmt == "alphafold3":
        parts = _alphafold3(doc, pae_path, tokens, siblings, inputs)
    else:
        parts = _boltz(pae_path, tokens, siblings, inputs)
    pae, plddt, cb_plddt, iptm, reported, missing = parts
    n = len(tokens.residues.chain_ids)
    if pae.shape != (n, n):
        raise InputError(f"PAE is {'x'.join(map(str, pae.shape))} but the structure has {n} "
                         f"residues", path=pae_path, field="pae")
    return Prediction(pae, plddt, cb_plddt, tokens.residues, fmt, iptm, reported,
                      frozenset(missing))
