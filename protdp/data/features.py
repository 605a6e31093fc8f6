"""Family -> model features (docs/batch_format.md), AlphaFold's input pipeline (supplement
§1.2.6-1.2.9, Table 1; AF2 `data_transforms.py`, in the order of AF2's `ensembled_map_fns`):

1. cluster centres: the query first, then a random order of the other rows (`sample_msa`); the
   first `max_msa_rows` are the centres, the rest the extra MSA;
2. masked-MSA (BERT) corruption of the centres (`make_masked_msa`: 15 % of positions in
   training, of which 10 % uniform amino acid, 10 % sampled from the MSA profile, 10 %
   unchanged, 70 % the mask token), before clustering, as AF2 does;
3. every extra row joins the centre it agrees with most (`nearest_neighbor_clusters`: identical
   residues or X count, gaps and the mask token do not; ties go to the first centre), computed
   over the full length;
4. the residue crop (training: a random contiguous window), then per centre the profile and
   mean deletion count over its members and itself (`summarize_clusters`);
5. the extra MSA cut to `max_extra_msa_rows` random rows (`crop_extra_msa`).

With `msa_samples` = P > 1 steps 1-5 run P times with independent randomness and the MSA keys
gain a leading pass axis (pass i of the model reads sample i: AF2 `resample_msa_in_recycling`);
the crop is shared. Sample p draws only from its own stream (`pass_rng`), so it can also be
produced on its own when pass p asks for it (`protdp.data.msa_passes`: inference holds one pass
at a time, not P). Everything random comes from numpy Generators seeded by (`seed`, step,
sample), so an example is a pure function of (family, seed, sizes, training) and every
data-parallel rank that featurizes the same family with the same seed gets the same features.
"""

from __future__ import annotations

import numpy as np
import torch

from protdp.data.residue_constants import NUM_ATOM37, atom37_from_backbone, backbone_from_atom37
from protdp.data.residues import GAP_ID, MASK_ID, NUM_AA, NUM_MSA_TOKENS, UNK_ID, sequence_to_ids
from protdp.errors import InputError

BERT_MASK_PROB = 0.15
BERT_UNIFORM, BERT_PROFILE, BERT_SAME = 0.1, 0.1, 0.1     # remaining 0.7 -> mask token
DEFAULT_MAX_EXTRA_MSA = 1024                               # AF2 training value (inference: 5120)
AGREEMENT_CLASSES = UNK_ID + 1                             # 20 amino acids + X count; gap, mask do not

# keys by layout, for collate's padding: residue axis first / MSA rows then residues
RESIDUE_KEYS = ("aatype", "residue_index", "seq_mask", "between_segment_residues",
                "all_atom_positions", "all_atom_mask", "backbone_positions", "backbone_mask")
CLUSTER_KEYS = ("msa", "msa_mask", "has_deletion", "deletion_value", "cluster_profile",
                "deletion_mean_value", "true_msa", "bert_mask")
EXTRA_KEYS = ("extra_msa", "extra_msa_mask", "extra_has_deletion", "extra_deletion_value")
MSA_KEYS = CLUSTER_KEYS + EXTRA_KEYS
PASSES_KEY = "msa_passes"
"""Key of an example's / batch's lazy per-pass MSA source (`protdp.data.msa_passes`): its MSA
keys are then pass 0's, and pass i's are produced when the model asks (`model.inputs`)."""


def _rng(seed: int, *parts: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) % (1 << 63), *parts])


def pass_rng(seed: int, index: int) -> np.random.Generator:
    """The random stream of MSA sample `index` (steps 1-3 and 5): independent of every other
    sample's, so sample i is the same whether built alone or among P."""
    return _rng(seed, 1, index)


def deletion_value(deletions: np.ndarray) -> np.ndarray:
    """AF2's deletion feature 2/pi * arctan(d / 3) (Table 1)."""
    return (2.0 / np.pi * np.arctan(np.asarray(deletions, np.float64) / 3.0)).astype(np.float32)


def crop_start(length: int, crop_size: int | None, rng: np.random.Generator,
               training: bool) -> int:
    """Start of the contiguous crop (0 when no crop is needed or at evaluation)."""
    if crop_size is None or length <= crop_size or not training:
        return 0
    return int(rng.integers(0, length - crop_size + 1))


def msa_profile(msa: np.ndarray) -> np.ndarray:
    """Column frequencies over the 23 MSA classes. msa uint8 [N, L] -> float64 [L, 23]."""
    n, L = msa.shape
    flat = msa.astype(np.int64) + NUM_MSA_TOKENS * np.arange(L)[None, :]
    counts = np.bincount(flat.ravel(), minlength=NUM_MSA_TOKENS * L).reshape(L, NUM_MSA_TOKENS)
    return counts / max(n, 1)


def bert_mask(msa: np.ndarray, profile: np.ndarray, rng: np.random.Generator,
              mask_prob: float = BERT_MASK_PROB) -> tuple[np.ndarray, np.ndarray]:
    """AF2 masked-MSA corruption. msa int64 [N, L], profile [L, 23] ->
    (corrupted msa int64 [N, L], selected bool [N, L]).

    The replacement distribution is built only at the selected positions (~15 %): the same
    float64 operations in the same order as over the full [N, L, 23] array, so the draws and
    the result are bit for bit those of the full computation at a seventh of the work."""
    n, L = msa.shape
    u = rng.random((n, L, 1))                                        # drawn for every position
    selected = rng.random((n, L)) < mask_prob
    rows, cols = np.nonzero(selected)
    tokens = msa[rows, cols]                                         # [S]
    probs = np.zeros((len(rows), NUM_MSA_TOKENS))                    # [S, 23]
    probs[:, :NUM_AA] += BERT_UNIFORM / NUM_AA
    probs += BERT_PROFILE * profile[cols]
    probs[np.arange(len(rows)), tokens] += BERT_SAME
    probs[:, MASK_ID] += 1.0 - BERT_UNIFORM - BERT_PROFILE - BERT_SAME
    cum = np.cumsum(probs, axis=-1)
    draw = u[rows, cols] * cum[:, -1:]                               # [S, 1]
    out = msa.copy()
    out[rows, cols] = np.minimum((draw > cum).sum(-1), NUM_MSA_TOKENS - 1)
    return out, selected


_AGREEMENT_TABLE = np.eye(256, AGREEMENT_CLASSES, dtype=np.int8)   # token -> its one-hot row


def agreement_one_hot(msa) -> torch.Tensor:
    """[N, L] tokens -> int8 [N, L * 21]: one-hot of residues and X; gaps and mask are 0 (a
    row lookup in a [256, 21] table, cheaper than a broadcast comparison)."""
    tokens = np.asarray(msa)
    if tokens.dtype != np.uint8:
        tokens = tokens.astype(np.uint8)                  # tokens are 0..22
    return torch.from_numpy(_AGREEMENT_TABLE[tokens].reshape(tokens.shape[0], -1))


def _agreement_counts(extra: torch.Tensor, centres_t: torch.Tensor) -> torch.Tensor:
    """Exact agreement counts: int8 one-hots extra [E, K], centres_t [K, N] -> int32 [E, N].
    An int8 x int8 -> int32 matrix product (VNNI/IMMA; about 5x float32 on one core); where
    torch has none, a float32 product (exact: counts <= K < 2^24)."""
    try:
        return torch._int_mm(extra, centres_t)
    except (AttributeError, RuntimeError, NotImplementedError):
        return (extra.float() @ centres_t.float()).to(torch.int32)


def nearest_centre(rows, centres: np.ndarray, chunk: int = 4096,
                   index: np.ndarray | None = None) -> np.ndarray:
    """For every row (tokens [R, L] or their `agreement_one_hot` [R, L*21]; `index`: only
    rows[index], gathered chunk by chunk) the index of the centre [N, L] it agrees with most
    (ties: the first centre, `torch.argmax`) -> int64 [R or len(index)]."""
    index_t = None if index is None else torch.from_numpy(np.asarray(index, np.int64))
    count = rows.shape[0] if index_t is None else len(index_t)
    if count == 0:
        return np.zeros(0, np.int64)
    centres_t = agreement_one_hot(centres).T.contiguous()                       # [L*21, N]
    out = []
    for i in range(0, count, chunk):
        part = (rows[i:i + chunk] if index_t is None
                else rows.index_select(0, index_t[i:i + chunk]))
        part = part if isinstance(part, torch.Tensor) else agreement_one_hot(part)
        out.append(torch.argmax(_agreement_counts(part, centres_t), dim=1))
    return torch.cat(out).numpy().astype(np.int64)


def cluster_assignment(centres: np.ndarray, extra: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """AF2 `nearest_neighbor_clusters`: index of the centre [N, L] each extra row [E, L] agrees
    with most (exact integer counts: residues and X count, gaps and the mask token do not;
    ties go to the first centre) -> int64 [E]."""
    return nearest_centre(extra, centres, chunk)


def _cluster_sums(assignment: np.ndarray, n: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(cell (centre, column) of every extra position int64 [E*L], 1e-6 + members float64
    [N, L]): every extra row joins its centre in every column, so members are per centre."""
    cell = (assignment[:, None] * L + np.arange(L)[None, :]).ravel()
    members = 1.0 + np.bincount(assignment, minlength=n).astype(np.float64)    # [N]
    return cell, np.broadcast_to(1e-6 + members[:, None], (n, L))


def cluster_deletion_mean(centre_del: np.ndarray, extra_del: np.ndarray, assignment: np.ndarray,
                          cell: np.ndarray | None = None) -> np.ndarray:
    """Mean deletion count per centre and column over its assigned extra rows and itself
    (float64 [N, L]; AF2 `summarize_clusters`)."""
    n, L = centre_del.shape
    if cell is None:
        cell, denominator = _cluster_sums(assignment, n, L)
    else:       # the caller's cells: only the members per centre are left to count
        members = 1.0 + np.bincount(assignment, minlength=n).astype(np.float64)
        denominator = np.broadcast_to(1e-6 + members[:, None], (n, L))
    deletions = centre_del + np.bincount(cell, weights=extra_del.ravel().astype(np.float64),
                                         minlength=n * L).reshape(n, L)
    return deletions / denominator


def summarize_clusters(centres: np.ndarray, centre_del: np.ndarray, extra: np.ndarray,
                       extra_del: np.ndarray, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AF2 `summarize_clusters`: per centre the 23-class profile [N, L, 23] and the mean
    deletion count [N, L] over its assigned extra rows and itself (float32). The centre's
    own token is counted in the same integer bincount as its members' tokens."""
    n, L = centres.shape
    cell, denominator = _cluster_sums(assignment, n, L)
    own = (np.arange(n * L) * NUM_MSA_TOKENS + centres.ravel())               # the centre itself
    counts = np.bincount(np.concatenate([cell * NUM_MSA_TOKENS + extra.ravel(), own]),
                         minlength=n * L * NUM_MSA_TOKENS).reshape(n, L, NUM_MSA_TOKENS)
    return ((counts / denominator[..., None]).astype(np.float32),
            cluster_deletion_mean(centre_del, extra_del, assignment, cell).astype(np.float32))


def sample_plan(msa: np.ndarray, rng: np.random.Generator, *, max_rows: int, max_extra: int,
                mask_fraction: float, profile: np.ndarray | None,
                one_hot: torch.Tensor | None = None, assign: bool = True) -> dict[str, np.ndarray]:
    """The random choices of one MSA sample over the full length (steps 1-3 and the draw of 5):
    `centre_rows` [N] and `extra_rows` [E_all] (row indices), `msa` the masked centres and
    `bert_mask` the selected positions (int64 / bool [N, L_full]), `assignment` [E_all] (the
    centre of every extra row) and `keep` [E] (positions in `extra_rows` kept as the extra
    MSA). `one_hot`: `agreement_one_hot(msa)` of every row, shared between samples.
    `assign=False` leaves out `assignment` (the device computes it: `pipeline.expand`); the
    random draws are the same either way."""
    order = np.concatenate([[0], 1 + rng.permutation(msa.shape[0] - 1)])
    centre_rows, extra_rows = order[:max_rows], order[max_rows:]
    true_msa = msa[centre_rows].astype(np.int64)                    # [N, L_full]
    if mask_fraction > 0:
        centres, selected = bert_mask(true_msa, profile, rng, mask_fraction)
    else:
        centres, selected = true_msa, np.zeros(true_msa.shape, bool)
    if not assign:
        assignment = None
    elif one_hot is not None:   # the extra rows' shared one-hots (not the centres': ~10 %)
        assignment = nearest_centre(one_hot, centres, index=extra_rows)
    else:
        assignment = nearest_centre(msa[extra_rows], centres)
    keep = rng.permutation(len(extra_rows))[:max_extra]
    return {"centre_rows": centre_rows, "extra_rows": extra_rows, "msa": centres,
            "bert_mask": selected, "assignment": assignment, "keep": keep}


def msa_sample(msa: np.ndarray, dels: np.ndarray, window: slice, plan: dict) -> dict[str, np.ndarray]:
    """One MSA sample (steps 1-5 of the module docstring) from its `sample_plan`. msa/dels
    [N_all, L_full] -> the cluster and extra keys over the cropped `window` (numpy)."""
    centre_rows, extra_rows = plan["centre_rows"], plan["extra_rows"]
    centres, selected = plan["msa"][:, window], plan["bert_mask"][:, window]
    msa, dels = msa[:, window], dels[:, window]                     # views: rows copied cropped
    true_msa = msa[centre_rows].astype(np.int64)
    centre_del = dels[centre_rows]
    extra_all, extra_del = msa[extra_rows].astype(np.int64), dels[extra_rows]
    cluster_profile, mean_del = summarize_clusters(centres, centre_del, extra_all, extra_del,
                                                   plan["assignment"])
    keep = plan["keep"]
    extra, extra_del = extra_all[keep], extra_del[keep]
    extra_mask = np.ones(extra.shape, np.float32)
    if extra.shape[0] == 0:      # one padding row, as AF2 runs its stack on a padded extra MSA
        extra = np.zeros((1, centres.shape[1]), np.int64)
        extra_del, extra_mask = np.zeros(extra.shape), np.zeros(extra.shape, np.float32)
    return {
        "msa": centres, "msa_mask": np.ones(centres.shape, np.float32),
        "has_deletion": (centre_del > 0).astype(np.float32), "deletion_value": deletion_value(centre_del),
        "cluster_profile": cluster_profile, "deletion_mean_value": deletion_value(mean_del),
        "true_msa": true_msa, "bert_mask": selected.astype(np.float32),
        "extra_msa": extra, "extra_msa_mask": extra_mask,
        "extra_has_deletion": (extra_del > 0).astype(np.float32),
        "extra_deletion_value": deletion_value(extra_del),
    }


def shared_one_hot(msa: np.ndarray, limit_bytes: int = 512 << 20) -> torch.Tensor | None:
    """`agreement_one_hot` of every row, computed once for all MSA samples of an example, or
    None when it would exceed `limit_bytes` (then each sample encodes its extra rows)."""
    n, L = msa.shape
    return agreement_one_hot(msa) if n * L * AGREEMENT_CLASSES <= limit_bytes else None


def structure_arrays(family: dict, aatype: np.ndarray) -> dict[str, np.ndarray]:
    """atom37 truth and the derived backbone: store v2 (`all_atom_positions`), or a v1 dict
    with only `backbone_positions` / `backbone_mask` (converted to atom37)."""
    if "all_atom_positions" in family:
        pos = np.asarray(family["all_atom_positions"], np.float32)
        mask = np.asarray(family["all_atom_mask"], np.float32)
    else:
        pos, mask = atom37_from_backbone(aatype, np.asarray(family["backbone_positions"], np.float32),
                                         np.asarray(family["backbone_mask"], np.float32))
    if "backbone_positions" in family:
        bb, bb_mask = family["backbone_positions"], family["backbone_mask"]
    else:
        bb, bb_mask = backbone_from_atom37(pos, mask)
    return {"all_atom_positions": pos, "all_atom_mask": mask,
            "backbone_positions": np.asarray(bb, np.float32),
            "backbone_mask": np.asarray(bb_mask, np.float32)}


def _query_aatype(family: dict, msa: np.ndarray) -> np.ndarray:
    if "sequence" in family and len(str(family["sequence"])) == msa.shape[1]:
        aatype = sequence_to_ids(str(family["sequence"])).astype(np.int64)
    else:
        aatype = msa[0].astype(np.int64)
    aatype[aatype > UNK_ID] = UNK_ID                                 # gap/mask in query -> X
    return aatype


def plan_example(family: dict, *, crop_size: int | None, max_msa_rows: int, seed: int,
                 training: bool = True, max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
                 msa_samples: int = 1, masked_msa_fraction: float | None = None,
                 assign: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, slice, list[dict]]:
    """Every random choice of one example: (msa uint8 [N_all, L_full], deletions, aatype
    [L_full], crop window, one `sample_plan` per MSA sample). `featurize` and the compact host
    batch (`protdp.data.pipeline.compact`) both build from it, so they cannot disagree."""
    if max_msa_rows < 1 or max_extra_msa_rows < 0 or msa_samples < 1:
        raise ValueError("max_msa_rows and msa_samples must be >= 1, max_extra_msa_rows >= 0")
    msa, dels, aatype, window, fraction, profile = sampling_inputs(
        family, crop_size=crop_size, seed=seed, training=training,
        masked_msa_fraction=masked_msa_fraction)
    one_hot = shared_one_hot(msa) if assign and msa.shape[0] > max_msa_rows else None
    plans = [sample_plan(msa, pass_rng(seed, p), max_rows=max_msa_rows, max_extra=max_extra_msa_rows,
                         mask_fraction=fraction, profile=profile, one_hot=one_hot, assign=assign)
             for p in range(msa_samples)]
    return msa, dels, aatype, window, plans


def sampling_inputs(family: dict, *, crop_size: int | None, seed: int, training: bool,
                    masked_msa_fraction: float | None) -> tuple:
    """What every MSA sample of an example is drawn from: (msa uint8 [N_all, L_full],
    deletions [N_all, L_full], aatype [L_full], crop window, BERT fraction, profile [L_full, 23]
    or None). The crop is drawn here, once per example."""
    fraction = (BERT_MASK_PROB if training else 0.0) if masked_msa_fraction is None else masked_msa_fraction
    msa = np.asarray(family["msa"])                                  # uint8 [N_all, L_full]
    dels = np.asarray(family["deletion_matrix"])
    L_full = msa.shape[1]
    aatype = _query_aatype(family, msa)
    start = crop_start(L_full, crop_size, _rng(seed, 0), training)
    window = slice(start, L_full if crop_size is None else min(L_full, start + crop_size))
    profile = msa_profile(msa) if fraction > 0 else None
    return msa, dels, aatype, window, fraction, profile


def residue_features(family: dict, aatype: np.ndarray, window: slice) -> dict:
    """The residue, structure and scalar keys of an example over the crop `window`."""
    L_full = len(aatype)
    structure = {k: v[window] for k, v in structure_arrays(family, aatype).items()}
    L = window.stop - window.start
    brk = np.asarray(family.get("between_segment_residues", np.zeros(L_full)), np.float32)[window]
    return {
        "aatype": torch.from_numpy(aatype[window].copy()),                            # [L]
        "residue_index": torch.from_numpy(np.asarray(family["residue_index"])[window].astype(np.int64)),
        "seq_mask": torch.ones(L, dtype=torch.float32),                               # [L]
        "between_segment_residues": torch.from_numpy(brk.copy()),                     # [L]
        **{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in structure.items()},
        "resolution": torch.tensor(float(family.get("resolution", float("nan"))), dtype=torch.float32),
        "num_residues": torch.tensor(L, dtype=torch.int64),
        "family_id": str(family.get("family_id", "")),
    }


def featurize(family: dict, *, crop_size: int | None, max_msa_rows: int, seed: int,
              training: bool = True, max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
              msa_samples: int = 1, masked_msa_fraction: float | None = None) -> dict:
    """One example (unbatched, docs/batch_format.md) from a store family dict
    (`FamilyStore.read`). Deterministic given `seed`. `masked_msa_fraction` defaults to 0.15
    in training and 0 otherwise (AF2's own inference masks 0.15; pass it to reproduce that)."""
    msa, dels, aatype, window, plans = plan_example(
        family, crop_size=crop_size, max_msa_rows=max_msa_rows, seed=seed, training=training,
        max_extra_msa_rows=max_extra_msa_rows, msa_samples=msa_samples,
        masked_msa_fraction=masked_msa_fraction)
    samples = [msa_sample(msa, dels, window, plan) for plan in plans]
    msa_keys = {k: (samples[0][k] if msa_samples == 1 else np.stack([s[k] for s in samples]))
                for k in MSA_KEYS}
    out = residue_features(family, aatype, window)
    out.update({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in msa_keys.items()})
    return out


def _zeros(shape: tuple, dtype: torch.dtype, device: torch.device, shared: bool) -> torch.Tensor:
    """torch.zeros, or (`shared`, CPU) zeros allocated in shared memory: a data worker's batch
    then crosses to the trainer without the copy that `share_memory_` would make (as torch's
    DataLoader collates in its workers)."""
    if not shared or device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = int(np.prod(shape, dtype=np.int64))
    storage = torch.UntypedStorage._new_shared(numel * torch.empty((), dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape).zero_()


def collate(examples: list[dict], shared: bool = False) -> dict:
    """Stack examples into a batch, zero-padding L and the MSA rows; masks are 0 on padding.
    The batch is built on the examples' device (`shared`: in shared memory, see `_zeros`)."""
    if not examples:
        raise ValueError("collate needs at least one example")
    batch: dict = {"family_id": [e["family_id"] for e in examples]}
    for key in RESIDUE_KEYS + MSA_KEYS:
        if key in examples[0]:
            batch[key] = stack_padded([e[key] for e in examples], key, shared)
    sources = [e.get(PASSES_KEY) for e in examples]
    if any(s is not None for s in sources):     # lazy per-pass samples (`msa_passes`)
        if any(s is None for s in sources):
            raise ValueError(f"collate: only some examples carry '{PASSES_KEY}' (MSA samples?)")
        batch[PASSES_KEY] = sources[0].stack(sources)
    batch["resolution"] = torch.stack([e["resolution"] for e in examples])          # [B]
    batch["num_residues"] = torch.stack([e["num_residues"] for e in examples])      # [B]
    return batch


def stack_padded(tensors: list[torch.Tensor], key: str = "", shared: bool = False) -> torch.Tensor:
    """[B, *max shape]: the tensors at the origin of a zero tensor (the rest is padding)."""
    shapes = [tuple(t.shape) for t in tensors]
    if any(len(s) != len(shapes[0]) for s in shapes):
        raise ValueError(f"collate: examples disagree on the rank of '{key}' (MSA samples?)")
    shape = tuple(max(s[i] for s in shapes) for i in range(len(shapes[0])))
    out = _zeros((len(tensors),) + shape, tensors[0].dtype, tensors[0].device, shared)
    for b, t in enumerate(tensors):
        out[(b,) + tuple(slice(0, n) for n in t.shape)] = t
    return out


def featurize_query(sequence: str, msa=None, *, max_msa_rows: int = 512, seed: int = 0,
                    family_id: str = "query", max_extra_msa_rows: int = DEFAULT_MAX_EXTRA_MSA,
                    msa_samples: int = 1, masked_msa_fraction: float = 0.0) -> dict:
    """Inference features for a target without structure: structure keys are zero with zero
    mask, resolution NaN, no crop, BERT masking of `masked_msa_fraction` (AF2's inference: 0.15). `msa` is a `protdp.data.parse.Msa` whose
    query must equal `sequence` (X matches anything). All `msa_samples` built now; the
    predictor builds them pass by pass (`msa_passes.query_features`)."""
    return featurize(query_family(sequence, msa, family_id), crop_size=None,
                     max_msa_rows=max_msa_rows, seed=seed, training=False,
                     max_extra_msa_rows=max_extra_msa_rows, msa_samples=msa_samples,
                     masked_msa_fraction=masked_msa_fraction)


def query_family(sequence: str, msa=None, family_id: str = "query") -> dict:
    """The family dict (`FamilyStore.read`'s layout) of a target without structure, checked:
    structure zero with zero mask, resolution NaN, the MSA's query set to `sequence`."""
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
    return {
        "family_id": family_id, "msa": tokens, "deletion_matrix": dels,
        "all_atom_positions": np.zeros((L, NUM_ATOM37, 3), np.float32),
        "all_atom_mask": np.zeros((L, NUM_ATOM37), np.float32),
        "residue_index": np.arange(L, dtype=np.int32), "sequence": seq, "resolution": float("nan"),
    }
