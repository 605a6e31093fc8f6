"""Compact host examples (`compact`) -> `featurize`'s tensors, on the training device.

Runs where the batch is consumed: on a GPU the int8 rows are copied (pinned, `non_blocking`)
and the float features are built there, so the host never materializes the 23-channel cluster
profile; `msa_feat` / `extra_msa_feat` are then built by the model (`protdp.model.inputs`).
Bit for bit equal to `featurize` with the same arguments: integer counts are exact, the
divisions are the same IEEE float64 operations as numpy's, and every arctan value (deletion
features) comes from the host as a float32 table or array (AF2 supplement §1.2.9 Table 1,
`summarize_clusters`, `make_msa_feat`).
"""

from __future__ import annotations

import numpy as np
import torch

from protdp.data.features import collate
from protdp.data.residues import NUM_MSA_TOKENS


def to_device(example: dict, device: torch.device) -> dict:
    """numpy arrays -> tensors on `device` (pinned host memory + non_blocking copy on CUDA)."""
    cuda = device.type == "cuda"
    out = {}
    for k, v in example.items():
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v if v.flags.c_contiguous else v.copy())
        if isinstance(v, torch.Tensor):
            if cuda:
                v = v.pin_memory().to(device, non_blocking=True)
            elif v.device != device:
                v = v.to(device)
        out[k] = v
    return out


def _sample(c: dict, p: int) -> dict[str, torch.Tensor]:
    """The cluster and extra keys of MSA sample p (AF2 `summarize_clusters`, `crop_extra_msa`)."""
    rows, codes = c["msa_rows"], c["del_code"].long()                 # [N_all, L]
    table, present = c["del_table"], c["del_present"].float()
    centres = c["centre_msa"][p].long()                              # [N, L] (BERT-masked)
    n, L = centres.shape
    order = c["order"][p].long()
    centre_rows, extra_rows = order[:n], order[n:]
    assignment = c["assignment"][p].long()                           # [E_all]
    extra_all = rows[extra_rows].long()                              # [E_all, L]
    # profile: integer counts of (centre, column, token) over members and the centre itself
    cell = (assignment[:, None] * L + torch.arange(L, device=rows.device)[None, :]).reshape(-1)
    own = torch.arange(n * L, device=rows.device) * NUM_MSA_TOKENS + centres.reshape(-1)
    counts = torch.bincount(torch.cat([cell * NUM_MSA_TOKENS + extra_all.reshape(-1), own]),
                            minlength=n * L * NUM_MSA_TOKENS).reshape(n, L, NUM_MSA_TOKENS)
    members = 1.0 + torch.bincount(assignment, minlength=n).double()  # [N]
    denominator = (1e-6 + members)[:, None, None]
    keep = c["keep"][p].long()
    extra, extra_codes = extra_all[keep], codes[extra_rows][keep]     # [E, L]
    extra_mask = torch.ones(extra.shape, dtype=torch.float32, device=rows.device)
    if extra.shape[0] == 0:      # one padding row, as featurize
        extra = torch.zeros((1, L), dtype=torch.int64, device=rows.device)
        extra_mask = torch.zeros((1, L), dtype=torch.float32, device=rows.device)
        extra_has, extra_value = extra_mask.clone(), extra_mask.clone()
    else:
        extra_has, extra_value = present[extra_codes], table[extra_codes]
    centre_codes = codes[centre_rows]
    return {
        "msa": centres, "msa_mask": torch.ones((n, L), dtype=torch.float32, device=rows.device),
        "has_deletion": present[centre_codes], "deletion_value": table[centre_codes],
        "cluster_profile": (counts.double() / denominator).float(),
        "deletion_mean_value": c["deletion_mean_value"][p],
        "true_msa": rows[centre_rows].long(), "bert_mask": c["bert_mask"][p].float(),
        "extra_msa": extra, "extra_msa_mask": extra_mask,
        "extra_has_deletion": extra_has, "extra_deletion_value": extra_value,
    }


def expand_example(compact: dict, device: torch.device | str = "cpu") -> dict:
    """`featurize`'s example (docs/batch_format.md) from `compact.compact_example`'s, on
    `device`."""
    c = to_device(compact, torch.device(device))
    passes = int(c["msa_samples"])
    samples = [_sample(c, p) for p in range(max(passes, 1))]
    out = {k: c[k] for k in ("aatype", "residue_index", "seq_mask", "between_segment_residues",
                             "all_atom_positions", "all_atom_mask", "backbone_positions",
                             "backbone_mask", "resolution", "num_residues", "family_id")}
    for k in samples[0]:
        out[k] = samples[0][k] if passes == 0 else torch.stack([s[k] for s in samples])
    return out


def expand_batch(compacts: list[dict], device: torch.device | str = "cpu") -> dict:
    """`collate` of the expanded examples, built on `device`."""
    return collate([expand_example(c, device) for c in compacts])
