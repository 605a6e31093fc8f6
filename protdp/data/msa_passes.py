"""One MSA sample per recycling pass, produced when the pass asks for it (AF2
`resample_msa_in_recycling`; issue 47, "memory per recycle is bounded").

`featurize(..., msa_samples=P)` builds the P samples up front, [P, N, L, ...] per MSA key: with
512 clusters, 5,120 extra rows and L ~ 1,000, about 0.3 GB a pass, so `--num-recycles 20` held
6 GB before the model ran. Here an example keeps what every sample is drawn from (the raw MSA
[N_all, L] uint8, its deletions, the crop window, the profile and the seed: a size that does not
grow with P) in an `MsaPasses`, and its MSA keys are pass 0's. Pass i's keys are built when the
model reaches pass i (`protdp.model.inputs.select_pass`) and dropped after it, so at most two
passes (0 and the current one) exist at a time, whatever P is.

Pass i's sample is bit for bit the up-front layout's sample i: both draw it from its own stream
`features.pass_rng(seed, i)` through the same `sample_plan` and `msa_sample`; the nearest-centre
assignment is exact integer counting either way (the up-front path only shares the rows'
one-hot encoding between samples, which this one does not hold: its size is N_all x L x 21).

`MsaPasses` holds numpy arrays only: picklable, so prefetch workers ship it and DAP leaders
broadcast it (`inference/prefetch.py`, `inference/dap.py`); the consumer produces the passes.
`collate` stacks the sources of B examples into a `PassBatch`, whose passes are [B, ...],
padded as `collate` pads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from protdp.data.features import (DEFAULT_MAX_EXTRA_MSA, MSA_KEYS, PASSES_KEY, msa_sample,
                                  pass_rng, query_family, residue_features, sample_plan,
                                  sampling_inputs, stack_padded)


@dataclass(eq=False)
class MsaPasses:
    """The MSA samples of one example, pass by pass: `sample(i)` is `featurize`'s sample i."""

    msa: np.ndarray                 # uint8 [N_all, L_full]
    deletions: np.ndarray           # [N_all, L_full] deletion counts
    window: slice                   # the example's crop
    seed: int
    num_passes: int                 # P: passes beyond P - 1 read sample P - 1
    max_rows: int
    max_extra: int
    mask_fraction: float
    profile: np.ndarray | None      # float64 [L_full, 23] (BERT masking), None without
    produced: list[int] = field(default_factory=list)   # the pass indices built, in order

    def sample(self, index: int) -> dict[str, torch.Tensor]:
        """Sample `index`'s MSA keys [N, L, ...] (unbatched), as `featurize` converts them."""
        if not 0 <= index < self.num_passes:
            raise IndexError(f"MSA sample {index} of {self.num_passes}")
        plan = sample_plan(self.msa, pass_rng(self.seed, index), max_rows=self.max_rows,
                           max_extra=self.max_extra, mask_fraction=self.mask_fraction,
                           profile=self.profile)
        self.produced.append(index)
        arrays = msa_sample(self.msa, self.deletions, self.window, plan)
        return {k: torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in MSA_KEYS}

    def pass_features(self, index: int) -> dict[str, torch.Tensor]:
        """The MSA keys of pass `index` with the example's leading shape (none)."""
        return self.sample(index)

    @staticmethod
    def stack(sources: list["MsaPasses"]) -> "PassBatch":
        return PassBatch(list(sources))

    def __getstate__(self) -> dict:     # a shipped source starts counting afresh
        return {**self.__dict__, "produced": []}


@dataclass(eq=False)
class PassBatch:
    """The `MsaPasses` of the B examples of a batch: pass i's MSA keys [B, N, L, ...]."""

    sources: list[MsaPasses]

    def __post_init__(self):
        counts = {s.num_passes for s in self.sources}
        if len(counts) != 1:
            raise ValueError(f"collate: examples disagree on the number of MSA samples {counts}")

    @property
    def num_passes(self) -> int:
        return self.sources[0].num_passes

    @property
    def produced(self) -> list[int]:
        return [i for s in self.sources for i in s.produced]

    def pass_features(self, index: int) -> dict[str, torch.Tensor]:
        samples = [s.sample(index) for s in self.sources]
        return {k: stack_padded([x[k] for x in samples], k) for k in MSA_KEYS}

    @staticmethod
    def stack(sources: list["PassBatch"]) -> "PassBatch":
        raise ValueError("collate: examples are already batches")


def featurize_passes(family: dict, *, crop_size: int | None, max_msa_rows: int, seed: int,
                     training: bool = True, max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
                     msa_samples: int = 1, masked_msa_fraction: float | None = None) -> dict:
    """`features.featurize` with the same arguments, its MSA keys pass 0's and the later passes
    left to `PASSES_KEY` (an `MsaPasses`). With one sample, `featurize`'s example itself."""
    if max_msa_rows < 1 or max_extra_msa_rows < 0 or msa_samples < 1:
        raise ValueError("max_msa_rows and msa_samples must be >= 1, max_extra_msa_rows >= 0")
    msa, dels, aatype, window, fraction, profile = sampling_inputs(
        family, crop_size=crop_size, seed=seed, training=training,
        masked_msa_fraction=masked_msa_fraction)
    source = MsaPasses(msa, dels, window, int(seed), msa_samples, max_msa_rows,
                       max_extra_msa_rows, fraction, profile)
    out = residue_features(family, aatype, window)
    out.update(source.sample(0))
    if msa_samples > 1:
        out[PASSES_KEY] = source
    return out


def query_features(sequence: str, msa=None, *, max_msa_rows: int = 512, seed: int = 0,
                   family_id: str = "query", max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
                   msa_samples: int = 1, masked_msa_fraction: float = 0.0) -> dict:
    """`features.featurize_query` with the passes built when the model reaches them."""
    return featurize_passes(query_family(sequence, msa, family_id), crop_size=None,
                            max_msa_rows=max_msa_rows, seed=seed, training=False,
                            max_extra_msa_rows=max_extra_msa_rows, msa_samples=msa_samples,
                            masked_msa_fraction=masked_msa_fraction)
