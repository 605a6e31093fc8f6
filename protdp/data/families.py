"""The map step of `protdp data build`: one FamilySpec -> families and reject records.

`process_family` parses, merges, pairs and filters one spec and never raises: every problem
(an InputError, a library's internal error, MemoryError) becomes a reject record with one clean
line. `run_specs` runs it over a process pool; if a worker process dies, the unfinished specs are
retried one per fresh process so only the culprit is lost (AF2's data pipeline is the same
per-chain map, Supplement 1.2).
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from protdp.data.atoms import read_structure
from protdp.data.discover import FamilySpec
from protdp.data.filters import FilterConfig, check_family
from protdp.data.parse import (list_chains, merge_msas, pair_msa_structure, parse_msa,
                               parse_structure)
from protdp.data.residues import sequence_to_ids
from protdp.errors import InputError

SINGLE_SEQUENCE_HINT = "pass --allow-single-sequence to keep it as a single-sequence family"


def reject_record(kind: str, file: str | None, reason: str, family_id: str | None = None,
            line: int | None = None, rule: str | None = None) -> dict:
    return {"kind": kind, "family_id": family_id, "file": file, "line": line, "rule": rule,
            "reason": reason}


def _from_error(exc: Exception, kind: str, family_id: str | None, rule: str,
                file: str | None, what: str) -> dict:
    """Reject record for any exception: an InputError keeps its file/line/reason; anything else
    (a library bug, MemoryError) becomes one clear line without the library's own text."""
    if isinstance(exc, InputError):
        reason = exc.reason if exc.field is None else f"field '{exc.field}': {exc.reason}"
        return reject_record(kind, exc.path or file, reason, family_id, exc.line, rule)
    if isinstance(exc, MemoryError):
        reason = f"out of memory while reading this {what}"
    else:
        reason = (f"could not be read as a {what}: the reader failed on its content "
                  f"(malformed or unsupported file)")
    return reject_record(kind, file, reason, family_id, None, rule)


def _single_sequence(chain):
    tokens = sequence_to_ids(chain.sequence)[None]                       # [1, L]
    return (chain.sequence, tokens, np.zeros_like(tokens), chain.all_atom_positions,
            chain.all_atom_mask, chain.residue_index, chain.between_segment, {})


def _build_one(fid: str, spec: FamilySpec, chain_id: str, msas, cfg: FilterConfig, screen,
               data, warnings: list[str]):
    """One chain -> (family dict | None, family reject | None)."""
    try:
        chain = parse_structure(spec.structure_file, chain_id, data=data)
    except Exception as exc:   # noqa: BLE001  (per-item isolation: any failure is a reject)
        return None, _from_error(exc, "family", fid, "structure", spec.structure_file,
                                 "structure file")
    try:
        if msas:
            msa = merge_msas(msas)
            paired = pair_msa_structure(msa.query, chain, msa.sources[0], spec.structure_file,
                                        min_coverage=cfg.min_pairing_coverage,
                                        min_identity=cfg.min_pairing_identity)
            cut = [m for m in msas if m.query_cut and m.query == msa.query]
            if cut and len(msa.query) < len(chain.sequence):     # a related but cut query
                raise InputError(f"the file ends inside its query sequence (no final newline) "
                                 f"and the query ({len(msa.query)} residues) is shorter than "
                                 f"the structure's sequence ({len(chain.sequence)}): a truncated "
                                 f"MSA file", path=cut[0].sources[0])
            query, tokens, dels = msa.query, msa.tokens(), msa.deletion_matrix
            pos, mask = paired.all_atom_positions, paired.all_atom_mask
            ridx, brk, pairing = paired.residue_index, paired.between_segment, paired.info
        else:
            query, tokens, dels, pos, mask, ridx, brk, pairing = _single_sequence(chain)
    except Exception as exc:   # noqa: BLE001
        return None, _from_error(exc, "family", fid, "pairing", spec.structure_file,
                                 "MSA / structure pair")
    failed = check_family(query, chain.resolution, int(mask[:, 1].sum()), cfg, screen)
    if failed is not None:
        return None, reject_record("family", spec.structure_file, failed[1], fid, rule=failed[0])
    return {
        "family_id": fid,
        "msa": tokens.astype(np.uint8),                                          # [N, L]
        "deletion_matrix": np.minimum(dels, cfg.deletion_clip).astype(np.uint8),  # [N, L]
        "residue_index": np.asarray(ridx, np.int32),                             # [L]
        "all_atom_positions": np.where(mask[..., None], pos, 0).astype(np.float32),  # [L,37,3]
        "all_atom_mask": mask.astype(np.uint8),                                  # [L, 37]
        "between_segment_residues": np.asarray(brk, np.uint8),                   # [L]
        "sequence": query,
        "resolution": float(chain.resolution),
        "chain": chain.chain_id,
        "structure_file": spec.structure_file,
        "msa_files": [m for msa in msas for m in msa.sources],
        "placement": chain.placement,
        "warnings": warnings + chain.warnings,
        "pairing": pairing,
        "dropped_atoms": chain.dropped_atoms,
    }, None


def _read_msas(spec: FamilySpec, out: dict) -> list:
    msas = []
    for f in spec.msa_files:
        try:
            msas.append(parse_msa(f))
        except Exception as exc:   # noqa: BLE001
            out["rejects"].append(_from_error(exc, "file", spec.family_id, "parse", f,
                                              "multiple sequence alignment"))
    return msas


def _chains_to_build(spec: FamilySpec, out: dict):
    """(structure data, [(family id, chain id)]) or None when the structure is rejected."""
    try:
        data = read_structure(spec.structure_file)
        if spec.chain is not None:
            return data, [(spec.family_id, spec.chain)]
        chains = list_chains(spec.structure_file, data=data)
        if not chains:
            parse_structure(spec.structure_file, None, data=data)   # raises: says why
            raise InputError("no protein chain found", path=spec.structure_file)
    except Exception as exc:   # noqa: BLE001
        out["rejects"].append(_from_error(exc, "family", spec.family_id, "structure",
                                          spec.structure_file, "structure file"))
        return None
    stem = Path(spec.structure_file).name.split(".")[0]
    return data, [(f"{stem}_{c}" if c else stem, c) for c in chains]


def process_family(spec: FamilySpec, cfg: FilterConfig, screen=None) -> dict:
    """Parse, merge, pair and filter one spec (runs in a worker; never raises). Returns
    {'families': [family dict, ...], 'rejects': [reject record, ...]}."""
    out = {"families": [], "rejects": []}
    msas = _read_msas(spec, out)
    if spec.structure_file is None:
        for m in msas:
            out["rejects"].append(reject_record("file", m.sources[0], "no structure file found for "
                                          "this MSA (expected <pdb>.cif|pdb beside it)",
                                          spec.family_id, rule="unpaired"))
        return out
    warnings = []
    if not msas and not cfg.allow_single_sequence:
        why = (f"all {len(spec.msa_files)} MSA file(s) of this family failed to read (see "
               f"their records)" if spec.msa_files else "no MSA for this structure")
        out["rejects"].append(reject_record("family", spec.structure_file,
                                      f"{why}; {SINGLE_SEQUENCE_HINT}", spec.family_id,
                                      rule="msa"))
        return out
    if not msas and spec.msa_files:
        warnings.append("every MSA file failed to read: stored as a single-sequence family "
                        "(allow_single_sequence)")
    todo = _chains_to_build(spec, out)
    if todo is None:
        return out
    data, chains = todo
    for fid, chain_id in chains:
        fam, rej = _build_one(fid, spec, chain_id, msas, cfg, screen, data, warnings)
        out["families" if fam is not None else "rejects"].append(fam if fam is not None
                                                                 else rej)
    return out


def _safe_process(spec: FamilySpec, cfg: FilterConfig, screen) -> dict:
    try:
        return process_family(spec, cfg, screen)
    except Exception as exc:   # noqa: BLE001  (a bug here must not end the batch either)
        return {"families": [], "rejects": [_from_error(exc, "family", spec.family_id,
                                                        "internal", spec.structure_file,
                                                        "family")]}


_WORKER: dict = {}


def _init_worker(cfg: FilterConfig, screen) -> None:
    _WORKER["cfg"], _WORKER["screen"] = cfg, screen


def _work(spec: FamilySpec) -> dict:
    return _safe_process(spec, _WORKER["cfg"], _WORKER["screen"])


def _died(spec: FamilySpec) -> dict:
    return {"families": [], "rejects": [reject_record(
        "family", spec.structure_file, "the parser process died while reading this input "
        "(killed, out of memory or crashed); nothing from it was stored", spec.family_id,
        rule="internal")]}


def run_specs(todo: list[FamilySpec], cfg: FilterConfig, screen, workers: int):
    """Yield (spec, result) for every spec. With workers > 1 a process pool parses; if a worker
    dies, the unfinished specs are retried one per fresh process so only the culprit is lost."""
    workers = min(workers, len(todo))            # a fork pool starts all its workers at once
    if workers <= 1:
        for spec in todo:
            yield spec, _safe_process(spec, cfg, screen)
        return
    ctx = mp.get_context("fork")
    suspects = []
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(cfg, screen)) as pool:
        futures = {pool.submit(_work, s): s for s in todo}
        for fut in as_completed(futures):
            try:
                res = fut.result()
            except BrokenProcessPool:
                suspects.append(futures[fut])
                continue
            yield futures[fut], res
    for spec in suspects:
        try:
            with ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker,
                                     initargs=(cfg, screen)) as pool:
                res = pool.submit(_work, spec).result()
        except BrokenProcessPool:
            res = _died(spec)
        yield spec, res
