"""Model input features of a complex: per-chain features -> assembly ids -> species pairing ->
deduplication -> cropping -> merging -> padding, exactly as AlphaFold v2.3.2's
`pipeline_multimer.DataPipeline.process` (`convert_monomer_features`, `add_assembly_features`,
`feature_processing.pair_and_merge`, `msa_pairing.merge_chain_features`, `pad_msa`).

The result is a dict named and typed as AlphaFold's multimer `np_example` (the multimer model
has no further feature pipeline: MSA sampling happens inside the model), so it can be compared
field by field with DeepMind's output. Token ids are in AlphaFold's residue order throughout
(AlphaFold pairs in HHblits order and reorders at the end; both orders put X at 20 and the gap
at 21, and pairing only compares tokens for equality, so the result is the same).

MSA layout (heteromer), rows x residues of chains A | B:
    [ paired rows: A's row | B's row (gap row where the species is missing) ]
    [ A's unpaired rows    | gaps ]
    [ gaps                 | B's unpaired rows ]
    [ zero padding up to MIN_MSA_ROWS ]
Identical chains (one entity) share one block whose rows span all their copies ("dense").
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protdp.data.parse import Msa
from protdp.data.residue_constants import RESTYPE_ATOM37_MASK
from protdp.data.safeio import atomic_write_text
from protdp.data.residues import GAP_ID, HHBLITS_ORDER, RESTYPES, UNK_ID, sequence_to_ids
from protdp.complex.pairing import (MAX_ROWS_PER_SPECIES, MAX_UNIPROT_HITS, Pairing,
                                     UniprotChainMsa, paired_chain_msa, pair_rows,
                                     pairing_report)

MSA_CROP_SIZE = 2048        # feature_processing.MSA_CROP_SIZE: rows per chain, paired + unpaired
MAX_TEMPLATES = 4           # feature_processing.MAX_TEMPLATES: templates per chain
MIN_MSA_ROWS = 512          # pipeline_multimer.pad_msa(np_example, 512): no empty extra MSA
TEMPLATE_KEYS = ("template_aatype", "template_all_atom_positions", "template_all_atom_mask")
MSA_KEYS = ("msa", "deletion_matrix")
# HHblits order (template one-hots) -> AF order, the gap kept as the gap
# (residue_constants.MAP_HHBLITS_AATYPE_TO_OUR_AATYPE)
HHBLITS_TO_AF = np.array([RESTYPES.index(ch) if ch in RESTYPES else
                          (GAP_ID if ch == "-" else UNK_ID) for ch in HHBLITS_ORDER], np.int64)


@dataclass
class ChainInput:
    """What one chain brings: its sequence, its MSA (query first), its UniProt alignment for
    pairing (heteromers) and AlphaFold-style monomer template features (or None). `paired`:
    rows paired elsewhere (ColabFold's a3m, the user's own pairing): row i of every chain's
    `paired` belongs together (an all-gap row = no partner), row 0 is the query; when every
    chain has one they replace the species pairing (no UniProt alignment needed)."""
    chain_id: str
    sequence: str
    msa: Msa
    uniprot: Msa | None = None
    templates: dict | None = None      # template_aatype [T, L, 22] one-hot HHblits order, ...
    paired: Msa | None = None          # rows already paired across chains (see `_pair_given`)


def _template_features(templates: dict | None, length: int) -> dict:
    """AlphaFold monomer template features -> multimer ones (`convert_monomer_features`):
    one-hot HHblits template_aatype -> AF-order ids (int64), *_masks -> *_mask."""
    if templates is None:
        return {"template_aatype": np.zeros((0, length), np.int64),
                "template_all_atom_positions": np.zeros((0, length, 37, 3), np.float32),
                "template_all_atom_mask": np.zeros((0, length, 37), np.float32)}
    hh = np.argmax(np.asarray(templates["template_aatype"]), axis=-1)
    mask = templates.get("template_all_atom_mask", templates.get("template_all_atom_masks"))
    return {"template_aatype": HHBLITS_TO_AF[hh],
            "template_all_atom_positions": np.asarray(templates["template_all_atom_positions"]),
            "template_all_atom_mask": np.asarray(mask)}


def _chain_features(c: ChainInput) -> dict:
    """One chain's multimer features before pairing (convert_monomer_features +
    process_unmerged_features)."""
    L = len(c.sequence)
    if c.msa.length != L:
        raise ValueError(f"chain {c.chain_id}: MSA has {c.msa.length} columns, sequence {L}")
    aatype = sequence_to_ids(c.sequence).astype(np.int32)                     # [L]
    dels = np.asarray(c.msa.deletion_matrix, np.float32)                      # [N, L]
    f = {"aatype": aatype,
         "residue_index": np.arange(L, dtype=np.int32),
         "seq_length": np.asarray(L, np.int32),
         "msa": c.msa.tokens().astype(np.int32),
         "deletion_matrix": dels,
         "num_alignments": np.asarray(c.msa.depth, np.int32),
         "deletion_mean": np.mean(dels, axis=0),
         "all_atom_mask": RESTYPE_ATOM37_MASK[aatype].astype(np.int32),
         "all_atom_positions": np.zeros((L, 37, 3)),
         **_template_features(c.templates, L)}
    return f


def _assembly_order(chains: list[ChainInput]) -> list[tuple[int, int, int]]:
    """(input index, entity_id, sym_id) per chain in AlphaFold's order (add_assembly_features):
    entities numbered by first appearance of their sequence, copies of an entity grouped; the
    position in this list + 1 is the chain's asym_id."""
    entity_of: dict[str, int] = {}
    members: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(chains):
        members[entity_of.setdefault(c.sequence, len(entity_of) + 1)].append(i)
    return [(i, e, s) for e, idx in members.items() for s, i in enumerate(idx, 1)]


def _crop(f: dict, paired: bool) -> dict:
    """`_crop_single_chain`: at most MSA_CROP_SIZE // 2 paired rows; unpaired rows cut so that
    paired rows that are not all gaps + unpaired rows <= MSA_CROP_SIZE; MAX_TEMPLATES."""
    n_msa = int(f["msa"].shape[0])
    if paired:
        n_pair = min(int(f["msa_all_seq"].shape[0]), MSA_CROP_SIZE // 2)
        non_gap = int(np.any(f["msa_all_seq"][:n_pair] != GAP_ID, axis=1).sum())
        n_msa = min(n_msa, max(MSA_CROP_SIZE - min(non_gap, n_pair), 0))
        for k in MSA_KEYS:
            f[k + "_all_seq"] = f[k + "_all_seq"][:n_pair]
    n_tpl = min(int(f["template_aatype"].shape[0]), MAX_TEMPLATES)
    for k in MSA_KEYS:
        f[k] = f[k][:n_msa]
    for k in TEMPLATE_KEYS:
        f[k] = f[k][:n_tpl]
    f["num_templates"] = np.asarray(n_tpl, np.int32)
    return f


def _block_diag(blocks: list[np.ndarray], pad) -> np.ndarray:
    """Block-diagonal [sum N, sum L] with `pad` off the blocks (msa_pairing.block_diag)."""
    out = np.full((sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)), pad,
                  dtype=np.result_type(*blocks))
    r = c = 0
    for b in blocks:
        out[r:r + b.shape[0], c:c + b.shape[1]] = b
        r, c = r + b.shape[0], c + b.shape[1]
    return out


_MSA_PAD = {"msa": GAP_ID, "deletion_matrix": 0}
_PER_RESIDUE = ("aatype", "residue_index", "all_atom_mask", "all_atom_positions", "asym_id",
                "sym_id", "entity_id", "deletion_mean")


def _merge_entity(copies: list[dict], paired: bool) -> dict:
    """Copies of one entity side by side (`_merge_homomers_dense_msa`): MSA rows concatenated
    along residues, templates along residues, per-residue features concatenated."""
    g = {k: np.concatenate([c[k] for c in copies], axis=0) for k in _PER_RESIDUE}
    keys = MSA_KEYS + (tuple(k + "_all_seq" for k in MSA_KEYS) if paired else ())
    g.update({k: np.concatenate([c[k] for c in copies], axis=1) for k in keys + TEMPLATE_KEYS})
    g["num_templates"] = copies[0]["num_templates"]
    return g


@dataclass
class ComplexFeatures:
    features: dict              # AlphaFold's multimer np_example (names, shapes, dtypes)
    report: dict                # the pairing per complex (JSON-ready)


def complex_features(chains: list[ChainInput], pair: bool = True) -> ComplexFeatures:
    """All chains of one complex, in input order -> AlphaFold's model input + pairing report.
    `pair=False`: no species pairing (training complexes stored without UniProt alignments:
    each chain's rows block-diagonally, as AlphaFold does for homomers)."""
    order = _assembly_order(chains)
    n_entities = len({e for _, e, _ in order})
    paired = n_entities > 1 and pair  # _is_homomer_or_monomer: one entity pairs nothing
    cache: dict[str, dict] = {}
    feats = []
    for asym, (i, e, s) in enumerate(order, 1):
        c = chains[i]
        if c.sequence not in cache:
            cache[c.sequence] = _chain_features(c)
        f = {k: v.copy() for k, v in cache[c.sequence].items()}
        L = len(c.sequence)
        f.update(asym_id=asym * np.ones(L), sym_id=s * np.ones(L), entity_id=e * np.ones(L))
        feats.append(f)
    report = {"chains": [{"asym_id": a, "chain_id": chains[i].chain_id, "entity_id": e,
                          "sym_id": s, "length": len(chains[i].sequence)}
                         for a, (i, e, s) in enumerate(order, 1)],
              "paired": paired}
    if paired and all(c.paired is not None for c in chains):
        _pair_given(chains, order, feats, report)
    elif paired:
        _pair(chains, order, feats, report)
    else:
        report["reason"] = ("one entity (homomer): AlphaFold pairs no rows" if n_entities == 1
                            else "pairing off (no UniProt alignments): unpaired rows only")
    for f in feats:
        _crop(f, paired)
    if paired:
        kept = int(feats[0]["msa_all_seq"].shape[0])
        report.update(report.pop("_finish")(kept))
    for f, ch in zip(feats, report["chains"]):
        ch["unpaired_rows"] = int(f["msa"].shape[0])
    return ComplexFeatures(_merge(feats, order, paired), report)


def _pair(chains, order, feats, report) -> None:
    """create_paired_features + deduplicate_unpaired_sequences, in place."""
    uniprot = []
    for i, _, _ in order:
        if chains[i].uniprot is None:
            raise ValueError(f"chain {chains[i].chain_id}: a heteromer needs every chain's "
                             f"UniProt alignment for pairing")
        u = UniprotChainMsa.from_msa(chains[i].uniprot)
        if u.tokens.shape[1] != len(chains[i].sequence) or \
                chains[i].uniprot.query != chains[i].msa.query:
            raise ValueError(f"chain {chains[i].chain_id}: the UniProt alignment's query "
                             f"({chains[i].uniprot.query[:20]}..., {u.tokens.shape[1]} aa) is not "
                             f"the chain's sequence ({len(chains[i].sequence)} aa)")
        uniprot.append(u)
    pairing: Pairing = pair_rows(uniprot)
    for k, (f, u) in enumerate(zip(feats, uniprot)):
        f["msa_all_seq"], f["deletion_matrix_all_seq"] = paired_chain_msa(u, pairing.rows[:, k])
    _deduplicate_unpaired(feats, report)
    chain_ids = [chains[i].chain_id for i, _, _ in order]
    report["_finish"] = lambda kept: pairing_report(uniprot, pairing, kept, chain_ids)


def _deduplicate_unpaired(feats, report) -> None:
    """deduplicate_unpaired_sequences: a chain's unpaired rows equal to one of its paired rows
    are dropped, in place."""
    for k, f in enumerate(feats):
        seen = {r.tobytes() for r in f["msa_all_seq"]}
        keep = [j for j, r in enumerate(f["msa"]) if r.tobytes() not in seen]
        report["chains"][k]["unpaired_duplicates_removed"] = int(len(f["msa"]) - len(keep))
        for key in MSA_KEYS:
            f[key] = f[key][keep]


def _pair_given(chains, order, feats, report) -> None:
    """Rows paired before (`ChainInput.paired`) take the place of create_paired_features: the
    same paired block, deduplication, cropping and merging follow, so equal rows give equal
    features. Every chain's paired rows: the same count, the chain's columns, query first."""
    depth = {chains[i].paired.depth for i, _, _ in order}
    if len(depth) != 1:
        counts = ", ".join(f"{chains[i].chain_id}: {chains[i].paired.depth}" for i, _, _ in order)
        raise ValueError(f"the given paired rows differ in number between chains ({counts})")
    for (i, _, _), f in zip(order, feats):
        p = chains[i].paired
        if p.length != len(chains[i].sequence) or p.sequences[0] != chains[i].sequence:
            raise ValueError(f"chain {chains[i].chain_id}: the first paired row is not the "
                             f"chain's sequence ({len(chains[i].sequence)} aa)")
        f["msa_all_seq"] = p.tokens().astype(np.int32)                        # [P, L]
        f["deletion_matrix_all_seq"] = np.asarray(p.deletion_matrix, np.float32)
    _deduplicate_unpaired(feats, report)
    ids = [chains[i].chain_id for i, _, _ in order]
    gap = {i: chains[i].paired.tokens() == GAP_ID for i, _, _ in order}

    def finish(kept: int) -> dict:
        rows = []
        for r in range(kept):
            has = {c: not gap[i][r].all() for c, (i, _, _) in zip(ids, order)}
            rows.append({"species": None,
                         "rows": {c: (r if has[c] else None) for c in ids},
                         "names": {c: (chains[i].paired.names[r] if has[c] else None)
                                   for c, (i, _, _) in zip(ids, order)}})
        return {"paired_rows": rows, "paired_rows_cropped": int(next(iter(depth)) - kept),
                "pairing_source": "given (rows paired before; not re-paired)"}
    report["_finish"] = finish


def _merge(feats: list[dict], order, paired: bool) -> dict:
    """merge_chain_features + process_final + pad_msa."""
    for f in feats:                                   # _pad_templates
        n = MAX_TEMPLATES - f["template_aatype"].shape[0]
        for k in TEMPLATE_KEYS:
            f[k] = np.pad(f[k], [(0, n)] + [(0, 0)] * (f[k].ndim - 1))
    by_entity: dict[int, list[dict]] = defaultdict(list)
    for f, (_, e, _) in zip(feats, order):
        by_entity[e].append(f)
    groups = [_merge_entity(by_entity[e], paired) for e in sorted(by_entity)]
    x = {k: np.concatenate([g[k] for g in groups], axis=0) for k in _PER_RESIDUE}
    x.update({k: np.concatenate([g[k] for g in groups], axis=1) for k in TEMPLATE_KEYS})
    x.update({k: _block_diag([g[k] for g in groups], _MSA_PAD[k]) for k in MSA_KEYS})
    ones = _block_diag([np.ones(g["msa"].shape, np.float32) for g in groups], 0)
    if paired:
        for k in MSA_KEYS:
            x[k] = np.concatenate([np.concatenate([g[k + "_all_seq"] for g in groups], axis=1),
                                   x[k]])
        n_pair = groups[0]["msa_all_seq"].shape[0]
        x["bert_mask"] = np.concatenate([np.ones((n_pair, ones.shape[1]), np.float32), ones])
        x["cluster_bias_mask"] = np.zeros(x["msa"].shape[0])
        x["cluster_bias_mask"][0] = 1
    else:
        x["bert_mask"] = ones
        x["cluster_bias_mask"] = np.concatenate(
            [np.eye(1, g["msa"].shape[0]).ravel() for g in groups])
    x["msa"] = x["msa"].astype(np.int32)
    x["num_templates"] = groups[0]["num_templates"]
    x["seq_length"] = np.asarray(x["aatype"].shape[0], np.int32)
    x["num_alignments"] = np.asarray(x["msa"].shape[0], np.int32)
    x["assembly_num_chains"] = np.asarray(len(feats))
    x["entity_mask"] = (x["entity_id"] != 0).astype(np.int32)
    x["seq_mask"] = (x["entity_id"] > 0).astype(np.float32)
    x["msa_mask"] = np.ones_like(x["msa"], dtype=np.float32) * x["seq_mask"][None]
    n_pad = MIN_MSA_ROWS - x["msa"].shape[0]
    if n_pad > 0:
        for k in ("msa", "deletion_matrix", "bert_mask", "msa_mask"):
            x[k] = np.pad(x[k], ((0, n_pad), (0, 0)))
        x["cluster_bias_mask"] = np.pad(x["cluster_bias_mask"], (0, n_pad))
    return x


def write_pairing_report(path: str | Path, complex_id: str, report: dict) -> Path:
    """The pairing of one complex as JSON (temporary file + rename): chains with their AlphaFold
    asym/entity/sym ids, every paired row with its species and the row (index and name) of each
    chain's UniProt alignment, rows removed as duplicates, and the limits that applied."""
    doc = {"complex_id": complex_id,
           "method": ("rows paired before (ColabFold's complex a3m or the user's paired "
                      "files), kept as given" if report.get("pairing_source") else
                      "AlphaFold-Multimer v2.3.2 msa_pairing (species from UniProt entry "
                      "names; rows ranked by identity to the query)"),
           "limits": {"max_uniprot_hits": MAX_UNIPROT_HITS,
                      "max_rows_per_species": MAX_ROWS_PER_SPECIES,
                      "msa_crop_size": MSA_CROP_SIZE, "max_templates": MAX_TEMPLATES,
                      "min_msa_rows": MIN_MSA_ROWS},
           **report}
    path = Path(path)
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def chain_msa_rows(features: dict) -> tuple[list[int], np.ndarray]:
    """What the model's MSA gives each chain (paired block and unpaired rows alike, whatever
    the pair mode): (per chain in asym order, the rows with a residue in its columns; per
    residue [N_res], the rows with a residue there). Padding rows are not counted."""
    n = int(features["num_alignments"])
    present = np.asarray(features["msa"])[:n] != GAP_ID                       # [n, N_res]
    asym = np.asarray(features["asym_id"])
    depths = [int(present[:, asym == a].any(axis=1).sum()) for a in dict.fromkeys(asym.tolist())]
    return depths, present.sum(axis=0)
