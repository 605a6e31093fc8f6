"""Compact host examples: what a worker ships instead of featurized float tensors.

`featurize` (docs/batch_format.md) returns, at AF2's training sizes (crop 256, 512 clusters,
1,024 extra rows, 4 MSA samples), 88 MB per example, most of it the float32 cluster profile
[P, N, L, 23] and int64 / float32 copies of token rows. The same example is fully described by
the MSA once (int8) with its deletion counts (a code into small tables), plus per MSA sample
the random choices of `features.sample_plan` (row order, BERT-masked centre tokens and their
selection, the kept extra rows). The host does only the cheap, random part; the expensive,
deterministic part, the nearest-centre assignment of every extra row over the full length
(AF2 `nearest_neighbor_clusters`, an [E_all, L*21] x [L*21, N] integer product) and the
cluster summaries, runs on the device in `expand.expand_example`, which rebuilds exactly
`featurize`'s tensors.

Keys (N_all MSA rows, N centres, E kept extra rows, P samples, L cropped, L_full full length):
`msa_full` int8 [N_all, L_full]; `window` int64 [2] (crop start, stop); `del_code`
uint8/int16/int32 [N_all, L] indexing `del_count` float64 [T] (the distinct deletion counts),
`del_table` float32 [T] (their deletion_value) and `del_present` bool [T] (count > 0); per
sample `order` int32 [P, N_all] (centres first), `centre_msa` int8 [P, N, L_full] (BERT-masked),
`bert_mask` bool [P, N, L], `keep` int32 [P, E]; `msa_samples` P (0: no pass axis); residue
keys as numpy arrays. Any other key (`COMPACT_KEYS` lists the compact ones) is an example
key shipped as it is: a template model's worker adds its small template features
(`protdp.templates.training.with_templates` wraps `compact_example` as it wraps `featurize`).
"""

from __future__ import annotations

import numpy as np
import torch

from protdp.data.features import (DEFAULT_MAX_EXTRA_MSA, deletion_value, plan_example,
                                  residue_features)


COMPACT_KEYS = frozenset({"msa_full", "window", "del_code", "del_count", "del_table",
                          "del_present", "order", "centre_msa", "bert_mask", "keep", "msa_samples"})


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values [T], smallest-integer codes into them [same shape as values])."""
    table, codes = np.unique(values, return_inverse=True)
    dtype = np.uint8 if len(table) <= 256 else np.int16 if len(table) <= 32767 else np.int32
    return table, codes.reshape(values.shape).astype(dtype)


def compact_example(family: dict, *, crop_size: int | None, max_msa_rows: int, seed: int,
                    training: bool = True, max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
                    msa_samples: int = 1, masked_msa_fraction: float | None = None) -> dict:
    """The compact form of `featurize(family, ...)` with the same arguments (numpy arrays,
    picklable, no float one-hots, no cluster assignment)."""
    msa, dels, aatype, window, plans = plan_example(
        family, crop_size=crop_size, max_msa_rows=max_msa_rows, seed=seed, training=training,
        max_extra_msa_rows=max_extra_msa_rows, msa_samples=msa_samples,
        masked_msa_fraction=masked_msa_fraction, assign=False)
    counts, codes = _codes(dels[:, window])
    residue = residue_features(family, aatype, window)
    return {
        **{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in residue.items()},
        "msa_full": msa.astype(np.int8), "window": np.array([window.start, window.stop], np.int64),
        "del_code": codes, "del_count": counts.astype(np.float64),
        "del_table": deletion_value(counts), "del_present": counts > 0,
        "order": np.stack([np.concatenate([p["centre_rows"], p["extra_rows"]])
                           for p in plans]).astype(np.int32),
        "centre_msa": np.stack([p["msa"] for p in plans]).astype(np.int8),
        "bert_mask": np.stack([p["bert_mask"][:, window] for p in plans]),
        "keep": np.stack([p["keep"] for p in plans]).astype(np.int32),
        "msa_samples": msa_samples if msa_samples > 1 else 0,
    }


def nbytes(example: dict) -> int:
    """Bytes of the array payload of an example (compact or featurized)."""
    total = 0
    for v in example.values():
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, np.ndarray):
            total += v.nbytes
    return total
