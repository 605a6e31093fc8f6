"""Compact host examples: what a worker ships instead of featurized float tensors.

`featurize` (docs/batch_format.md) returns, at AF2's training sizes (crop 256, 512 clusters,
1,024 extra rows, 4 MSA samples), ~88 MB per example, most of it the float32 cluster profile
[P, N, L, 23] and int64 / float32 copies of token rows. The same example is fully described by
the cropped MSA and its deletion counts once (int8 / a code into a small float table), plus per
MSA sample the random choices of `features.sample_plan` (row order, BERT-masked centre tokens
and their selection, the centre of every extra row, the kept extra rows) and the mean deletion
value per centre (float32, computed here so its arctan is numpy's). `expand.expand_example`
rebuilds exactly `featurize`'s tensors from it on any device.

Keys (N_all MSA rows, N centres, E_all = N_all - N extra rows, E kept, P samples, L cropped):
`msa_rows` int8 [N_all, L]; `del_code` uint8/int16/int32 [N_all, L] with `del_table` float32
[T] (deletion_value of each distinct count) and `del_present` bool [T] (count > 0); per sample
`order` int32 [P, N_all] (centres first), `centre_msa` int8 [P, N, L], `bert_mask` bool
[P, N, L], `assignment` int32 [P, E_all], `keep` int32 [P, E], `deletion_mean_value` float32
[P, N, L]; `msa_samples` P (0 means "no pass axis"); residue keys as numpy arrays.
"""

from __future__ import annotations

import numpy as np
import torch

from protdp.data.features import (DEFAULT_MAX_EXTRA_MSA, cluster_deletion_mean, deletion_value,
                                  plan_example, residue_features)


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values [T], smallest-integer codes into them [same shape as values])."""
    table, codes = np.unique(values, return_inverse=True)
    dtype = np.uint8 if len(table) <= 256 else np.int16 if len(table) <= 32767 else np.int32
    return table, codes.reshape(values.shape).astype(dtype)


def compact_example(family: dict, *, crop_size: int | None, max_msa_rows: int, seed: int,
                    training: bool = True, max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
                    msa_samples: int = 1, masked_msa_fraction: float | None = None) -> dict:
    """The compact form of `featurize(family, ...)` with the same arguments (numpy arrays,
    picklable, no float one-hots)."""
    msa, dels, aatype, window, plans = plan_example(
        family, crop_size=crop_size, max_msa_rows=max_msa_rows, seed=seed, training=training,
        max_extra_msa_rows=max_extra_msa_rows, msa_samples=msa_samples,
        masked_msa_fraction=masked_msa_fraction)
    msa_w, dels_w = msa[:, window], dels[:, window]                  # [N_all, L]
    table, codes = _codes(dels_w)
    order, centre_msa, bert, assignment, keep, mean_del = [], [], [], [], [], []
    for plan in plans:
        centre_rows, extra_rows = plan["centre_rows"], plan["extra_rows"]
        order.append(np.concatenate([centre_rows, extra_rows]))
        centre_msa.append(plan["msa"][:, window])
        bert.append(plan["bert_mask"][:, window])
        assignment.append(plan["assignment"])
        keep.append(plan["keep"])
        mean_del.append(deletion_value(cluster_deletion_mean(
            dels_w[centre_rows], dels_w[extra_rows], plan["assignment"]).astype(np.float32)))
    residue = residue_features(family, aatype, window)
    return {
        **{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in residue.items()},
        "msa_rows": msa_w.astype(np.int8), "del_code": codes,
        "del_table": deletion_value(table), "del_present": table > 0,
        "order": np.stack(order).astype(np.int32), "centre_msa": np.stack(centre_msa).astype(np.int8),
        "bert_mask": np.stack(bert), "assignment": np.stack(assignment).astype(np.int32),
        "keep": np.stack(keep).astype(np.int32), "deletion_mean_value": np.stack(mean_del),
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
