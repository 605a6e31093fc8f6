"""Data cleaning filters (AF2 Supplement 1.2.5 training-set filtering) applied per family.

Each rule has a name; a rejected family records the first failing rule and the build report
counts rejections per rule. Rules: length bounds, resolution cutoff (AF2: 9 Å), a single
residue type > 80 % of the chain (AF2), too many unknown residues, too few observed residues,
exact-duplicate query chains (kept: the mmCIF copy over a PDB one, then the first family id in
sorted order; decided by the store builder because it needs the global view) and a screening hook
(`protdp.data.screening`: long exact k-mer shared with a sequence of concern).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from protdp.config import load_config
from protdp.errors import ConfigError

FILTER_NAMES = ("min_length", "max_length", "resolution", "single_residue_fraction",
                "unknown_fraction", "min_observed_residues", "duplicate_chain", "screening")
# rules decided before the filters (reading, pairing, validation); counted in the report too
INPUT_RULES = ("parse", "structure", "msa", "unpaired", "pairing", "skipped", "internal")


@dataclass
class FilterConfig:
    """Cleaning rules for `protdp data build` (configs/data/default.yaml)."""
    min_length: int = 10
    """Shortest query (residues) kept."""
    max_length: int = 4096
    """Longest query (residues) kept; cropping handles long chains at train time."""
    max_resolution: float = 9.0
    """Resolution cutoff in Å (AF2 uses 9 Å)."""
    allow_unknown_resolution: bool = True
    """Keep structures without a resolution (NMR, header-less extracts)."""
    max_single_residue_fraction: float = 0.8
    """Reject chains where one residue type exceeds this fraction (AF2 rule)."""
    max_unknown_fraction: float = 0.2
    """Reject chains where more than this fraction of residues is X."""
    min_observed_residues: int = 8
    """Fewest residues with an observed CA."""
    deduplicate_chains: bool = True
    """Drop families whose query sequence exactly repeats another family's (mmCIF kept over
    PDB, then the first family id)."""
    screening_fasta: str | None = None
    """FASTA of sequences of concern; families matching it are excluded (None = off)."""
    screening_k: int = 20
    """k-mer length for exact screening matches."""
    screening_mode: str = "kmer"
    """'kmer' (exact) or 'phmmer' (also diverged homologs)."""
    deletion_clip: int = 255
    """Deletion counts are clipped to this value (uint8 storage)."""
    min_pairing_coverage: float = 0.5
    """Fewest paired residues, as a fraction of min(query length, observed residues)."""
    min_pairing_identity: float = 1.0
    """Identity of the MSA query to the structure over aligned non-X residues (1.0: none may
    differ; the MSA must be of this chain)."""
    allow_single_sequence: bool = False
    """Keep a structure whose MSA is absent or unreadable as a single-sequence family (N_seq 1)
    instead of rejecting it."""

    def __post_init__(self):
        if not 1 <= self.min_length <= self.max_length:
            raise ConfigError(f"need 1 <= min_length <= max_length, got {self.min_length}, "
                              f"{self.max_length}")
        if self.max_resolution <= 0:
            raise ConfigError(f"max_resolution must be > 0, got {self.max_resolution}")
        for name in ("max_single_residue_fraction", "max_unknown_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.min_observed_residues < 0:
            raise ConfigError("min_observed_residues must be >= 0")
        if self.screening_mode not in ("kmer", "phmmer"):
            raise ConfigError(f"screening_mode must be 'kmer' or 'phmmer', "
                              f"got '{self.screening_mode}'")
        if not 1 <= self.deletion_clip <= 255:
            raise ConfigError("deletion_clip must be within [1, 255] (uint8 storage)")
        for name in ("min_pairing_coverage", "min_pairing_identity"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be within (0, 1], got {getattr(self, name)}")

    @classmethod
    def load(cls, path_or_obj=None) -> "FilterConfig":
        return load_config(cls, path_or_obj)


def check_family(sequence: str, resolution: float, observed_residues: int,
                 cfg: FilterConfig, screen=None) -> tuple[str, str] | None:
    """First failing rule as (rule name, human-readable reason), or None if the family passes.
    `screen` is a `ScreeningList` (or None)."""
    n = len(sequence)
    if n < cfg.min_length:
        return "min_length", f"query has {n} residues, fewer than min_length={cfg.min_length}"
    if n > cfg.max_length:
        return "max_length", f"query has {n} residues, more than max_length={cfg.max_length}"
    if math.isnan(resolution):
        if not cfg.allow_unknown_resolution:
            return "resolution", "resolution unknown and allow_unknown_resolution is false"
    elif resolution > cfg.max_resolution:
        return "resolution", (f"resolution {resolution:.2f} Å is worse than "
                              f"max_resolution={cfg.max_resolution} Å")
    aa, count = Counter(sequence).most_common(1)[0]
    if count / n > cfg.max_single_residue_fraction:
        return "single_residue_fraction", (f"residue {aa} makes up {count / n:.0%} of the chain "
                                           f"(> {cfg.max_single_residue_fraction:.0%})")
    unk = sequence.count("X") / n
    if unk > cfg.max_unknown_fraction:
        return "unknown_fraction", (f"{unk:.0%} of residues are unknown (X) "
                                    f"(> {cfg.max_unknown_fraction:.0%})")
    if observed_residues < cfg.min_observed_residues:
        return "min_observed_residues", (f"only {observed_residues} residues have an observed "
                                         f"CA (< {cfg.min_observed_residues})")
    if screen is not None:
        hits = screen.hits(sequence)
        if hits:
            h = max(hits, key=lambda h: h.length)
            return "screening", (f"query shares a {h.length}-residue {h.method} match with "
                                 f"'{h.entry}' on the screening list {screen.source}")
    return None


def load_screening(cfg: FilterConfig):
    """The configured ScreeningList, or None."""
    if not cfg.screening_fasta:
        return None
    from protdp.data.screening import ScreeningList
    from protdp.resources import resolve_config

    path = resolve_config(cfg.screening_fasta,   # a path, or `configs/...` of the package
                          what="screening list (FASTA)")
    return ScreeningList.from_fasta(path, k=cfg.screening_k, mode=cfg.screening_mode)
