"""Memory-aware prediction: peak memory of one target from its sizes, the chunk size that fits
a budget, and out-of-memory retries with smaller chunks.

Inference keeps no activations for backward, so the peak is the weights plus the working set
of the largest step of one Evoformer block (AF2 supplement 1.11.8: chunking bounds it). The
element counts come from the planner's accounting of the same modules
(`protdp.planning.memory`, Algorithms 6-23), here for a forward pass only:

- streams alive throughout: MSA m [S, L, c_m], extra MSA [S_e, L, c_e], pair z [L, L, c_z];
- the largest transient step, one of
  * triangle multiplication (Alg. 11/12, not chunked): LN(z), a, b, gates [L, L, 4 c_z + 8 t];
  * triangle attention (Alg. 13/14) over rows of z: logits and probabilities [C, H, L, L]
    (both alive during the softmax) for C rows at a time (C = chunk size, L without chunking)
    plus q, k, v, gate [C, L, 4 h c];
  * MSA row attention (Alg. 7): [C, H, L, L] for C MSA rows; column attention (Alg. 8)
    [C, H, S, S] for C columns;
  * outer-product mean (Alg. 10): [C, L, c_opm^2] for C rows.

`benchmarks/predict_memory.py` checks the prediction against the measured peak and publishes
the length -> memory table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from protdp.model.config import ModelConfig

BYTES = 4                                  # fp32 activations (see planning.memory)
HEADROOM = 1.2          # predicted x this must fit the budget (measured/predicted <= 1.39,
                        # benchmarks/results/predict_memory.json)
LOGIT_COPIES = 2        # logits and softmax probabilities [C, H, Q, Q] are alive together
CHUNK_CHOICES = (None, 256, 128, 64, 32, 16, 8, 4, 2, 1)   # tried in this order


@dataclass(frozen=True)
class TargetSize:
    """Sizes of one inference example: length L, MSA rows S, extra-MSA rows."""
    L: int
    S: int
    S_extra: int = 0


def _rows(chunk: int | None, n: int) -> int:
    return n if chunk is None else min(chunk, n)


def working_set_elements(cfg: ModelConfig, size: TargetSize, chunk: int | None) -> dict[str, int]:
    """Elements alive at the peak of one inference pass, by term (see module docstring)."""
    L, S = size.L, size.S
    Se = size.S_extra if cfg.extra_msa else 0
    P, cz, cm = L * L, cfg.c_z, cfg.c_m
    hp, hm = cfg.pair_heads, cfg.msa_heads
    hcp, hcm = hp * cfg.c_hidden_tri_att, hm * cfg.c_hidden_msa_att
    t, o = cfg.c_hidden_tri_mul, cfg.c_hidden_opm
    streams = S * L * cm + Se * L * cfg.c_e + 3 * P * cz    # m, extra m, z + residual + update
    steps = {
        "triangle_multiplication": P * (4 * cz + 8 * t),
        "triangle_attention": _rows(chunk, L) * (LOGIT_COPIES * hp * L * L + 4 * L * hcp)
        + P * hp,
        "msa_row_attention": _rows(chunk, S) * (LOGIT_COPIES * hm * L * L + 4 * L * hcm) + P * hm,
        "msa_column_attention": _rows(chunk, L) * (LOGIT_COPIES * hm * S * S + 4 * S * hcm),
        "outer_product_mean": _rows(chunk, L) * L * o * o + 2 * S * L * o,
    }
    if Se:
        steps["extra_msa_row_attention"] = _rows(chunk, Se) * LOGIT_COPIES * hm * L * L + P * hm
    # the structure module and heads: pair-sized logits (distogram, PAE) at the end
    steps["heads"] = P * (cfg.distogram_bins + (cfg.pae_bins if cfg.pae_head else 0))
    return {"streams": streams, **steps}


def predicted_peak_bytes(cfg: ModelConfig, size: TargetSize, chunk: int | None,
                         n_params: int) -> int:
    """Predicted peak bytes of predicting one target: weights + streams + largest step."""
    e = working_set_elements(cfg, size, chunk)
    step = max(v for k, v in e.items() if k != "streams")
    return BYTES * (n_params + e["streams"] + step)


def choose_chunk_size(cfg: ModelConfig, size: TargetSize, n_params: int,
                      max_bytes: int | None) -> tuple[int | None, int]:
    """Largest chunk (None = unchunked first) whose predicted peak fits `max_bytes`; the
    smallest chunk when none fits (the OOM retry then decides). Returns (chunk, bytes)."""
    for chunk in CHUNK_CHOICES:
        need = predicted_peak_bytes(cfg, size, chunk, n_params)
        if max_bytes is None or need * HEADROOM <= max_bytes:
            return chunk, need
    return CHUNK_CHOICES[-1], predicted_peak_bytes(cfg, size, CHUNK_CHOICES[-1], n_params)


def seed_batch_size(cfg: ModelConfig, size: TargetSize, n_params: int, n_seeds: int,
                    max_bytes: int | None) -> tuple[int, int | None]:
    """How many seeds of one target run as one batch (`--seeds N`): the largest B <= n_seeds
    whose predicted peak, the weights once and B working sets at the chunk size chosen for one
    seed, fits `max_bytes` (None: no limit); 1 when even two do not fit. Returns (B, chunk)."""
    chunk, one = choose_chunk_size(cfg, size, n_params, max_bytes)
    per_seed = one - BYTES * n_params
    for b in range(max(n_seeds, 1), 1, -1):
        if max_bytes is None or (BYTES * n_params + b * per_seed) * HEADROOM <= max_bytes:
            return b, chunk
    return 1, chunk


def device_budget_bytes(device: torch.device) -> int | None:
    """Memory the seeds of a batch may use when --max-memory is not given: free device memory
    on CUDA, half the available RAM on a CPU (None when it cannot be read)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import os
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return None


def smaller_chunks(chunk: int | None, L: int) -> list[int]:
    """The chunk sizes to retry with after an out-of-memory error at `chunk`: halving, at
    most 3 retries, never below 1."""
    start = L if chunk is None else chunk
    out, c = [], start // 2
    while c >= 1 and len(out) < 3:
        out.append(c)
        c //= 2
    return out


def set_chunk_size(model: torch.nn.Module, chunk: int | None) -> None:
    """Set the row-chunk size of every module that chunks (Evoformer / extra-MSA blocks)."""
    for module in model.modules():
        if hasattr(module, "chunk_size") and not isinstance(module.chunk_size, torch.Tensor):
            module.chunk_size = chunk


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA / CPU allocation failure (torch raises OutOfMemoryError on CUDA, RuntimeError
    'DefaultCPUAllocator: can't allocate memory' on CPU, MemoryError from numpy)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc).lower()
                                              or "can't allocate memory" in str(exc))


def release_cached_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
