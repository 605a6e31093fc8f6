"""Compact host examples (`compact`) -> `featurize`'s tensors, on the training device.

Runs where the batch is consumed: on a GPU the int8 rows are copied (pinned, `non_blocking`)
and everything float is built there, so the host never materializes the 23-channel cluster
profile; `msa_feat` / `extra_msa_feat` are then built by the model (`protdp.model.inputs`).
Per MSA sample (AF2 supplement §1.2.7-1.2.9; `nearest_neighbor_clusters`, `summarize_clusters`,
`crop_extra_msa`): the nearest centre of every extra row over the full length (exact integer
agreement counts as an int8 product, ties to the first centre: `torch.argmax`), the cluster
profile from integer counts, the mean deletion value, the kept extra rows.

Equal to `featurize` bit for bit on the CPU: counts are exact integers, divisions the same
IEEE float64 operations as numpy's. The one transcendental, arctan of the mean deletion count,
is torch's float64 atan (numpy's may differ in the last float64 bit; after the float32
rounding both gave identical values on 5 million random inputs).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from protdp.data.features import AGREEMENT_CLASSES, collate
from protdp.data.pipeline.compact import COMPACT_KEYS
from protdp.data.residues import NUM_MSA_TOKENS


def to_device(example: dict, device: torch.device) -> dict:
    """numpy arrays -> tensors on `device` (pinned host memory + non_blocking copy on CUDA)."""
    out = {}
    for k, v in example.items():
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v if v.flags.c_contiguous else v.copy())
        if isinstance(v, torch.Tensor) and v.device != device:
            if device.type == "cuda" and v.device.type == "cpu":
                v = v.pin_memory().to(device, non_blocking=True)
            else:
                v = v.to(device)
        out[k] = v
    return out


def _one_hot(tokens: torch.Tensor) -> torch.Tensor:
    """[R, L] tokens -> int8 [R, L*21] agreement one-hot (residues and X; gaps, mask: 0)."""
    classes = torch.arange(AGREEMENT_CLASSES, dtype=torch.int8, device=tokens.device)
    return (tokens.to(torch.int8).unsqueeze(-1) == classes).view(torch.int8).reshape(tokens.shape[0], -1)


def _counts(rows: torch.Tensor, centres_t: torch.Tensor) -> torch.Tensor:
    """int8 [R, K] x int8 [K, N] -> exact agreement counts [R, N] (int8 product where torch has
    one for these shapes, else float32: 0/1 inputs are exact in TF32/bf16 and K < 2^24)."""
    try:
        return torch._int_mm(rows, centres_t)
    except (AttributeError, RuntimeError, NotImplementedError):
        return rows.float() @ centres_t.float()


def assign_rows(one_hot_rows: torch.Tensor, centres: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """Nearest centre (most agreeing, first on ties) of every row: one_hot_rows int8
    [R, L*21], centres tokens [N, L] -> int64 [R] (AF2 `nearest_neighbor_clusters`)."""
    centres_t = _one_hot(centres).T.contiguous()                              # [L*21, N]
    return torch.cat([torch.argmax(_counts(one_hot_rows[i:i + chunk], centres_t), dim=1)
                      for i in range(0, one_hot_rows.shape[0], chunk)]
                     or [torch.zeros(0, dtype=torch.int64, device=centres.device)])


def _deletion_value(x: torch.Tensor) -> torch.Tensor:
    """2/pi * arctan(d / 3) in float64 -> float32 (as `features.deletion_value`)."""
    return (2.0 / math.pi * torch.atan(x.double() / 3.0)).float()


def _sample(c: dict, p: int, rows_oh: torch.Tensor) -> dict[str, torch.Tensor]:
    """The cluster and extra keys of MSA sample p."""
    start, stop = (int(x) for x in c["window"].tolist())
    full = c["msa_full"]                                             # int8 [N_all, L_full]
    rows = full[:, start:stop]                                       # [N_all, L]
    codes = c["del_code"].long()                                     # [N_all, L]
    table, present, count = c["del_table"], c["del_present"].float(), c["del_count"]
    centres_full = c["centre_msa"][p].long()                         # [N, L_full] (BERT-masked)
    centres = centres_full[:, start:stop]
    n, L = centres.shape
    dev = full.device
    order = c["order"][p].long()
    centre_rows, extra_rows = order[:n], order[n:]
    assignment = assign_rows(rows_oh.index_select(0, extra_rows), centres_full)   # [E_all]
    extra_all = rows[extra_rows].long()                              # [E_all, L]
    # integer counts of (centre, column, token) over members and the centre itself
    cell = (assignment[:, None] * L + torch.arange(L, device=dev)[None, :]).reshape(-1)
    own = torch.arange(n * L, device=dev) * NUM_MSA_TOKENS + centres.reshape(-1)
    counts = torch.bincount(torch.cat([cell * NUM_MSA_TOKENS + extra_all.reshape(-1), own]),
                            minlength=n * L * NUM_MSA_TOKENS).reshape(n, L, NUM_MSA_TOKENS)
    denominator = 1e-6 + (1.0 + torch.bincount(assignment, minlength=n).double())[:, None]  # [N, 1]
    centre_codes, extra_codes_all = codes[centre_rows], codes[extra_rows]
    deletions = count[centre_codes] + torch.bincount(
        cell, weights=count[extra_codes_all].reshape(-1), minlength=n * L).reshape(n, L)
    keep = c["keep"][p].long()
    extra, extra_codes = extra_all[keep], extra_codes_all[keep]       # [E, L]
    extra_mask = torch.ones(extra.shape, dtype=torch.float32, device=dev)
    if extra.shape[0] == 0:      # one padding row, as featurize
        extra = torch.zeros((1, L), dtype=torch.int64, device=dev)
        extra_mask = torch.zeros((1, L), dtype=torch.float32, device=dev)
        extra_has, extra_value = extra_mask.clone(), extra_mask.clone()
    else:
        extra_has, extra_value = present[extra_codes], table[extra_codes]
    return {
        "msa": centres, "msa_mask": torch.ones((n, L), dtype=torch.float32, device=dev),
        "has_deletion": present[centre_codes], "deletion_value": table[centre_codes],
        "cluster_profile": (counts.double() / denominator[..., None]).float(),
        "deletion_mean_value": _deletion_value((deletions / denominator).float()),
        "true_msa": rows[centre_rows].long(), "bert_mask": c["bert_mask"][p].float(),
        "extra_msa": extra, "extra_msa_mask": extra_mask,
        "extra_has_deletion": extra_has, "extra_deletion_value": extra_value,
    }


def expand_example(compact: dict, device: torch.device | str = "cpu") -> dict:
    """`featurize`'s example (docs/batch_format.md) from `compact.compact_example`'s, on
    `device`. Keys the compact form does not define (not in `compact.COMPACT_KEYS`: e.g. the template
    features a template model's worker adds) are shipped as they are."""
    c = to_device(compact, torch.device(device))
    passes = int(c["msa_samples"])
    rows_oh = _one_hot(c["msa_full"])              # [N_all, L_full*21], shared by the samples
    samples = [_sample(c, p, rows_oh) for p in range(max(passes, 1))]
    out = {k: c[k] for k in ("aatype", "residue_index", "seq_mask", "between_segment_residues",
                             "all_atom_positions", "all_atom_mask", "backbone_positions",
                             "backbone_mask", "resolution", "num_residues", "family_id")}
    out.update({k: v for k, v in c.items() if k not in COMPACT_KEYS and k not in out})
    for k in samples[0]:
        out[k] = samples[0][k] if passes == 0 else torch.stack([s[k] for s in samples])
    return out


def expand_batch(compacts: list[dict], device: torch.device | str = "cpu", *,
                 collate_fn: Callable[..., dict] = collate, **collate_kwargs) -> dict:
    """`collate_fn` of the expanded examples, built on `device` (keys `collate_fn` leaves on
    the host, e.g. template padding, are moved there too)."""
    device = torch.device(device)
    batch = collate_fn([expand_example(c, device) for c in compacts], **collate_kwargs)
    return to_device(batch, device)
