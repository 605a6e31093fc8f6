"""Gradient communication per data-parallel step (Megatron DDP / distributed optimizer).

Ring all-reduce of S bytes: every rank sends (and receives) 2 (n-1)/n S bytes (reduce-scatter
phase + all-gather phase). The distributed optimizer splits the same two phases: a
reduce-scatter of the fp32 gradient buffer, (n-1)/n S_grad, then an all-gather of the updated
parameters in the model dtype, (n-1)/n S_param — equal to the all-reduce in fp32, less with
bf16 params. Time = bytes sent per rank / per-rank link bandwidth (bandwidth-bound ring; latency
terms ignored, they matter only for tiny buckets).
"""

from __future__ import annotations

import re

from protdp.errors import InputError

_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}


def parse_bytes(text: str, field: str = "size") -> int:
    """'80GiB', '80GB', '141G' (= GB), '512MiB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]i?)?[bB]?\s*", str(text))
    if not m:
        raise InputError(f"cannot read {text!r} as a size (e.g. 80GiB, 40GB)", field=field)
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    return int(value * _UNITS[unit])


def parse_bandwidth(text: str, field: str = "bandwidth") -> float:
    """'100Gbit', '100Gbps', '400Gb/s' (bits) or '25GB/s', '12.5GiB/s' (bytes) -> bytes/s."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]i?)?(bit|bps|b/s|B/s|Bps|B)\s*", str(text))
    if not m:
        raise InputError(f"cannot read {text!r} as a bandwidth (e.g. 100Gbit, 25GB/s)", field=field)
    value, unit, kind = float(m.group(1)), (m.group(2) or "").lower(), m.group(3)
    scale = value * _UNITS[unit]
    return scale if kind in ("B/s", "Bps", "B") else scale / 8.0


def allreduce_bytes_per_rank(n: int, size: float) -> float:
    """Ring all-reduce: 2 (n-1)/n * size sent per rank."""
    return 2.0 * (n - 1) / n * size if n > 1 else 0.0


def reduce_scatter_bytes_per_rank(n: int, size: float) -> float:
    """Ring reduce-scatter (or all-gather): (n-1)/n * size sent per rank."""
    return (n - 1) / n * size if n > 1 else 0.0


def step_communication(n_params: int, dp: int, bf16: bool, distributed_optimizer: bool,
                       bandwidth: float | None = None) -> dict:
    """Bytes each rank sends per optimizer step (gradients reduced in the fp32 main-grad buffer)
    and the time at `bandwidth` bytes/s."""
    grad_bytes = 4 * n_params
    if distributed_optimizer:
        param_bytes = (2 if bf16 else 4) * n_params
        rs = reduce_scatter_bytes_per_rank(dp, grad_bytes)
        ag = reduce_scatter_bytes_per_rank(dp, param_bytes)
        out = {"scheme": "reduce_scatter(grads fp32) + all_gather(params)",
               "reduce_scatter_bytes": rs, "all_gather_bytes": ag, "bytes_per_rank": rs + ag}
    else:
        out = {"scheme": "all_reduce(grads fp32)", "bytes_per_rank": allreduce_bytes_per_rank(dp, grad_bytes)}
    out["buffer_bytes"] = grad_bytes
    out["seconds"] = out["bytes_per_rank"] / bandwidth if bandwidth else None
    return out
