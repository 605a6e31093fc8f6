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
import io
import zipfile
from pathlib import Path

import numpy as np

from protdp.data.bounds import MAX_FEATURES_FILE_BYTES
from protdp.data.npz_headers import read_npz
from protdp.data.safeio import check_regular_file, read_raw
from protdp.data.residues import GAP_ID, RESTYPES
from protdp.errors import InputError, ProtdpError
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


def read_features_bytes(path: Path) -> tuple[bytes, str]:
    """(the bytes of a features file, their sha256), read once: the digest a run records is
    that of the very bytes it loads (never a second read of a file that may have changed). A
    file over MAX_FEATURES_FILE_BYTES is one error, before it is read."""
    bound = MAX_FEATURES_FILE_BYTES
    size = check_regular_file(path).st_size
    if size > bound:
        raise InputError(f"{size:,} bytes, over the {bound:,}-byte bound on a features file "
                         "(MAX_FEATURES_FILE_BYTES, protdp.data.bounds)", path=path)
    data = read_raw(path, bound)
    return data, hashlib.sha256(data).hexdigest()


def _read(path: Path, keys: tuple[str, ...] | None = None, *,
          data: bytes | None = None) -> dict[str, np.ndarray]:
    """The features of `path` (never unpickled, headers checked first:
    `protdp.data.npz_headers.read_npz`), or only its `keys` (the other members, the MSA and
    templates, not decompressed), read from `data` (the file's bytes) when given; a file
    without the keys a multimer features file has is one error naming it."""
    source = path if data is None else data
    read_npz(source, FEATURES_WHAT, keys=(), path=path)  # a readable .npz, nothing decompressed
    with zipfile.ZipFile(path if data is None else io.BytesIO(data)) as zf:
        members = {n.removesuffix(".npy") for n in zf.namelist()}
    missing = [k for k in REQUIRED_KEYS if k not in members]
    if missing:
        raise InputError(f"not a multimer features file (no {', '.join(missing)}; write it "
                         "with `protdp complex features`)", path=path)
    return read_npz(source, FEATURES_WHAT, keys=keys, path=path)


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
    files' names and sha256s, each file read once (`read_features_bytes`), its chain arrays
    (`CHAIN_KEYS`, the only ones decompressed) parsed from the bytes hashed (the digest kept as
    the target's `features_sha256`). A file that cannot be read is that
    target's error (one row)."""
    targets, digest = [], hashlib.sha256()
    for index, path in enumerate(sorted(folder.glob(f"*/{FEATURES_FILE}"))):
        name = path.parent.name
        t = Target(index, name, name, "", 1, extra={"features_npz": str(path), "source": path})
        try:
            data, sha = read_features_bytes(path)
            t.raw_sequence = ":".join(s for _, s in chains_of(
                _read(path, CHAIN_KEYS, data=data), path))
            t.extra["features_sha256"] = sha
            digest.update(f"{name}\0{t.extra['features_sha256']}\n".encode())
        except ProtdpError as exc:
            t.error = str(exc)
        targets.append(t)
    _assign_names(targets, folder)
    return targets, digest.hexdigest()


def features_inputs(t: Target, *, max_length: int) -> dict:
    """The model input of one precomputed complex, shaped as `complexes.build_features`'s:
    {"features", "chains", "files" ([the features file]), "sha256s" ([the sha256 of the bytes
    loaded]), "report", "msa_depth" (the unpaired+paired MSA rows, `num_alignments`),
    "coverage" [L], "note"}. The file is read once; bytes other than those hashed at start-up
    (`features_sha256`) are that target's error, never parsed."""
    path = Path(t.extra["features_npz"])
    data, digest = read_features_bytes(path)
    check_unchanged(t, [digest], path)
    feats = _read(path, data=data)
    chains = chains_of(feats, path)
    total = sum(len(s) for _, s in chains)
    if total > max_length:
        raise InputError(f"complex '{t.target_id}': {total} residues in all exceeds the "
                         f"configured limit {max_length} (--max-length)", path=path)
    msa = np.asarray(feats["msa"])                                         # [S, L]
    depth = int(feats["num_alignments"]) if "num_alignments" in feats else int(msa.shape[0])
    coverage = (msa[:depth] != GAP_ID).sum(axis=0).astype(int).tolist()
    return {"features": feats, "chains": chains, "files": [path], "sha256s": [digest],
            "report": {},
            "msa_depth": depth, "coverage": coverage, "note": "",
            "records": {cid: {"description": f"{t.target_id} chain {cid}", "sequence": seq}
                        for cid, seq in chains}}


def check_unchanged(t: Target, digests: list[str], path: Path | None) -> None:
    """A precomputed complex's features.npz must be the bytes hashed at start-up (its
    `features_sha256`, in the run's input digest): a file replaced meanwhile is that target's
    one-line error, never predicted under the digest the run recorded for the earlier file."""
    started = t.extra.get("features_sha256")
    if started is not None and digests != [started]:
        now = digests[0][:12] if digests else "none"
        raise InputError(f"changed since this run started (sha256 {started[:12]}... then, "
                         f"{now}... now): start the run again to predict the new file",
                         path=path)
