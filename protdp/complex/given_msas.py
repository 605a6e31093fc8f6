r"""A complex's MSAs given by the user, found per complex in `--msa-dir` (`protdp predict`,
`protdp complex features`), before the per-chain folders `protdp msa search --complexes`
writes:

1. `<msa-dir>/<complex>.a3m` (or `.a3m.gz`): ColabFold's complex a3m
   (`protdp.complex.colabfold_a3m`).
2. `<msa-dir>/<complex>/paired/<chain id>.a3m`, one file per chain (chain ids A, B, ... in input
   order), rows already paired by the user's own rule (taxonomy, genome position, ...): row i of
   every chain's file belongs together; row 0 is the chain's query. **No partner**: a row of
   gaps only (`-` for every query column; any header, `>no_partner` by convention) in the
   file of the chain that has none. Rows are kept as given (not deduplicated, not re-paired).
   Optional `<msa-dir>/<complex>/unpaired/<chain id>.a3m` (any MSA format `protdp predict`
   reads, query first): that chain's unpaired rows; a chain without one has its query alone.

Either way the rows go through AlphaFold-Multimer's feature assembly as rows of our own species
pairing would (`ChainInput.paired`: deduplication of unpaired rows against paired ones, the
crop to 1,024 paired rows, merging). A homomer pairs nothing (AlphaFold): its paired files are
read and checked but only its unpaired rows are used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protdp.data.parse import Msa, parse_msa
from protdp.data.safeio import check_readable, read_text
from protdp.errors import InputError
from protdp.complex.colabfold_a3m import (MAX_COMPLEX_A3M_BYTES, chain_inputs_from_a3m,
                                           decode_rows, find_complex_a3m, read_complex_a3m)
from protdp.complex.features import ChainInput
from protdp.complex.pair_modes import query_msa

PAIRED_DIR = "paired"
UNPAIRED_DIR = "unpaired"
NO_PARTNER_NAME = "no_partner"          # the suggested header of a gap-only row


def _chain_file(folder: Path, chain_id: str) -> Path | None:
    for suffix in (".a3m", ".a3m.gz"):
        p = folder / f"{chain_id}{suffix}"
        if p.exists() or p.is_symlink():
            check_readable(p)
            return p
    return None


def read_paired_chain(path: Path, sequence: str) -> Msa:
    """One chain's paired rows, in file order (InputError naming the line otherwise)."""
    rows = decode_rows(read_text(path, MAX_COMPLEX_A3M_BYTES), path, len(sequence))
    if not rows:
        raise InputError("no '>' records (row 0 must be the chain's query)", path=path)
    name, seq, _, line = rows[0]
    if seq != sequence:
        raise InputError(f"row 0 ('{name}') is not the chain's query sequence", path=path,
                         line=line)
    dels = np.clip(np.stack([d for _, _, d, _ in rows]), 0, 255).astype(np.uint8)
    return Msa([s for _, s, _, _ in rows], dels,
               [n if (np.frombuffer(s.encode(), np.uint8) != ord("-")).any() else NO_PARTNER_NAME
                for n, s, _, _ in rows], [str(path)])


def user_paired_inputs(folder: Path, chains: list[tuple[str, str]]
                       ) -> tuple[list[ChainInput], list[Path]]:
    """`<folder>/paired/<chain>.a3m` (+ optional `unpaired/<chain>.*`) -> ChainInputs."""
    out, files, first = [], [], None
    for cid, seq in chains:
        path = _chain_file(folder / PAIRED_DIR, cid)
        if path is None:
            raise InputError(f"chain {cid}: no paired file {cid}.a3m (every chain needs one, "
                             f"row i of every file belonging together)", path=folder / PAIRED_DIR)
        paired = read_paired_chain(path, seq)
        if first is None:
            first = (cid, paired.depth)
        elif paired.depth != first[1]:
            raise InputError(f"{paired.depth} rows, chain {first[0]}'s paired file has "
                             f"{first[1]}: row i of every chain's file belongs together (a row "
                             f"of gaps where a chain has no partner)", path=path)
        unpaired_files = sorted((folder / UNPAIRED_DIR).glob(f"{cid}.*")) \
            if (folder / UNPAIRED_DIR).is_dir() else []
        msa = query_msa(seq)
        if unpaired_files:
            msa = parse_msa(unpaired_files[0])
            if msa.query != seq:
                raise InputError("the unpaired MSA's query is not the chain's sequence",
                                 path=unpaired_files[0], line=1)
        files += [path] + unpaired_files[:1]
        out.append(ChainInput(cid, seq, msa, None, None, paired))
    return out, files


def given_complex_inputs(msa_dir: Path, name: str, chains: list[tuple[str, str]]
                         ) -> tuple[list[ChainInput], list[Path]] | None:
    """The complex's user-given MSAs (ColabFold's file, else the user's paired folder) as
    ChainInputs and the files read; None when the complex has neither (then the per-chain
    search folders are read)."""
    a3m = find_complex_a3m(msa_dir, name)
    if a3m is not None:
        return chain_inputs_from_a3m(read_complex_a3m(a3m, chains=chains), chains), [a3m]
    folder = Path(msa_dir) / name
    if (folder / PAIRED_DIR).is_dir():
        return user_paired_inputs(folder, chains)
    return None
