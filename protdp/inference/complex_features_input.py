"""Precomputed AlphaFold-Multimer features as `protdp predict` input (issue 41).

`protdp complex features --out F` writes `F/<complex>/features.npz` (AlphaFold's multimer
`np_example`, `protdp.complex.features.complex_features`). Given `F` as `--fasta` (or through
`protdp complex predict --features-dir F`, a thin front end of `protdp predict`), each such
file becomes one complex `Target` and goes through the one prediction path: release check,
gate, review queue, prediction folder layout, ModelCIF, provenance and resume. The chains are
read back from the features (`asym_id` order, `aatype` residues) and named with AlphaFold's
chain ids (`protdp.complex.inputs.CHAIN_IDS`, at most 62); the features file's sha256 is the
MSA part of the prediction's fingerprint.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np

from protdp.data.npz_headers import read_npz
from protdp.data.residues import GAP_ID, RESTYPES
from protdp.errors import InputError, ProtdpError
from protdp.fileio import sha256_file
from protdp.inference.targets import Target, _assign_names
from protdp.complex.inputs import CHAIN_IDS, MAX_CHAINS

FEATURES_FILE = "features.npz"


def is_features_folder(path: Path) -> bool:
    """The --out folder of `protdp complex features`: `<complex>/features.npz`, no FASTA."""
    from protdp.data.safeio import split_suffix
    from protdp.complex.inputs import FASTA_SUFFIXES

    return path.is_dir() and any(path.glob(f"*/{FEATURES_FILE}")) and not any(
        p.is_file() and split_suffix(p)[1] in FASTA_SUFFIXES for p in path.iterdir())


FEATURES_WHAT = "features file"
REQUIRED_KEYS = ("aatype", "asym_id", "msa")
CHAIN_KEYS = ("aatype", "asym_id")    # [L] each: all start-up reads of a features file


def _read(path: Path, keys: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The features of `path` (never unpickled, headers checked first:
    `protdp.data.npz_headers.read_npz`), or only its `keys` (the other members, the MSA and
    templates, not decompressed); a file without the keys a multimer features file has is one
    error naming it."""
    read_npz(path, FEATURES_WHAT, keys=())           # a readable .npz, nothing decompressed
    with zipfile.ZipFile(path) as zf:
        members = {n.removesuffix(".npy") for n in zf.namelist()}
    missing = [k for k in REQUIRED_KEYS if k not in members]
    if missing:
        raise InputError(f"not a multimer features file (no {', '.join(missing)}; write it "
                         "with `protdp complex features`)", path=path)
    return read_npz(path, FEATURES_WHAT, keys=keys)


def chains_of(features: dict, path: Path | None = None) -> list[tuple[str, str]]:
    """[(chain id, sequence)] in residue (asym_id) order: AlphaFold's chain ids A..Z, a..z,
    0..9 (`CHAIN_IDS`, the scheme `protdp predict` names complexes with)."""
    asym = np.asarray(features["asym_id"]).reshape(-1)                     # [L]
    aatype = np.asarray(features["aatype"]).reshape(-1)                   # [L]
    order = list(dict.fromkeys(asym.tolist()))
    if len(order) > MAX_CHAINS:
        raise InputError(f"{len(order)} chains; AlphaFold's chain ids name at most "
                         f"{MAX_CHAINS}", path=path)
    return [(CHAIN_IDS[k], "".join(RESTYPES[i] if 0 <= i < len(RESTYPES) else "X"
                                   for i in aatype[asym == a].tolist()))
            for k, a in enumerate(order)]


def read_features_targets(folder: Path) -> tuple[list[Target], str]:
    """One Target per `<complex>/features.npz` (sorted by folder name) and a digest over the
    files' names and sha256s, each file hashed once (kept as the target's `features_sha256`)
    and only its chain arrays (`CHAIN_KEYS`) decompressed. A file that cannot be read is that
    target's error (one row)."""
    targets, digest = [], hashlib.sha256()
    for index, path in enumerate(sorted(folder.glob(f"*/{FEATURES_FILE}"))):
        name = path.parent.name
        t = Target(index, name, name, "", 1, extra={"features_npz": str(path), "source": path})
        try:
            t.raw_sequence = ":".join(s for _, s in chains_of(_read(path, CHAIN_KEYS), path))
            t.extra["features_sha256"] = sha256_file(path)
            digest.update(f"{name}\0{t.extra['features_sha256']}\n".encode())
        except ProtdpError as exc:
            t.error = str(exc)
        targets.append(t)
    _assign_names(targets, folder)
    return targets, digest.hexdigest()


def features_inputs(t: Target, *, max_length: int) -> dict:
    """The model input of one precomputed complex, shaped as `complexes.build_features`'s:
    {"features", "chains", "files" ([the features file]), "report", "msa_depth" (the
    unpaired+paired MSA rows, `num_alignments`), "coverage" [L], "note"}."""
    path = Path(t.extra["features_npz"])
    feats = _read(path)
    chains = chains_of(feats, path)
    total = sum(len(s) for _, s in chains)
    if total > max_length:
        raise InputError(f"complex '{t.target_id}': {total} residues in all exceeds the "
                         f"configured limit {max_length} (--max-length)", path=path)
    msa = np.asarray(feats["msa"])                                         # [S, L]
    depth = int(feats["num_alignments"]) if "num_alignments" in feats else int(msa.shape[0])
    coverage = (msa[:depth] != GAP_ID).sum(axis=0).astype(int).tolist()
    return {"features": feats, "chains": chains, "files": [path], "report": {},
            "msa_depth": depth, "coverage": coverage, "note": "",
            "records": {cid: {"description": f"{t.target_id} chain {cid}", "sequence": seq}
                        for cid, seq in chains}}
