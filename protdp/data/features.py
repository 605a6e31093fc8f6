"""Family -> model features (docs/batch_format.md), AF2 Supplement 1.2.6-1.2.9.

Per example: contiguous crop to `crop_size` (1.2.8 "fixed-size cropping"), MSA subsampling
with the query kept first (Algorithm "sample_msa"), BERT-style masked-MSA targets (1.2.7:
15 % of positions; replaced 10 % by a uniform amino acid, 10 % by a profile sample, 10 %
unchanged, 70 % by the mask token), deletion features has_deletion and 2/π·arctan(d/3)
(Table 1). Everything random comes from one numpy Generator seeded by `seed`, so an example
is a pure function of (family, seed, sizes, training).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from protdp.data.residues import GAP_ID, MASK_ID, NUM_AA, NUM_MSA_TOKENS, UNK_ID, sequence_to_ids
from protdp.errors import InputError

BERT_MASK_PROB = 0.15
BERT_UNIFORM, BERT_PROFILE, BERT_SAME = 0.1, 0.1, 0.1     # remaining 0.7 -> mask token

# keys with an MSA-row axis / a residue axis (for padding in `collate`)
_ROW_KEYS = ("msa", "msa_mask", "has_deletion", "deletion_value", "true_msa", "bert_mask")
_RES_KEYS = ("aatype", "residue_index", "seq_mask", "backbone_positions", "backbone_mask")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(int(seed) % (1 << 64))


def crop_start(length: int, crop_size: int | None, rng: np.random.Generator,
               training: bool) -> int:
    """Start of the contiguous crop (0 when no crop is needed or at evaluation)."""
    if crop_size is None or length <= crop_size or not training:
        return 0
    return int(rng.integers(0, length - crop_size + 1))


def sample_rows(num_rows: int, max_rows: int, rng: np.random.Generator, training: bool
                ) -> np.ndarray:
    """Row indices: query (0) first, then a random subset of the others (first rows at eval)."""
    if num_rows <= max_rows:
        return np.arange(num_rows)
    if not training:
        return np.arange(max_rows)
    return np.concatenate([[0], 1 + rng.permutation(num_rows - 1)[:max_rows - 1]])


def msa_profile(msa: np.ndarray) -> np.ndarray:
    """Column frequencies over the 23 MSA classes. msa uint8 [N, L] -> float64 [L, 23]."""
    n, L = msa.shape
    flat = msa.astype(np.int64) + NUM_MSA_TOKENS * np.arange(L)[None, :]
    counts = np.bincount(flat.ravel(), minlength=NUM_MSA_TOKENS * L).reshape(L, NUM_MSA_TOKENS)
    return counts / max(n, 1)


def bert_mask(msa: np.ndarray, profile: np.ndarray, rng: np.random.Generator,
              mask_prob: float = BERT_MASK_PROB) -> tuple[np.ndarray, np.ndarray]:
    """AF2 masked-MSA corruption. msa int64 [N, L], profile [L, 23] ->
    (corrupted msa int64 [N, L], selected bool [N, L])."""
    n, L = msa.shape
    probs = np.zeros((n, L, NUM_MSA_TOKENS))                        # [N, L, 23]
    probs[..., :NUM_AA] += BERT_UNIFORM / NUM_AA
    probs += BERT_PROFILE * profile[None]
    probs[np.arange(n)[:, None], np.arange(L)[None, :], msa] += BERT_SAME
    probs[..., MASK_ID] += 1.0 - BERT_UNIFORM - BERT_PROFILE - BERT_SAME
    cum = np.cumsum(probs, axis=-1)
    u = rng.random((n, L, 1)) * cum[..., -1:]
    replacement = np.minimum((u > cum).sum(-1), NUM_MSA_TOKENS - 1)  # [N, L]
    selected = rng.random((n, L)) < mask_prob
    return np.where(selected, replacement, msa), selected


def featurize(family: dict, *, crop_size: int | None, max_msa_rows: int, seed: int,
              training: bool = True) -> dict:
    """One example (unbatched, docs/batch_format.md) from a store family dict
    (`FamilyStore.read`). Deterministic given `seed`."""
    if max_msa_rows < 1:
        raise ValueError("max_msa_rows must be >= 1")
    rng = _rng(seed)
    msa_all = np.asarray(family["msa"])                              # uint8 [N_all, L_full]
    L_full = msa_all.shape[1]
    start = crop_start(L_full, crop_size, rng, training)
    end = L_full if crop_size is None else min(L_full, start + crop_size)
    msa_all = msa_all[:, start:end]                                  # [N_all, L]
    rows = sample_rows(msa_all.shape[0], max_msa_rows, rng, training)
    true_msa = msa_all[rows].astype(np.int64)                        # [N, L]
    dels = np.asarray(family["deletion_matrix"])[rows, start:end].astype(np.float32)  # [N, L]
    if training:
        masked, selected = bert_mask(true_msa, msa_profile(msa_all), rng)
    else:
        masked, selected = true_msa, np.zeros(true_msa.shape, bool)
    aatype = true_msa[0].copy()
    aatype[aatype > UNK_ID] = UNK_ID                                 # gap/mask in query -> X
    n, L = true_msa.shape
    res = family.get("resolution", float("nan"))
    return {
        "aatype": torch.from_numpy(aatype),                                          # [L]
        "residue_index": torch.from_numpy(
            np.asarray(family["residue_index"])[start:end].astype(np.int64)),        # [L]
        "seq_mask": torch.ones(L, dtype=torch.float32),                              # [L]
        "msa": torch.from_numpy(masked.astype(np.int64)),                            # [N, L]
        "msa_mask": torch.ones(n, L, dtype=torch.float32),                           # [N, L]
        "has_deletion": torch.from_numpy((dels > 0).astype(np.float32)),             # [N, L]
        "deletion_value": torch.from_numpy(
            (2.0 / math.pi * np.arctan(dels / 3.0)).astype(np.float32)),             # [N, L]
        "true_msa": torch.from_numpy(true_msa),                                      # [N, L]
        "bert_mask": torch.from_numpy(selected.astype(np.float32)),                  # [N, L]
        "backbone_positions": torch.from_numpy(
            np.asarray(family["backbone_positions"], np.float32)[start:end].copy()),  # [L, 5, 3]
        "backbone_mask": torch.from_numpy(
            np.asarray(family["backbone_mask"])[start:end].astype(np.float32)),      # [L, 5]
        "resolution": torch.tensor(float(res), dtype=torch.float32),                 # []
        "num_residues": torch.tensor(L, dtype=torch.int64),                          # []
        "family_id": str(family.get("family_id", "")),
    }


def collate(examples: list[dict]) -> dict:
    """Stack examples into a batch, zero-padding L and N; masks are 0 on padding."""
    if not examples:
        raise ValueError("collate needs at least one example")
    B = len(examples)
    L = max(int(e["aatype"].shape[0]) for e in examples)
    N = max(int(e["msa"].shape[0]) for e in examples)
    batch: dict = {"family_id": [e["family_id"] for e in examples]}
    for key in _RES_KEYS + _ROW_KEYS:
        first = examples[0][key]
        if key in _ROW_KEYS:
            shape = (B, N, L) + tuple(first.shape[2:])
        else:
            shape = (B, L) + tuple(first.shape[1:])
        out = torch.zeros(shape, dtype=first.dtype)
        for b, e in enumerate(examples):
            t = e[key]
            if key in _ROW_KEYS:
                out[b, :t.shape[0], :t.shape[1]] = t
            else:
                out[b, :t.shape[0]] = t
        batch[key] = out
    batch["resolution"] = torch.stack([e["resolution"] for e in examples])          # [B]
    batch["num_residues"] = torch.stack([e["num_residues"] for e in examples])      # [B]
    return batch


def featurize_query(sequence: str, msa=None, *, max_msa_rows: int = 512, seed: int = 0,
                    family_id: str = "query") -> dict:
    """Inference features for a target without structure: structure keys are zero with zero
    mask, resolution NaN, no BERT masking, no crop. `msa` is a `protdp.data.parse.Msa` whose
    query must equal `sequence` (X matches anything)."""
    seq = "".join(str(sequence).split()).upper()
    if not seq:
        raise InputError("empty sequence", field="sequence")
    bad = sorted({c for c in seq if not c.isalpha()})
    if bad:
        raise InputError(f"sequence contains non-letter characters {bad}", field="sequence")
    query_ids = sequence_to_ids(seq)                                    # [L]
    L = len(seq)
    if msa is not None:
        tokens = msa.tokens()
        q = tokens[0]
        if tokens.shape[1] != L or np.any((q != query_ids) & (q != UNK_ID) &
                                          (query_ids != UNK_ID)):
            raise InputError(f"MSA query ({msa.length} columns, '{msa.query[:20]}...') does not "
                             f"match the {L}-residue target sequence",
                             path=msa.sources[0] if msa.sources else None)
        tokens = tokens.copy()
        tokens[0] = query_ids
        dels = msa.deletion_matrix
    else:
        tokens = query_ids[None]
        dels = np.zeros_like(tokens)
    if np.any(tokens[0] == GAP_ID):
        raise InputError("sequence contains gap characters", field="sequence")
    family = {
        "family_id": family_id,
        "msa": tokens, "deletion_matrix": dels,
        "backbone_positions": np.zeros((L, 5, 3), np.float32),
        "backbone_mask": np.zeros((L, 5), np.uint8),
        "residue_index": np.arange(L, dtype=np.int32),
        "sequence": seq, "resolution": float("nan"),
    }
    return featurize(family, crop_size=None, max_msa_rows=max_msa_rows, seed=seed,
                     training=False)
