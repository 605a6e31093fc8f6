"""Training examples of complexes: a stored complex (`protdp.complex.store`) -> AlphaFold's
multimer model input (`protdp.complex.features.complex_features`) + the ground truth, cropped
across chains as AlphaFold-Multimer trains (`protdp.complex.cropping.choose_crop`: spatial or
contiguous, AF-Multimer supplement §7.2.1).

Each chain's MSA is cut to its first `max_rows_per_chain` rows (query first) before merging: a
memory bound for training, not AlphaFold's (it keeps 2,048 per chain and samples in the model).
The store holds no UniProt alignments, so heteromers are not species-paired here (each chain's
rows block-diagonally). The truth (`all_atom_positions` [L, 37, 3], `all_atom_mask` [L, 37])
follows the features' residue order (AlphaFold's assembly order: entities by first
appearance, copies grouped); `true_*` keep it for the whole complex (the chain permutation
compares the crop with every copy), and the cropped `residue_index` is each residue's
position in its chain. Everything drawn comes from one numpy generator seeded with
`seed`: the same seed gives the same example.
"""

from __future__ import annotations

import numpy as np

from protdp.data.parse import Msa
from protdp.data.residues import RESTYPES
from protdp.complex.cropping import SPATIAL_CROP_PROB, choose_crop
from protdp.complex.features import TEMPLATE_KEYS, ChainInput, complex_features

TOKEN_LETTERS = np.array(list(RESTYPES + "X-"))          # AF token id -> MSA letter
CA = 1                                                   # atom37 index of CA
PER_RESIDUE = ("aatype", "residue_index", "all_atom_positions", "all_atom_mask", "asym_id",
               "sym_id", "entity_id", "deletion_mean", "seq_mask", "entity_mask")
PER_COLUMN = ("msa", "deletion_matrix", "bert_mask", "msa_mask")     # [N, L]


def _stored_msa(chain: dict, max_rows: int) -> Msa:
    tokens = np.asarray(chain["msa"][:max_rows])
    rows = ["".join(r) for r in TOKEN_LETTERS[np.minimum(tokens, len(TOKEN_LETTERS) - 1)]]
    return Msa(rows, np.asarray(chain["deletion_matrix"][:max_rows], np.uint8),
               [f"row{i}" for i in range(len(rows))])


def crop_example(x: dict, keep: np.ndarray) -> dict:
    """Residue subset `keep` (bool [L]) of merged features: per-residue arrays, MSA and
    template columns."""
    out = dict(x)
    for k in PER_RESIDUE:
        out[k] = x[k][keep]
    for k in PER_COLUMN:
        out[k] = x[k][:, keep]
    for k in TEMPLATE_KEYS:
        out[k] = x[k][:, keep]
    out["seq_length"] = np.asarray(int(keep.sum()), np.int32)
    return out


def complex_example(record: dict, crop_size: int, seed: int, max_rows_per_chain: int = 256,
                    spatial_prob: float = SPATIAL_CROP_PROB) -> dict:
    """A stored complex -> one cropped training example (numpy; module docstring). Adds
    `crop_mode` ("whole" | "spatial" | "contiguous") and `resolution`."""
    chains = record["chains"]
    inputs = [ChainInput(c["chain_id"], c["sequence"], _stored_msa(c, max_rows_per_chain))
              for c in chains]
    feats = complex_features(inputs, pair=False)
    x = feats.features
    by_id = {c["chain_id"]: c for c in chains}
    order = [by_id[c["chain_id"]] for c in feats.report["chains"]]       # asym order
    x["all_atom_positions"] = np.concatenate([c["all_atom_positions"] for c in order]
                                             ).astype(np.float32)
    x["all_atom_mask"] = np.concatenate([c["all_atom_mask"] for c in order]).astype(np.float32)
    # the whole complex's truth for the chain permutation (protdp.model.multimer.crop_permutation)
    x["true_all_atom_positions"] = x["all_atom_positions"]
    x["true_all_atom_mask"] = x["all_atom_mask"]
    x["true_asym_id"], x["true_entity_id"] = x["asym_id"], x["entity_id"]
    rng = np.random.default_rng(seed)
    keep, mode = choose_crop(x["all_atom_positions"][:, CA], x["all_atom_mask"][:, CA],
                             x["asym_id"], crop_size, rng, spatial_prob)
    x = crop_example(x, keep)
    x["crop_mode"] = mode
    x["resolution"] = np.asarray(record.get("resolution", np.nan), np.float32)
    return x
