"""Gradient communication per data-parallel step (Megatron DDP / distributed optimizer).

Ring all-reduce of S bytes: every rank sends (and receives) 2 (n-1)/n S bytes (reduce-scatter
phase + all-gather phase). The distributed optimizer splits the same two phases: a
reduce-scatter of the fp32 gradient buffer, (n-1)/n S_grad, then an all-gather of the updated
parameters in the model dtype, (n-1)/n S_param — equal to the all-reduce in fp32, less with
bf16 params. Time = bytes sent per rank / per-rank link bandwidth (bandwidth-bound ring; latency
terms ignored, they matter only for tiny buckets). With `--network preflight.json` the bandwidth
and the ring's per-step latency are the ones `protdp preflight` measured (its all-reduce fit:
busbw = algbw x 2(n-1)/n), and when the preflight ran the same model its compute too, so
`dp_scaling` predicts the step and efficiency at each data-parallel size
(`protdp.parallel.step_model`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from protdp.errors import InputError
from protdp.parallel.step_model import Contention, StepPieces, bus_factor, predict_all, verdict

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


# ---------------------------------------------------------------------------- measured network
PREFLIGHT_FORMAT = "protdp-preflight-v1"
GOOD_EFFICIENCY = 0.8   # the largest data-parallel size with at least this efficiency is named


def _load_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the preflight report ({exc})", path=path) from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON: {exc.msg}", path=path, line=exc.lineno) from None
    if not isinstance(report, dict) or report.get("format") != PREFLIGHT_FORMAT:
        found = report.get("format") if isinstance(report, dict) else type(report).__name__
        raise InputError(f"not a protdp preflight report (format {found!r}, expected "
                         f"{PREFLIGHT_FORMAT!r}); write one with `protdp preflight --out`",
                         path=path, field="format")
    if report.get("network") is None:
        raise InputError("measured on one rank, so there are no network figures: run the "
                         "preflight with --dp >= 2", path=path, field="network")
    return report


def _number(report: dict, path: Path, keys: str, lo: float = 0.0, integer: bool = False):
    """report[k1][k2]... as a finite number >= lo (an int if `integer`), else one clear error."""
    value = report
    for key in keys.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < lo or (integer and value != int(value)):
        raise InputError(f"expected a finite {'integer' if integer else 'number'} >= {lo}, got "
                         f"{value!r}", path=path, field=keys)
    return int(value) if integer else float(value)


def _numbers(report: dict, path: Path, keys: str, n: int | None = None, lo: float = 0.0) -> list:
    value = report
    for key in keys.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, list) or not value or (n is not None and len(value) != n):
        raise InputError(f"expected a list of {n or 'some'} numbers", path=path, field=keys)
    return [_number({"v": v}, path, "v", lo) for v in value]


def read_preflight(path: str | Path) -> dict:
    """The figures `protdp plan --network` takes from `protdp preflight --out` JSON: the ring's
    bus bandwidth and per-step latency (from the all-reduce fit), and the measured compute."""
    path = Path(path)
    rep = _load_json(path)
    dp = _number(rep, path, "world.dp", 2, integer=True)
    numels = [int(x) for x in _numbers(rep, path, "layout.bucket_numel", lo=1)]
    algbw = _number(rep, path, "network.per_bucket.all_reduce.fit_algbw_Bps", 1e-9)
    latency = _number(rep, path, "network.per_bucket.all_reduce.fit_latency_s")
    compute = {k: _number(rep, path, f"compute.{k}") for k in (
        "forward_s", "backward_s", "fwd_bwd_alone_s", "optimizer_full_s")}
    for k in ("bucket_ready_s", "bucket_need_s"):
        compute[k] = _numbers(rep, path, f"compute.{k}", len(numels))
    contention = {k: _number(rep, path, f"predictions.contention.{k}", 1.0)
                  for k in ("compute", "comm")}
    workload = rep.get("workload") if isinstance(rep.get("workload"), dict) else {}
    hosts = rep["world"].get("hosts")
    # every rank on one host: they shared its cores and its loopback, so the measured
    # contention is the host's, not what separate nodes on a network would see (a cluster
    # runs one rank per GPU, each with its own cores); plan with none, and say so
    shared_host = isinstance(hosts, list) and len(hosts) == 1
    measured_contention = dict(contention)
    if shared_host:
        contention = {"compute": 1.0, "comm": 1.0}
    return {"source": str(path), "dp": dp, "backend": str(rep["world"].get("backend")),
            "shared_host": shared_host, "measured_contention": measured_contention,
            "busbw_Bps": algbw * 2 * (dp - 1) / dp,   # what bytes_per_rank / seconds is
            "ring_step_latency_s": latency / (2 * (dp - 1)),   # a ring all-reduce: 2(n-1) steps
            "parameters": _number(rep, path, "layout.parameters", 1, integer=True),
            "bucket_numel": numels, "compute": compute, "contention": contention,
            "crop": workload.get("crop_size"), "model_config": workload.get("model_config"),
            "slowest_link": rep.get("slowest_link")}


def ring_seconds(op: str, nbytes: float, dp: int, busbw: float, step_latency: float) -> float:
    """A ring collective of `nbytes` (the whole buffer) on `dp` ranks: a latency per ring step
    (2(n-1) for all_reduce, n-1 otherwise) + the bytes each rank sends over the bus bandwidth."""
    steps = (2 if op == "all_reduce" else 1) * (dp - 1)
    return steps * step_latency + nbytes * bus_factor(op, dp) / busbw


def dp_scaling(net: dict, dps: list[int], bf16: bool) -> list[dict]:
    """Predicted step, exposed communication and efficiency vs one rank at each data-parallel
    size, from the preflight's compute and network (its bucket layout; a different dp pads
    buckets a little differently, which this ignores)."""
    c, rows = net["compute"], []
    param_bytes = 2 if bf16 else 4
    for dp in dps:
        sec = lambda op, elem: tuple(ring_seconds(  # noqa: E731
            op, elem * n, dp, net["busbw_Bps"], net["ring_step_latency_s"])
            for n in net["bucket_numel"])
        pieces = StepPieces(
            dp=dp, forward_s=c["forward_s"], backward_s=c["backward_s"],
            optimizer_s=c["optimizer_full_s"], optimizer_shard_s=c["optimizer_full_s"] / dp,
            bucket_ready_s=tuple(c["bucket_ready_s"]), bucket_need_s=tuple(c["bucket_need_s"]),
            all_reduce_s=sec("all_reduce", 4), reduce_scatter_s=sec("reduce_scatter", 4),
            all_gather_s=sec("all_gather", param_bytes),
            norm_all_reduce_s=2 * (dp - 1) * net["ring_step_latency_s"])
        pred = predict_all(pieces, c["fwd_bwd_alone_s"], Contention(**net["contention"]))
        v = verdict(pieces, pred)
        best = pred["configs"][v["recommended"]]
        rows.append({"dp": dp, "verdict": v["verdict"], "recommended_flags": v["recommended_flags"],
                     "all_reduce_s": sum(pieces.all_reduce_s), "step_s": best["step_s"],
                     "exposed_comm_s": best["exposed_comm_s"],
                     "efficiency": best["scaling_efficiency"],
                     "accumulation_needed": v.get("accumulation_needed")})
    return rows


def largest_efficient_dp(rows: list[dict], threshold: float = GOOD_EFFICIENCY) -> int | None:
    """The largest dp of the sweep whose predicted efficiency is at least `threshold`."""
    ok = [r["dp"] for r in rows if r["efficiency"] >= threshold]
    return max(ok) if ok else None
