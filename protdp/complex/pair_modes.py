"""Pair modes, as ColabFold names them (`colabfold_batch --pair-mode`), for the MSAs of a
complex whatever their source (our own search + species pairing, ColabFold's complex a3m, the
user's own pairing):

* `unpaired_paired` (default; AlphaFold-Multimer's own input): the paired block, then each
  chain's unpaired rows block-diagonally.
* `paired`: the paired block only; each chain's unpaired MSA is its query alone (ColabFold
  then gives the model the query as the unpaired MSA).
* `unpaired`: no cross-chain pairing; the paired block is the queries' row alone (ColabFold's
  paired input is then each chain's query), each chain's unpaired rows below.

Homomers pair nothing in AlphaFold (`_is_homomer_or_monomer`), so for them `unpaired` equals
`unpaired_paired`, and `paired` leaves each copy its query alone (as ColabFold).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from protdp.data.parse import Msa
from protdp.complex.features import ChainInput

PAIR_MODES = ("unpaired", "paired", "unpaired_paired")
DEFAULT_PAIR_MODE = "unpaired_paired"


def query_msa(sequence: str, name: str = "query") -> Msa:
    """A one-row MSA: the chain's query, no deletions."""
    return Msa([sequence], np.zeros((1, len(sequence)), np.uint8), [name])


def check_pair_mode(mode: str) -> str:
    if mode not in PAIR_MODES:
        raise ValueError(f"pair mode must be one of {', '.join(PAIR_MODES)}, got {mode!r}")
    return mode


def needs_pairing_alignment(mode: str) -> bool:
    """Whether our own species pairing (a UniProt alignment per chain) is needed."""
    return check_pair_mode(mode) != "unpaired"


def apply_pair_mode(chains: list[ChainInput], mode: str) -> list[ChainInput]:
    """The chains' inputs restricted to what `mode` keeps (new ChainInputs; inputs unchanged)."""
    check_pair_mode(mode)
    if mode == "unpaired_paired":
        return list(chains)
    if mode == "paired":
        return [replace(c, msa=query_msa(c.sequence)) for c in chains]
    return [replace(c, uniprot=None, paired=query_msa(c.sequence)) for c in chains]
