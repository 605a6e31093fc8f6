"""Training corpora: the experimental store and, optionally, self-distillation data.

AF2 (supplement §1.3) trained on a mix of 75 % self-distillation examples and 25 % PDB chains.
Here each corpus is a `Source` (its HDF5 store and this rank's `FamilySampler`); for every
micro-batch `pick_source` draws which corpus it comes from, from a seed of (run seed,
iteration, micro-batch, rank), so a resumed run replays the same choices. Every source has the
same features and graph, so ranks may draw different sources in one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from protdp.data.sampler import FamilySampler
from protdp.data.store import FamilyStore

PDB, DISTILLATION = "pdb", "distillation"


def pick_source(seed: int, distillation_fraction: float, has_distillation: bool) -> str:
    """The corpus of one micro-batch (a pure function of its seed)."""
    if not has_distillation or distillation_fraction <= 0:
        return PDB
    return DISTILLATION if np.random.default_rng(seed).random() < distillation_fraction else PDB


@dataclass
class Source:
    """One corpus: its store, this rank's sampler and its loss weight."""

    name: str
    store: FamilyStore
    sampler: FamilySampler
    loss_weight: float = 1.0
    _iter: object = field(default=None, repr=False)

    def next_micro_batch(self) -> list[str]:
        """This rank's next micro-batch of family ids, epoch after epoch."""
        if self._iter is None:
            self._iter = self._micro_batches()
        return next(self._iter)

    def _micro_batches(self):
        while True:
            for fids in self.sampler:
                yield list(fids)
            self.sampler.set_epoch(self.sampler.epoch + 1)
