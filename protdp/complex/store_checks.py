"""Checks of a complex store (`protdp.complex.store`) as hostile input (issue 47): what each
complex declares is checked from the HDF5 headers before anything is read (chain count within
[1, MAX_CHAINS], every chain's arrays of the documented dtypes and of one consistent [N, L]
with N >= 1 and 1 <= L <= MAX_RESIDUES, N <= MAX_MSA_ROWS, no array declaring more bytes than
the file can hold), then the values (finite, in-range coordinates, 0/1 masks, MSA token ids,
the chain's sequence as its MSA's first row, the complex's length attribute). `protdp data
verify` and every training read use them, so a 278 KB store declaring a (2^31 - 1, 45) MSA is
one line, never a 282 GiB allocation."""

from __future__ import annotations

import numpy as np

from protdp.data.atoms import COORD_LIMIT
from protdp.data.bounds import MAX_MSA_ROWS, MAX_RESIDUES, dataset_problem
from protdp.data.residue_constants import NUM_ATOM37
from protdp.data.residues import GAP_ID, sequence_to_ids
from protdp.complex.inputs import MAX_CHAINS

H5_ERRORS = (KeyError, OSError, RuntimeError, ValueError, TypeError, AttributeError)


def chain_specs(n: int, L: int) -> dict[str, tuple[np.dtype, tuple]]:
    """The arrays of one stored chain: name -> (dtype, shape)."""
    return {"msa": (np.dtype(np.uint8), (n, L)), "deletion_matrix": (np.dtype(np.uint8), (n, L)),
            "residue_index": (np.dtype(np.int32), (L,)),
            "all_atom_positions": (np.dtype(np.float32), (L, NUM_ATOM37, 3)),
            "all_atom_mask": (np.dtype(np.uint8), (L, NUM_ATOM37))}


def chain_header_problems(cg, where: str, file_size: int) -> list[str]:
    """One chain group from its headers alone; see the module docstring."""
    try:
        n, L = (int(x) for x in cg["msa"].shape)
        sequence = str(cg.attrs["sequence"])
    except (H5_ERRORS + (ValueError,)):
        return [f"{where}: msa or sequence missing or not [N, L]"]
    if not (1 <= n <= MAX_MSA_ROWS and 1 <= L <= MAX_RESIDUES):
        return [f"{where}: msa declares {n} rows x {L} residues, outside [1, {MAX_MSA_ROWS}] x "
                f"[1, {MAX_RESIDUES}] (protdp.data.bounds)"]
    if len(sequence) != L:
        return [f"{where}: sequence has {len(sequence)} residues, the msa {L}"]
    out = []
    for name, (dtype, shape) in chain_specs(n, L).items():
        try:
            ds = cg[name]
            got = (ds.dtype, tuple(ds.shape or ()))
        except H5_ERRORS:
            out.append(f"{where}: {name} missing or unreadable")
            continue
        if got != (dtype, shape):
            out.append(f"{where}: {name} is {got[0]} {got[1]}, expected {dtype} {shape}")
        else:
            out += [p for p in [dataset_problem(ds, file_size, f"{where}: {name}")] if p]
    return out


def chain_value_problems(rec: dict, where: str) -> list[str]:
    """Values of one chain as read (CHAIN_ARRAYS + sequence)."""
    pos, mask = rec["all_atom_positions"], rec["all_atom_mask"]
    out = []
    if not np.isfinite(pos).all() or (np.abs(pos) > COORD_LIMIT).any():
        out.append(f"{where}: non-finite or absurd (|x| > {COORD_LIMIT}) coordinates")
    if (mask > 1).any():
        out.append(f"{where}: all_atom_mask is not 0/1")
    if (rec["msa"] > GAP_ID).any():
        out.append(f"{where}: msa holds token ids above {GAP_ID}")
    elif not np.array_equal(rec["msa"][0], sequence_to_ids(str(rec["sequence"]))):
        out.append(f"{where}: msa row 0 is not the chain's sequence")
    return out


def complex_header_problems(g, cid: str, file_size: int) -> list[str]:
    """One complex group from its headers: chain count and every chain's declared sizes."""
    try:
        k = int(g.attrs["num_chains"])
        length = int(g.attrs["length"])
    except H5_ERRORS:
        return [f"complex {cid}: num_chains / length attributes missing or unreadable"]
    if not 1 <= k <= MAX_CHAINS:
        return [f"complex {cid}: num_chains {k} outside [1, {MAX_CHAINS}]"]
    out, total = [], 0
    for i in range(k):
        if str(i) not in g:
            return [f"complex {cid}: chain group {i} missing"]
        found = chain_header_problems(g[str(i)], f"complex {cid} chain {i}", file_size)
        out += found
        if not found:
            total += int(g[str(i)]["msa"].shape[1])
    if not out and total != length:
        out.append(f"complex {cid}: length attribute {length} differs from its chains' {total}")
    return out
