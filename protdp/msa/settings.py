"""Search settings: AlphaFold2's jackhmmer defaults, for pyhmmer and for the HMMER binary.

AF2 v2.3.2 builds its UniRef90 and MGnify MSAs with `alphafold/data/tools/jackhmmer.py`
(`Jackhmmer(n_iter=1, e_value=0.0001, filter_f1=0.0005, filter_f2=0.00005,
filter_f3=0.0000005, z_value=None, dom_e=None, incdom_e=None)`, i.e. the command line
`jackhmmer -N 1 -E 0.0001 --incE 0.0001 --F1 0.0005 --F2 0.00005 --F3 0.0000005`) and keeps the
first `uniref_max_hits=10000` (UniRef90) or `mgnify_max_hits=501` (MGnify) sequences of the
Stockholm output (`alphafold/data/pipeline.py`, `parsers.truncate_stockholm_msa`). AF2 passes no
`--domE`/`--incdomE`, so HMMER's own defaults apply; they are written out here (10 and jackhmmer's
0.001) because pyhmmer's `Pipeline` defaults differ (incdomE 0.01) and both engines must get the
same explicit values. `--seed 42` is HMMER's default.
"""

from __future__ import annotations

from dataclasses import dataclass

UNIREF90_MAX_SEQUENCES = 10_000   # AF2 pipeline.py uniref_max_hits
MGNIFY_MAX_SEQUENCES = 501        # AF2 pipeline.py mgnify_max_hits


@dataclass(frozen=True)
class SearchSettings:
    """jackhmmer-style iterative search settings (recorded in provenance and in the resume
    fingerprint of every searched MSA)."""

    iterations: int = 1
    """Search rounds (`-N`); AF2 uses 1. Stops early when no new sequence is included."""
    evalue: float = 1e-4
    """Per-sequence reporting E-value (`-E`), AF2 e_value."""
    inclusion_evalue: float = 1e-4
    """Per-sequence inclusion E-value (`--incE`): hits kept in the MSA; AF2 e_value."""
    domain_evalue: float = 10.0
    """Per-domain reporting E-value (`--domE`); HMMER default (AF2 sets none)."""
    inclusion_domain_evalue: float = 1e-3
    """Per-domain inclusion E-value (`--incdomE`); jackhmmer's default (AF2 sets none)."""
    f1: float = 5e-4
    """MSV filter pass fraction (`--F1`), AF2 filter_f1."""
    f2: float = 5e-5
    """Viterbi filter pass fraction (`--F2`), AF2 filter_f2."""
    f3: float = 5e-7
    """Forward filter pass fraction (`--F3`), AF2 filter_f3."""
    max_sequences: int = UNIREF90_MAX_SEQUENCES
    """Rows kept per database, query included, in hit order (AF2 truncate_stockholm_msa;
    10,000 for UniRef90, 501 for MGnify)."""
    seed: int = 42
    """Random seed of the HMM builder (`--seed`, HMMER default)."""

    def __post_init__(self):
        if not 1 <= self.iterations <= 100:
            raise ValueError(f"iterations must be in 1..100, got {self.iterations}")
        if self.max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {self.max_sequences}")
        for name in ("evalue", "inclusion_evalue", "domain_evalue", "inclusion_domain_evalue"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        for name in ("f1", "f2", "f3"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")

    def pipeline_options(self) -> dict:
        """Keyword arguments of `pyhmmer.plan7.Pipeline`."""
        return dict(E=self.evalue, incE=self.inclusion_evalue, domE=self.domain_evalue,
                    incdomE=self.inclusion_domain_evalue, F1=self.f1, F2=self.f2, F3=self.f3,
                    seed=self.seed)

    def jackhmmer_args(self, cpus: int) -> list[str]:
        """The same settings as HMMER `jackhmmer` flags (the reference the tests and the
        benchmark run; AF2's flag order)."""
        return ["--F1", repr(self.f1), "--F2", repr(self.f2), "--F3", repr(self.f3),
                "--incE", repr(self.inclusion_evalue), "-E", repr(self.evalue),
                "--domE", repr(self.domain_evalue), "--incdomE", repr(self.inclusion_domain_evalue),
                "--seed", str(self.seed), "--cpu", str(cpus), "-N", str(self.iterations)]
