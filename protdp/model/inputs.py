"""Model input features from a batch (docs/batch_format.md), as AlphaFold builds them
(supplement §1.2.9 Table 1; AF2 `make_msa_feat`, `create_extra_msa_feature`):

- `target_feat` [*, L, 22]: between-segment (chain break) flag + one-hot aatype (21, incl. X);
- `msa_feat` [*, N, L, 49]: one-hot cluster MSA (23), has_deletion, deletion_value, cluster
  profile (23), cluster deletion_mean_value;
- extra-MSA features [*, E, L, 25]: one-hot (23), has_deletion, deletion_value.

A batch may carry `target_feat` / `msa_feat` precomputed (AlphaFold's processed features are
fed that way) or the compact keys they are built from. MSA keys may carry a recycling-pass axis
P right before the row axis ([*, P, N, L]): pass i of the model reads sample min(i, P-1), so
every recycling pass can see its own MSA sample (AF2 `resample_msa_in_recycling`). Or the MSA
keys are pass 0's and the batch carries a lazy source of the others under `PASSES_KEY`
(`protdp.data.msa_passes`: what the predictor builds, so memory does not grow with P); pass i
then asks it for sample min(i, P-1), built on the host and moved to the batch's device.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from protdp.data.features import MSA_KEYS as FEATURE_MSA_KEYS, PASSES_KEY
from protdp.data.residues import NUM_AATYPE, NUM_MSA_TOKENS, UNK_ID
from protdp.errors import InputError

TARGET_FEAT_DIM = 1 + NUM_AATYPE                 # 22
MSA_FEAT_DIM = 2 * NUM_MSA_TOKENS + 3            # 49
EXTRA_MSA_FEAT_DIM = NUM_MSA_TOKENS + 2          # 25

# keys with an MSA-row axis (and optionally a pass axis before it): the featurizer's, plus
# AlphaFold's processed-feature keys; feature channels, if any, come last
MSA_KEYS = FEATURE_MSA_KEYS + ("msa_feat", "msa_row_mask", "extra_msa_row_mask")
_ROW_RANK = {"msa_feat": 3, "cluster_profile": 3, "msa_row_mask": 1, "extra_msa_row_mask": 1}


def num_passes(batch: Mapping) -> int | None:
    """Number of MSA samples P when the MSA keys carry a pass axis or the batch a lazy source
    of them (`PASSES_KEY`), else None."""
    source = batch.get(PASSES_KEY)
    return _pass_axis(batch) if source is None else int(source.num_passes)


def _pass_axis(batch: Mapping) -> int | None:
    """P when the MSA tensors carry a pass axis, else None."""
    key = "msa_feat" if "msa_feat" in batch else "msa_mask"
    extra = batch[key].dim() - batch["aatype"].dim() - (_ROW_RANK.get(key, 2) - 1)
    if extra == 0:
        return None
    if extra == 1:
        return int(batch[key].shape[batch["aatype"].dim() - 1])
    raise InputError(f"expected [*, (P,) N, L...] with aatype [*, L], got {tuple(batch[key].shape)}",
                     field=key)


def select_pass(batch: Mapping, index: int) -> dict:
    """The batch seen by recycling pass `index`: MSA keys at sample min(index, P-1)."""
    source = batch.get(PASSES_KEY)
    if source is not None:     # pass 0's keys are the batch's; later ones built now
        out = {k: v for k, v in batch.items() if k != PASSES_KEY}
        i = min(index, int(source.num_passes) - 1)
        if i > 0:
            device = batch["aatype"].device
            out.update({k: v.to(device) for k, v in source.pass_features(i).items()})
        return out
    p = num_passes(batch)
    if p is None:
        return dict(batch)
    dim = batch["aatype"].dim() - 1
    i = min(index, p - 1)
    return {k: (v.select(dim, i) if k in MSA_KEYS and isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()}


def target_feat(batch: Mapping, dtype: torch.dtype) -> torch.Tensor:
    """[*, L, 22]: [has_break, one_hot(aatype, 21)] (AF2 `target_feat`)."""
    if "target_feat" in batch:
        return batch["target_feat"].to(dtype)
    aatype = batch["aatype"].long().clamp(0, UNK_ID)
    brk = batch.get("between_segment_residues")
    brk = torch.zeros_like(aatype, dtype=dtype) if brk is None else brk.to(dtype).clamp(0, 1)
    return torch.cat([brk[..., None], F.one_hot(aatype, NUM_AATYPE).to(dtype)], dim=-1)


def msa_feat(batch: Mapping, dtype: torch.dtype) -> torch.Tensor:
    """[*, N, L, 49] (AF2 `msa_feat`). Without `cluster_profile` / `deletion_mean_value` every
    row is its own cluster (what AF2 computes when no extra row is assigned to a centre)."""
    if "msa_feat" in batch:
        return batch["msa_feat"].to(dtype)
    one_hot = F.one_hot(batch["msa"].long(), NUM_MSA_TOKENS).to(dtype)       # [*, N, L, 23]
    deletions = batch["deletion_value"].to(dtype)
    profile = batch["cluster_profile"].to(dtype) if "cluster_profile" in batch else one_hot
    mean = batch["deletion_mean_value"].to(dtype) if "deletion_mean_value" in batch else deletions
    return torch.cat([one_hot, batch["has_deletion"].to(dtype)[..., None], deletions[..., None],
                      profile, mean[..., None]], dim=-1)


def extra_msa_feat(extra_msa: torch.Tensor, has_deletion: torch.Tensor,
                   deletion_values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[*, E, L, 25]: [one_hot(extra_msa, 23), has_deletion, deletion_value]."""
    return torch.cat([F.one_hot(extra_msa.long(), NUM_MSA_TOKENS).to(dtype),
                      has_deletion.to(dtype)[..., None], deletion_values.to(dtype)[..., None]],
                     dim=-1)


def check_batch(batch: Mapping) -> None:
    """One clear InputError naming the key for a missing or mis-shaped model input."""
    compact = ("msa", "has_deletion", "deletion_value")
    required = ["aatype", "residue_index", "seq_mask", "msa_mask"]
    if "msa_feat" not in batch:
        required += list(compact)
    missing = [k for k in required if k not in batch]
    if missing:
        raise InputError(f"batch is missing key(s) {missing} (see docs/batch_format.md)",
                         field=missing[0])
    aatype = batch["aatype"]
    for key in ("residue_index", "seq_mask"):
        if batch[key].shape != aatype.shape:
            raise InputError(f"shape {tuple(batch[key].shape)} != aatype shape {tuple(aatype.shape)}",
                             field=key)
    passes = _pass_axis(batch)
    if passes is not None and PASSES_KEY in batch:
        raise InputError("MSA keys with a pass axis and a lazy pass source: give one",
                         field=PASSES_KEY)
    lead = aatype.shape[:-1] + (() if passes is None else (passes,))
    L = aatype.shape[-1]
    for key in [k for k in MSA_KEYS if k in batch and k not in ("msa_row_mask", "extra_msa_row_mask")]:
        v = batch[key]
        rank = _ROW_RANK.get(key, 2)
        ok = v.dim() == len(lead) + rank and tuple(v.shape[:len(lead)]) == tuple(lead) \
            and v.shape[len(lead) + 1] == L
        if not ok:
            raise InputError(f"expected [{', '.join(map(str, lead))}{', ' if lead else ''}rows, {L}"
                             f"{', channels' if rank == 3 else ''}], got {tuple(v.shape)}", field=key)
    for key, top in (("aatype", None), ("msa", NUM_MSA_TOKENS), ("extra_msa", NUM_MSA_TOKENS),
                     ("true_msa", NUM_MSA_TOKENS)):
        if key in batch and batch[key].numel():
            lo, hi = int(batch[key].min()), int(batch[key].max())
            if lo < 0 or (top is not None and hi >= top):   # aatype > 20 reads as X, like AF2
                raise InputError(f"token ids must lie in [0, {(top or 21) - 1}], got [{lo}, {hi}]",
                                 field=key)
    if "msa_feat" in batch and batch["msa_feat"].shape[-1] != MSA_FEAT_DIM:
        raise InputError(f"expected {MSA_FEAT_DIM} channels, got {batch['msa_feat'].shape[-1]}",
                         field="msa_feat")
    expect = tuple(aatype.shape) + (TARGET_FEAT_DIM,)
    if "target_feat" in batch and tuple(batch["target_feat"].shape) != expect:
        raise InputError(f"expected {tuple(aatype.shape) + (TARGET_FEAT_DIM,)}, got "
                         f"{tuple(batch['target_feat'].shape)}", field="target_feat")
