"""Running every (model, seed) prediction of one target: memory-aware chunking, out-of-memory
retries, early stop of recycling, timings.

For each checkpoint i (AlphaFold's `model_1..5`) and seed s (`--seeds N` from `--random-seed`):
features are sampled with seed s (AF2's MSA sampling / masking is the only randomness at
inference), the chunk size is chosen so that the predicted peak (`memory.predicted_peak_bytes`)
fits `--max-memory`, and on an out-of-memory error the same member is retried with smaller
chunks (`memory.smaller_chunks`); when those fail too the target fails with the reason.
`--stop-at-score` also ends the ensemble early, as ColabFold does: once a member reaches the
score, the remaining members are not run.

Seeds batched (issue 45): the seeds of one checkpoint differ only in their features (same
length, same MSA depth after the cap), so `--seeds N` runs them as one batch [N, ...] through
the model when the memory model says N working sets fit (`memory.seed_batch_size`; else
groups of fewer, down to one at a time), no per-member early stop needs them apart, and
--batch-seeds allows it (`seed_groups`: by default on CUDA only). Each
seed keeps its own features (its MSA sample and masking), so the outputs are those of the
seeds run one after another; an out-of-memory error in a batch falls back to one at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from protdp.data.features import collate
from protdp.errors import ProtdpError
from protdp.inference.memory import (TargetSize, choose_chunk_size, device_budget_bytes,
                                     is_out_of_memory, predicted_peak_bytes,
                                     release_cached_memory, seed_batch_size, set_chunk_size,
                                     smaller_chunks)
from protdp.inference.model_names import colabfold_tag
from protdp.inference.ranking import model_numbers, prediction_name
from protdp.inference.recycling import RecycleEarlyStop

GIB = 1024 ** 3


class TargetOutOfMemory(ProtdpError):
    """Every chunk size ran out of memory: the target is recorded as failed."""


@dataclass
class Member:
    """One (model, seed) of the ensemble."""
    model_index: int
    seed: int
    number: int = 0    # model number in the names (`ranking.model_numbers`); 0: model_index + 1

    @property
    def name(self) -> str:
        return prediction_name((self.number or self.model_index + 1) - 1, self.seed)


def members(n_models: int, first_seed: int, n_seeds: int,
            numbers: list[int] | None = None) -> list[Member]:
    """AlphaFold's order: model_1 seeds..., model_2 seeds..."""
    return [Member(i, first_seed + s, numbers[i] if numbers else 0)
            for i in range(n_models) for s in range(n_seeds)]


def _to_numpy(out: dict, keep_distogram: bool, b: int = 0) -> dict:
    """Batch element `b` of the model's outputs."""
    res = {"positions": out["final_atom_positions"][b].float().cpu().numpy(),   # [L, 37, 3]
           "atom_mask": out["final_atom_mask"][b].float().cpu().numpy(),         # [L, 37]
           "plddt": out["plddt"][b].float().cpu().numpy(),                       # [L]
           "num_recycles": int(out["num_recycles"])}
    if "pae" in out:
        res["pae"] = out["pae"][b].float().cpu().numpy()                         # [L, L]
        res["ptm"] = float(out["ptm"].reshape(-1)[b])
    if keep_distogram:
        res["distogram_logits"] = out["distogram_logits"][b].float().cpu().numpy()  # [L, L, B]
    return res


def model_batch(features: list[dict], device: torch.device) -> dict:
    """The model's batch [B, ...] of B examples of one target (template keys stacked: no
    padding, one target), on `device`."""
    batch = {**collate(features),
             **{k: torch.stack([f[k] for f in features])
                for k in features[0] if k.startswith("template_")}}
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}


@torch.no_grad()
def run_member(model: torch.nn.Module, features: dict, device: torch.device, *,
               num_recycles: int | None, size: TargetSize, n_params: int,
               max_memory_bytes: int | None, tolerance: float | None,
               stop_at_score: float | None, keep_distogram: bool,
               forward=None) -> dict:
    """One prediction with chunk choice + OOM retries; adds 'chunk_size', 'oom_retries',
    'predicted_peak_gib', 'early_stop', 'seconds'. `forward(batch, chunk, hook)` replaces the
    model call (tests simulate running out of memory through it)."""
    batch = model_batch([features], device)
    chunk, need = choose_chunk_size(model.config, size, n_params, max_memory_bytes)
    tries = [chunk] + smaller_chunks(chunk, size.L)
    failures = []
    for c in tries:
        hook = RecycleEarlyStop(tolerance, stop_at_score)
        t0 = time.perf_counter()
        try:
            set_chunk_size(model, c)
            if forward is not None:
                out = forward(batch, c, hook)
            else:
                out = model(batch, num_recycles=num_recycles,
                            after_pass=hook if (tolerance is not None or stop_at_score is not None)
                            else None)
            res = _to_numpy(out, keep_distogram)
        except Exception as exc:   # noqa: BLE001  (only memory errors are retried)
            if not is_out_of_memory(exc):
                raise
            failures.append(f"chunk {c or 'none'}: {str(exc).splitlines()[0][:120]}")
            del exc
            release_cached_memory(device)
            continue
        finally:
            set_chunk_size(model, model.config.chunk_size)
        res.update(chunk_size=c, oom_retries=failures, predicted_peak_gib=round(need / GIB, 4),
                   early_stop=hook.record(), seconds=round(time.perf_counter() - t0, 3))
        return res
    raise TargetOutOfMemory("out of memory with every chunk size tried ("
                            + "; ".join(failures) + ")")


def ensemble_stops(pred: dict, stop_at_score: float | None) -> bool:
    """ColabFold: with --stop-at-score, no further members once one reaches it."""
    return stop_at_score is not None and float(np.mean(pred["plddt"])) >= stop_at_score


@dataclass(frozen=True)
class SeedPlan:
    """How one checkpoint's seeds run (`seed_groups`): `group` seeds per batch; `seed_chunk`,
    the row chunk chosen for one seed of length `length`, and its predicted peak
    `seed_peak_bytes`."""
    group: int
    seed_chunk: int | None = None
    seed_peak_bytes: int = 0
    length: int = 0

    def chunk_for(self, seeds: int) -> int | None:
        """The row chunk of a batch of `seeds` seeds (`batch_chunk`)."""
        return batch_chunk(self.seed_chunk, self.length, seeds)


def batch_chunk(chunk: int | None, length: int, group: int) -> int | None:
    """Row chunk of a batch of `group` seeds whose chunked steps (attention, outer product
    mean: memory.working_set_elements) hold one seed's working set at `chunk` (None: all
    `length` rows): chunk / group rows of every seed at a time."""
    if group < 2:
        return chunk
    return max(1, (length if chunk is None else chunk) // group)


@torch.no_grad()
def run_seeds_batched(model: torch.nn.Module, features: list[dict], device: torch.device, *,
                      num_recycles: int | None, plan: SeedPlan,
                      keep_distogram: bool) -> list[dict] | None:
    """The seeds' features [B] through the model as one batch at `plan.chunk_for(B)`; one
    result per seed, as `run_member` gives it (seconds: the batch's share). None when the batch
    runs out of memory (the caller then runs the seeds one at a time)."""
    batch = model_batch(features, device)
    chunk = plan.chunk_for(len(features))
    t0 = time.perf_counter()
    try:
        set_chunk_size(model, chunk)
        out = model(batch, num_recycles=num_recycles)
        results = [_to_numpy(out, keep_distogram, b) for b in range(len(features))]
    except Exception as exc:   # noqa: BLE001  (only memory errors fall back)
        if not is_out_of_memory(exc):
            raise
        del exc
        release_cached_memory(device)
        return None
    finally:
        set_chunk_size(model, model.config.chunk_size)
    seconds = round((time.perf_counter() - t0) / len(features), 3)
    for res in results:
        res.update(chunk_size=chunk, oom_retries=[],
                   predicted_peak_gib=round(plan.seed_peak_bytes / GIB, 4),
                   early_stop=RecycleEarlyStop(None, None).record(), seconds=seconds,
                   seeds_batched=len(features))
    return results


def seed_groups(pred, loaded, size: TargetSize, n_seeds: int, batchable: bool) -> SeedPlan:
    """How a checkpoint's seeds run: `memory.seed_batch_size` under --max-memory, else under
    the device's free memory, at the row chunk that keeps one seed's working set per chunked
    step (`batch_chunk`). --batch-seeds "auto" batches on CUDA only: on a CPU, compute and
    memory traffic bound a prediction and batching removes only the per-seed fixed overhead,
    at most ~1.1x at L=100 (measured floor and batched vs sequential, 1 and 2 threads:
    benchmarks/results/predict_throughput.json `seeds`)."""
    c = pred.config
    mode = c.batch_seeds
    if (not batchable or n_seeds < 2 or mode == "never"
            or (mode == "auto" and pred.device.type != "cuda")):
        return SeedPlan(1, None)
    budget = (int(c.max_memory_gib * GIB) if c.max_memory_gib is not None
              else device_budget_bytes(pred.device))
    cfg, n_params = loaded.model.config, loaded.model.num_parameters()
    group, chunk = seed_batch_size(cfg, size, n_params, n_seeds, budget)
    return SeedPlan(group, chunk, predicted_peak_bytes(cfg, size, chunk, n_params), size.L)


def feature_passes(config, model_config) -> int:
    """MSA samples of one prediction: one per recycling pass (--num-recycles, else the
    checkpoint's), the key of prefetched features (`prefetch`)."""
    return (config.num_recycles if config.num_recycles is not None
            else model_config.num_recycles) + 1


def _member_features(pred, loaded, seq: str, msa, family_id: str, mem: Member,
                     template_inputs: dict | None, timings: dict) -> dict:
    t0 = time.perf_counter()
    passes = feature_passes(pred.config, loaded.config)
    cache = getattr(pred, "feature_cache", None)        # prefetched (`prefetch`), else None
    feats = None if cache is None else cache(seq, family_id, mem.seed, passes)
    if feats is None:
        feats = pred.features(seq, msa, family_id, seed=mem.seed, loaded=loaded)
    if template_inputs and loaded.config.templates:
        feats.update(template_inputs)
    timings[f"process_features_{mem.name}"] = round(time.perf_counter() - t0, 3)
    return feats


def run_ensemble(pred, seq: str, msa, family_id: str, forward=None,
                 template_inputs: dict | None = None) -> tuple[dict, dict]:
    """Every (model, seed) prediction of one target for predictor `pred` -> ({name:
    prediction}, timings.json); `template_inputs` go to the members with a template module.
    A checkpoint's seeds run batched when `seed_groups` allows and no member may stop early
    (--stop-at-score, --recycle-early-stop-tolerance) or `forward` replaces the model."""
    c = pred.config
    preds, timings = {}, {}
    budget = None if c.max_memory_gib is None else int(c.max_memory_gib * GIB)
    numbers = model_numbers([m.path for m in pred.models])
    batchable = (forward is None and c.recycle_early_stop_tolerance is None
                 and c.stop_at_score is None)
    everyone = members(len(pred.models), c.seed, c.num_seeds, numbers)
    for i, loaded in enumerate(pred.models):
        mine = [m for m in everyone if m.model_index == i]
        ready = {mine[0].name: _member_features(pred, loaded, seq, msa, family_id, mine[0],
                                                template_inputs, timings)}
        first = ready[mine[0].name]
        size = TargetSize(len(seq), int(first["msa"].shape[-2]),
                          int(first["extra_msa"].shape[-2]) if "extra_msa" in first else 0)
        n_params = loaded.model.num_parameters()
        plan = seed_groups(pred, loaded, size, len(mine), batchable)
        for start in range(0, len(mine), plan.group):
            part = mine[start:start + plan.group]
            feats = [ready.pop(m.name, None) or _member_features(
                pred, loaded, seq, msa, family_id, m, template_inputs, timings) for m in part]
            results = None if len(part) == 1 else run_seeds_batched(
                loaded.model, feats, pred.device, num_recycles=c.num_recycles,
                plan=plan, keep_distogram=c.save_distogram)
            for k, mem in enumerate(part):
                res = results[k] if results is not None else run_member(
                    loaded.model, feats[k], pred.device, num_recycles=c.num_recycles,
                    size=size, n_params=n_params, max_memory_bytes=budget,
                    tolerance=c.recycle_early_stop_tolerance, stop_at_score=c.stop_at_score,
                    keep_distogram=c.save_distogram, forward=forward)
                names = pred.member_names[mem.model_index]     # AlphaFold / ColabFold names
                res.update(model_index=mem.model_index, model_number=numbers[mem.model_index],
                           seed=mem.seed, **names,
                           colabfold_tag=colabfold_tag(mem.name, names["model_type"]),
                           msa_rows_used=size.S, checkpoint_sha256=loaded.sha256)
                timings[f"predict_and_compile_{mem.name}"] = res["seconds"]
                preds[mem.name] = res
                if ensemble_stops(res, c.stop_at_score):
                    return preds, timings
    return preds, timings
