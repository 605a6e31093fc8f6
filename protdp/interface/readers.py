"""Predictions from other tools' files (and protdp's own), read the way ipsae.py reads them:

* AlphaFold2 / ColabFold / protdp: a scores JSON with `pae` (or `predicted_aligned_error`),
  `plddt` per residue and optionally `iptm` + the PDB (or mmCIF) of the model;
* AlphaFold 3: `*_full_data_*.json` (or `confidences.json`) with `pae` over tokens and
  `atom_plddts` by atom serial + the model's mmCIF; `chain_pair_iptm` from the sibling
  `*_summary_confidences_*.json` when present;
* Boltz: `pae_*.npz` (`pae` over tokens) + mmCIF or PDB; pLDDT from the sibling `plddt_*.npz`
  (×100 when <= 1), `pair_chains_iptm` from the sibling `confidence_*.json` when present.

Every problem (unknown format, PAE size != residue count, non-finite values, a chain without
residues, fewer than two chains) is one `InputError` naming the file. Never unpickles.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protdp.errors import InputError
from protdp.interface.scores import Residues
from protdp.interface.structure import StructureTokens, read_structure_tokens

FORMATS = ("alphafold2", "alphafold3", "boltz")


@dataclass(frozen=True)
class Prediction:
    """One complex ready for `interface_scores`."""
    pae: np.ndarray              # [N, N] Å
    plddt: np.ndarray            # [N] at Cα
    cb_plddt: np.ndarray         # [N] at the distance atom (= plddt for per-residue files)
    residues: Residues
    format: str                  # one of FORMATS
    iptm: dict                   # (chain_1, chain_2) -> the tool's own ipTM (ipsae.py ipTM_af)


def _finite(values, what: str, path: Path) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{what} is not numeric (null or text among its values)",
                         path=path, field=what) from None
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{what} has non-finite values", path=path, field=what)
    return arr


def _load_json(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"not a readable JSON file ({type(exc).__name__})", path=path) from None
    if isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], dict):
        doc = doc[0]                     # AlphaFold DB style [{"predicted_aligned_error": ...}]
    if not isinstance(doc, dict):
        raise InputError("expected a JSON object", path=path)
    return doc


def _load_npz(path: Path, key: str) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as z:
            if key not in z.files:
                raise InputError(f"no '{key}' array (has {', '.join(z.files) or 'none'})",
                                 path=path)
            return z[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
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


def _pair_matrix(matrix, chains: list[str], path: Path) -> dict:
    """A [C][C] list (AF3) or {"i": {"j": v}} (Boltz) chain-pair ipTM keyed by chain ids."""
    out = {}
    try:
        for i, a in enumerate(chains):
            for j, b in enumerate(chains):
                if a != b:
                    row = matrix[i] if isinstance(matrix, list) else matrix[str(i)]
                    out[(a, b)] = float(row[j] if isinstance(row, list) else row[str(j)])
    except (KeyError, IndexError, TypeError, ValueError):
        raise InputError("chain-pair ipTM does not match the structure's chains",
                         path=path) from None
    return out


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


def _alphafold2(doc: dict, pae_path: Path, tokens: StructureTokens):
    pae = _finite(doc.get("pae", doc.get("predicted_aligned_error")), "pae", pae_path)
    n = len(tokens.residues.chain_ids)
    plddt = _finite(doc["plddt"], "plddt", pae_path) if "plddt" in doc else np.zeros(n)
    if plddt.shape != (n,):
        raise InputError(f"plddt has {plddt.size} values, the structure {n} residues",
                         path=pae_path, field="plddt")
    chains = tokens.residues.chains
    iptm = float(doc["iptm"]) if isinstance(doc.get("iptm"), (int, float)) else -1.0
    return pae, plddt, plddt, {(a, b): iptm for a in chains for b in chains if a != b}


def _alphafold3(doc: dict, pae_path: Path, tokens: StructureTokens):
    if "pae" not in doc:
        raise InputError("no 'pae' in the AlphaFold 3 confidences file", path=pae_path)
    full = _finite(doc["pae"], "pae", pae_path)
    pae = _token_subset(full, tokens, pae_path)
    n = len(tokens.residues.chain_ids)
    plddt = cb_plddt = np.zeros(n)
    if "atom_plddts" in doc:
        atoms = _finite(doc["atom_plddts"], "atom_plddts", pae_path)
        last = int(max(tokens.ca_serial.max(initial=-1), tokens.cb_serial.max(initial=-1)))
        if last >= len(atoms):
            raise InputError(f"atom_plddts has {len(atoms)} values; the structure's atom serials "
                             f"go to {last + 1}", path=pae_path, field="atom_plddts")
        plddt, cb_plddt = atoms[tokens.ca_serial], atoms[tokens.cb_serial]
    chains = tokens.residues.chains
    iptm = {(a, b): 0.0 for a in chains for b in chains if a != b}
    summary = (_sibling(pae_path, "full_data", "summary_confidences")
               or _sibling(pae_path, "confidences", "summary_confidences"))
    if summary is not None and "chain_pair_iptm" in (s := _load_json(summary)):
        iptm = _pair_matrix(s["chain_pair_iptm"], chains, summary)
    return pae, plddt, cb_plddt, iptm


def _token_subset(full: np.ndarray, tokens: StructureTokens, pae_path: Path) -> np.ndarray:
    t = len(tokens.token_mask)
    if full.ndim != 2 or full.shape != (t, t):
        raise InputError(f"PAE is {'x'.join(map(str, full.shape))} but the structure has {t} "
                         f"tokens ({len(tokens.residues.chain_ids)} residues)", path=pae_path,
                         field="pae")
    return full[np.ix_(tokens.token_mask, tokens.token_mask)]


def _boltz(pae_path: Path, tokens: StructureTokens):
    pae = _token_subset(_finite(_load_npz(pae_path, "pae"), "pae", pae_path), tokens, pae_path)
    n = len(tokens.residues.chain_ids)
    plddt = np.zeros(n)
    plddt_path = _sibling(pae_path, "pae", "plddt")
    if plddt_path is not None:
        raw = _finite(_load_npz(plddt_path, "plddt"), "plddt", plddt_path)
        if raw.shape != tokens.token_mask.shape:
            raise InputError(f"plddt has {raw.size} values, the structure "
                             f"{tokens.token_mask.size} tokens", path=plddt_path, field="plddt")
        raw = raw * 100.0 if raw.max(initial=0.0) <= 1.0 else raw
        plddt = raw[tokens.token_mask]
    chains = tokens.residues.chains
    iptm = {(a, b): 0.0 for a in chains for b in chains if a != b}
    conf = _sibling(pae_path, "pae", "confidence", ".json")
    if conf is not None and "pair_chains_iptm" in (s := _load_json(conf)):
        iptm = _pair_matrix(s["pair_chains_iptm"], chains, conf)
    return pae, plddt, plddt, iptm


def read_prediction(pae_path: str | Path, structure_path: str | Path) -> Prediction:
    """A prediction from its PAE file and its structure (see the module docstring)."""
    pae_path, structure_path = Path(pae_path), Path(structure_path)
    for p in (pae_path, structure_path):
        if not p.is_file():
            raise InputError("not a file" if p.exists() else "no such file", path=p)
    doc = _load_json(pae_path) if pae_path.suffix.lower() == ".json" else None
    fmt = detect_format(pae_path, doc)
    tokens = read_structure_tokens(structure_path)
    _check_chains(tokens, structure_path, ligands_allowed=fmt != "alphafold2")
    if fmt == "alphafold2":
        pae, plddt, cb_plddt, iptm = _alphafold2(doc, pae_path, tokens)
    elif fmt == "alphafold3":
        pae, plddt, cb_plddt, iptm = _alphafold3(doc, pae_path, tokens)
    else:
        pae, plddt, cb_plddt, iptm = _boltz(pae_path, tokens)
    n = len(tokens.residues.chain_ids)
    if pae.shape != (n, n):
        raise InputError(f"PAE is {'x'.join(map(str, pae.shape))} but the structure has {n} "
                         f"residues", path=pae_path, field="pae")
    return Prediction(pae, plddt, cb_plddt, tokens.residues, fmt, iptm)
