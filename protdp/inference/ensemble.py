"""Running every (model, seed) prediction of one target: memory-aware chunking, out-of-memory
retries, early stop of recycling, timings.

For each checkpoint i (AlphaFold's `model_1..5`) and seed s (`--seeds N` from `--random-seed`):
features are sampled with seed s (AF2's MSA sampling / masking is the only randomness at
inference), the chunk size is chosen so that the predicted peak (`memory.predicted_peak_bytes`)
fits `--max-memory`, and on an out-of-memory error the same member is retried with smaller
chunks (`memory.smaller_chunks`); when those fail too the target fails with the reason.
`--stop-at-score` also ends the ensemble early, as ColabFold does: once a member reaches the
score, the remaining members are not run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from protdp.data.features import collate
from protdp.errors import ProtdpError
from protdp.inference.memory import (TargetSize, choose_chunk_size, is_out_of_memory,
                                     release_cached_memory, set_chunk_size, smaller_chunks)
from protdp.inference.ranking import prediction_name
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


def _to_numpy(out: dict, keep_distogram: bool) -> dict:
    res = {"positions": out["final_atom_positions"][0].float().cpu().numpy(),   # [L, 37, 3]
           "atom_mask": out["final_atom_mask"][0].float().cpu().numpy(),         # [L, 37]
           "plddt": out["plddt"][0].float().cpu().numpy(),                       # [L]
           "num_recycles": int(out["num_recycles"])}
    if "pae" in out:
        res["pae"] = out["pae"][0].float().cpu().numpy()                         # [L, L]
        res["ptm"] = float(out["ptm"].reshape(-1)[0])
    if keep_distogram:
        res["distogram_logits"] = out["distogram_logits"][0].float().cpu().numpy()  # [L, L, B]
    return res


@torch.no_grad()
def run_member(model: torch.nn.Module, features: dict, device: torch.device, *,
               num_recycles: int | None, size: TargetSize, n_params: int,
               max_memory_bytes: int | None, tolerance: float | None,
               stop_at_score: float | None, keep_distogram: bool,
               forward=None) -> dict:
    """One prediction with chunk choice + OOM retries; adds 'chunk_size', 'oom_retries',
    'predicted_peak_gib', 'early_stop', 'seconds'. `forward(batch, chunk, hook)` replaces the
    model call (tests simulate running out of memory through it)."""
    batch = {**collate([features]),    # template keys: one target, no padding to collate
             **{k: v[None] for k, v in features.items() if k.startswith("template_")}}
    batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
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
