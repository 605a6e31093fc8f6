"""`protdp plan`: data parallel or model parallel? Answered from numbers for one model config.

    protdp plan --model-config configs/model/af2.yaml --crop 256 --gpu-mem 80GiB --dp 8 \
        [--bf16] [--recompute] [--bandwidth 100Gbit | --network preflight.json] [--json]

Per rank it adds model/optimizer state (Megatron's distributed-optimizer accounting,
`protdp.planning.memory`) and the activation peak of one crop (Evoformer pair activations
O(L^2 c_z), MSA O(S L c_m), triangle-attention weights O(h L^3) if the backend keeps them;
with --bf16 (or the model config's bf16) the trunk's activations as bf16 autocast keeps them;
validated against
measured CPU peaks of tiny/small/af2 in benchmarks/results/plan_validation.json), then walks the
ladder pure DP -> DP + distributed optimizer -> + activation recompute -> model parallelism,
and recommends the first rung that fits. Model parallelism for AF2-style models means splitting
the activations, not the weights: dynamic axial parallelism (DAP; FastFold, ScaleFold) shards
the MSA and pair representations along one residue axis over n GPUs and switches the axis with
an all-to-all between row- and column-wise modules, so activations shrink ~1/n. Tensor
parallelism (Megatron TP) shards weights and is only needed when the state alone does not fit.
Communication per step: ring all-reduce 2(n-1)/n S vs reduce-scatter + all-gather (n-1)/n S each.
With `--network` (a `protdp preflight` report) the bandwidth is the measured one, and when the
preflight ran this model the data-parallel size is answered too: predicted step, exposed
communication and efficiency vs one rank at dp 2, 4, ... (`comm.dp_scaling`), and the largest dp
that keeps GOOD_EFFICIENCY.
"""

from __future__ import annotations

from protdp.errors import ConfigError
from protdp.model.config import ModelConfig
from protdp.planning.comm import (GOOD_EFFICIENCY, dp_scaling, largest_efficient_dp,
                                  step_communication)
from protdp.planning.memory import GIB, Shape, activation_bytes, state_bytes
from protdp.planning.params import parameter_breakdown, parameter_count
from protdp.parallel.dap_layout import block_comm_bytes

MAX_DAP = 64


def plan(cfg: ModelConfig, *, crop: int, gpu_mem: int, dp: int, bf16: bool = False,
         recompute: bool = False, msa_rows: int = 128, extra_msa_rows: int = 1024,
         reserve: float = 0.1, bandwidth: float | None = None,
         network: dict | None = None, gpus: int | None = None,
         global_batch: int | None = None, micro_batch: int = 1) -> dict:
    """The planner's numbers and recommendation as plain data (what --json prints).

    `recompute=True` means recompute is already on (the ladder starts there); `reserve` is the
    fraction of GPU memory kept back for the CUDA context, allocator fragmentation and
    communication buffers. `network`: `comm.read_preflight(...)` (replaces `bandwidth`).
    `gpus` + `global_batch`: when there are more GPUs than data-parallel ranks the global batch
    allows (global / micro), the rest become DAP ranks (`dap_for_batch_cap`)."""
    if crop < 1 or dp < 1 or gpu_mem <= 0:
        raise ConfigError("crop, dp and gpu memory must be positive")
    if not 0 <= reserve < 1:
        raise ConfigError(f"--reserve must be in [0, 1), got {reserve}")
    n = parameter_count(cfg)
    if network is not None:
        bandwidth = network["busbw_Bps"]
    budget = gpu_mem * (1.0 - reserve)
    shape = Shape(crop, msa_rows, extra_msa_rows if cfg.extra_msa else 0)
    act_bf16 = bf16 or cfg.bf16        # bf16 training runs the trunk under autocast
    act = {rc: activation_bytes(cfg, shape, rc, act_bf16) for rc in (False, True)}
    state = {do: state_bytes(n, dp, bf16, do) for do in (False, True)}
    rungs = [(False, recompute), (True, recompute)] + ([] if recompute else [(True, True)])
    options = []
    for do, rc in rungs:
        name = ("dp+distributed_optimizer" if do else "pure_dp") + ("+recompute" if rc else "")
        total = state[do]["total"] + act[rc]["peak"]
        options.append({"name": name, "distributed_optimizer": do, "recompute": rc,
                        "state_bytes": state[do]["total"], "activation_bytes": act[rc]["peak"],
                        "total_bytes": total, "fits": total <= budget})
    chosen = next((o for o in options if o["fits"]), None)
    out = {
        "model": {"parameters": n, "breakdown": parameter_breakdown(cfg)},
        "inputs": {"crop": crop, "msa_rows": msa_rows, "extra_msa_rows": shape.S_extra, "dp": dp,
                   "bf16": bf16, "activations_bf16": act_bf16, "recompute": recompute,
                   "gpu_mem_bytes": gpu_mem,
                   "reserve": reserve, "budget_bytes": budget},
        "state": {"plain": state[False], "distributed_optimizer": state[True]},
        "activations": {"no_recompute": act[False], "recompute": act[True]},
        "activations_by_crop": activations_by_crop(cfg, crop, msa_rows, shape.S_extra, act_bf16),
        "options": options,
        "communication": {
            "all_reduce": step_communication(n, dp, bf16, False, bandwidth),
            "distributed_optimizer": step_communication(n, dp, bf16, True, bandwidth),
            "bandwidth_bytes_per_s": bandwidth,
        },
    }
    out["recommendation"] = _recommend(chosen, options, state, act, budget, recompute)
    if out["recommendation"].get("dap_degree"):
        out["recommendation"]["dap"] = dap_answer(cfg, shape, out["recommendation"]["dap_degree"],
                                                  state[True]["total"], act, budget)
    if gpus is not None and global_batch is not None:
        out["recommendation"]["batch_cap"] = dap_for_batch_cap(
            cfg, shape, gpus, global_batch, micro_batch, state[True]["total"], act, budget)
    if network is not None:
        out["network"], out["dp_scaling"] = _network_answer(network, n, dp, crop, bf16)
        if out["dp_scaling"]:
            out["recommendation"]["data_parallel"] = _dp_answer(out["dp_scaling"], dp)
    return out


def _network_answer(network: dict, n: int, dp: int, crop: int, bf16: bool):
    """The measured figures, and the dp sweep when the preflight ran this model."""
    same = network["parameters"] == n
    info = {k: network[k] for k in ("source", "dp", "backend", "busbw_Bps",
                                    "ring_step_latency_s", "parameters", "crop", "slowest_link",
                                    "shared_host")}
    info["same_model"] = same
    if not same:
        info["note"] = (f"the preflight measured a model of {network['parameters']:,} parameters, "
                        f"not this one ({n:,}): only its bandwidth and latency are used; run "
                        "`protdp preflight` with this --model-config for the scaling answer")
        return info, None
    if network.get("shared_host"):
        c = network["measured_contention"]
        info["shared_host_note"] = (
            f"the preflight's {network['dp']} ranks ran on one host: their compute (x"
            f"{c['compute']:.2f}) and communication (x{c['comm']:.2f}) slowed each other on its "
            "cores, which is not a network limit; the sweep plans one rank per node without that "
            "contention, with the loopback's bandwidth (run the preflight across two nodes for "
            "the network's own figures)")
    if network.get("crop") not in (None, crop):
        info["note"] = (f"compute measured at crop {network['crop']}, planned crop {crop}: "
                        "rerun the preflight at this crop for exact step times")
    dps = sorted({2 ** k for k in range(1, 11)} | {dp} - {1})
    return info, dp_scaling(network, [d for d in dps if d <= max(8 * dp, 64)], bf16)


def _dp_answer(rows: list[dict], dp: int) -> dict:
    at = next(r for r in rows if r["dp"] == dp)
    best = largest_efficient_dp(rows)
    text = (f"at dp {dp} the network verdict is {at['verdict']}: predicted step "
            f"{1e3 * at['step_s']:.1f} ms, {100 * at['efficiency']:.0f}% efficiency vs one rank "
            f"with {at['recommended_flags']}; ")
    text += (f"the largest dp of the sweep keeping >= {100 * GOOD_EFFICIENCY:.0f}% is {best}"
             if best is not None else f"no dp of the sweep keeps {100 * GOOD_EFFICIENCY:.0f}%: "
             "raise the micro-batch or accumulate gradients")
    return {"dp": dp, "verdict": at["verdict"], "efficiency": at["efficiency"],
            "largest_efficient_dp": best, "reason": text}


def activations_by_crop(cfg: ModelConfig, crop: int, msa_rows: int, extra_rows: int,
                        bf16: bool | None = None) -> list[dict]:
    """Activation peak (bytes) with and without recompute over a range of crops (`bf16`: the
    trunk under bf16 autocast, `memory.activation_bytes`)."""
    crops = sorted({64, 128, 256, 384, 512, crop})
    return [{"crop": c, **{k: activation_bytes(cfg, Shape(c, msa_rows, extra_rows), rc, bf16)["peak"]
                           for k, rc in (("no_recompute", False), ("recompute", True))}}
            for c in crops]


def _recommend(chosen, options, state, act, budget, recompute) -> dict:
    if chosen is not None:
        first = options[0]
        if not chosen["distributed_optimizer"]:
            reason = ("params + grads + Adam state and the activations of one crop fit on one "
                      "GPU; every rank holds a full replica, gradients are all-reduced")
        elif chosen["recompute"] == recompute:
            reason = (f"pure DP needs {first['total_bytes'] / GIB:.1f} GiB > budget "
                      f"{budget / GIB:.1f} GiB; sharding the fp32 master and Adam state over the "
                      "data-parallel ranks brings it under at the same communication volume")
        else:
            reason = (f"without recompute the activations alone are {act[False]['peak'] / GIB:.1f} "
                      "GiB; recomputing each Evoformer block in backward keeps only block inputs "
                      f"({act[True]['peak'] / GIB:.1f} GiB peak, ~1/3 more compute); the "
                      "distributed optimizer comes first because it costs no extra communication")
        return {"strategy": chosen["name"], "model_parallel": None, "reason": reason,
                "total_bytes": chosen["total_bytes"]}
    # Nothing fits with data parallelism alone.
    st, ac = state[True]["total"], act[True]["peak"]
    if st >= budget:
        return {"strategy": "model_parallel", "model_parallel": "tensor",
                "reason": f"model + optimizer state alone ({st / GIB:.1f} GiB with the distributed "
                          f"optimizer) exceeds the budget {budget / GIB:.1f} GiB: shard the weights "
                          "(Megatron tensor parallelism), then revisit activations",
                "total_bytes": st + ac}
    degree = next((k for k in range(2, MAX_DAP + 1) if st + ac / k <= budget), None)
    if degree is None:
        reason = (f"activations with recompute ({ac / GIB:.1f} GiB) do not fit even split "
                  f"{MAX_DAP} ways: reduce the crop or MSA depth")
    else:
        reason = (f"even with the distributed optimizer and recompute one crop needs "
                  f"{(st + ac) / GIB:.1f} GiB > budget {budget / GIB:.1f} GiB; the pair and MSA "
                  f"activations dominate, so shard them along a residue axis (DAP, FastFold/"
                  f"ScaleFold) over {degree} GPUs per model replica: ~{(st + ac / degree) / GIB:.1f} GiB")
    return {"strategy": "model_parallel", "model_parallel": "dap", "dap_degree": degree,
            "reason": reason, "total_bytes": st + ac / (degree or MAX_DAP)}


def _power_of_two_at_least(k: int) -> int:
    return 1 << max(0, (k - 1).bit_length())


def dap_answer(cfg: ModelConfig, shape: Shape, k: int, state: float, act: dict,
               budget: float) -> dict:
    """`--dap-size` for a DAP degree of at least k: the next power of two (how the sample
    splits evenly over a node's GPUs), per-rank memory with and without recompute (ScaleFold
    drops recompute once DAP >= 2 when it fits), and bytes per Evoformer block per rank."""
    size = _power_of_two_at_least(k)
    without = state + act[False]["peak"] / size
    comm = block_comm_bytes(n_seq=shape.S, n_res=shape.L, k=size, c_m=cfg.c_m, c_z=cfg.c_z,
                            msa_heads=cfg.msa_heads, pair_heads=cfg.pair_heads,
                            c_hidden_tri_mul=cfg.c_hidden_tri_mul, c_hidden_opm=cfg.c_hidden_opm)
    return {"dap_size": size, "flag": f"--dap-size {size}",
            "recompute": not without <= budget,
            "bytes_per_rank": without if without <= budget else state + act[True]["peak"] / size,
            "comm_bytes_per_block": comm.get("total", 0), "comm_by_collective": comm}


def dap_for_batch_cap(cfg: ModelConfig, shape: Shape, gpus: int, global_batch: int, micro: int,
                      state: float, act: dict, budget: float) -> dict:
    """DP is capped at global / micro ranks (AF2: 128); GPUs beyond that only help as DAP ranks
    (NVIDIA's MLPerf OpenFold: global batch 256, DAP 8 on 2,080 GPUs)."""
    if gpus < 1 or global_batch < 1 or micro < 1:
        raise ConfigError("--gpus, --global-batch-size and --micro-batch-size must be >= 1")
    max_dp = global_batch // micro
    if gpus <= max_dp:
        return {"dp": gpus, "dap_size": 1,
                "reason": f"{gpus} GPUs <= {max_dp} data-parallel ranks the global batch "
                          f"{global_batch} allows at micro-batch {micro}: data parallelism alone"}
    size = 1 << ((gpus // max_dp).bit_length() - 1)   # largest power of two <= gpus / max_dp
    dp = gpus // size
    ans = dap_answer(cfg, shape, size, state, act, budget)
    return {"dp": min(dp, max_dp), "dap_size": size, "flag": ans["flag"],
            "recompute": ans["recompute"], "bytes_per_rank": ans["bytes_per_rank"],
            "reason": f"the global batch {global_batch} allows at most {max_dp} data-parallel "
                      f"ranks; {gpus} GPUs run dp {min(dp, max_dp)} x dap {size} "
                      f"({ans['flag']}): each sample split over {size} ranks, ~1/{size} of its "
                      "activations per rank"}


def _gib(x: float) -> str:
    return f"{x / GIB:8.2f} GiB"


def render(p: dict) -> str:
    inp, n = p["inputs"], p["model"]["parameters"]
    lines = [f"parameters: {n:,}",
             f"crop {inp['crop']}, MSA rows {inp['msa_rows']}, extra MSA rows {inp['extra_msa_rows']}, "
             f"dp {inp['dp']}, {'bf16 params + fp32 master' if inp['bf16'] else 'fp32'}; "
             f"budget {_gib(inp['budget_bytes']).strip()} of {_gib(inp['gpu_mem_bytes']).strip()} "
             f"({inp['reserve']:.0%} reserved)", "",
             "state per rank             params       grads   optimizer       total"]
    for key, label in (("plain", "plain DP"), ("distributed_optimizer", "distributed optimizer")):
        s = p["state"][key]
        lines.append(f"  {label:<22}" + "".join(_gib(s[k]) + " " for k in
                                                 ("params", "grads", "optimizer", "total")))
    dtype = "bf16" if inp.get("activations_bf16") else "fp32"
    lines += ["", f"activation peak (one crop, {dtype})  no recompute     recompute"]
    for row in p["activations_by_crop"]:
        mark = " <" if row["crop"] == inp["crop"] else ""
        lines.append(f"  crop {row['crop']:<26}{_gib(row['no_recompute'])}  {_gib(row['recompute'])}{mark}")
    lines += ["", "options                                        total   fits"]
    for o in p["options"]:
        lines.append(f"  {o['name']:<38}{_gib(o['total_bytes'])}   {'yes' if o['fits'] else 'no'}")
    lines.append("")
    for key in ("all_reduce", "distributed_optimizer"):
        c = p["communication"][key]
        t = f", {c['seconds'] * 1e3:.1f} ms" if c["seconds"] is not None else ""
        lines.append(f"comm/step {c['scheme']}: {c['bytes_per_rank'] / 2 ** 20:.1f} MiB per rank{t}")
    if p.get("network"):
        net = p["network"]
        lines += ["", f"network (preflight {net['source']}, dp {net['dp']}, {net['backend']}): bus "
                      f"bandwidth {net['busbw_Bps'] / 1e9:.3f} GB/s, "
                      f"{1e6 * net['ring_step_latency_s']:.0f} us per ring step"]
        if net.get("note"):
            lines.append(f"  note: {net['note']}")
        if net.get("shared_host_note"):
            lines.append(f"  note: {net['shared_host_note']}")
        for row in p.get("dp_scaling") or []:
            lines.append(f"  dp {row['dp']:<5} step {1e3 * row['step_s']:8.1f} ms  exposed "
                         f"{1e3 * row['exposed_comm_s']:7.1f} ms  efficiency "
                         f"{100 * row['efficiency']:4.0f}%  {row['verdict']}")
    r = p["recommendation"]
    mp = f" ({r['model_parallel']}" + (f", degree {r['dap_degree']}" if r.get("dap_degree") else "") + ")" \
        if r["model_parallel"] else ""
    lines += ["", f"recommendation: {r['strategy']}{mp}", f"  because {r['reason']}"]
    if r.get("dap"):
        d = r["dap"]
        lines.append(f"  DAP: {d['flag']} ({'with' if d['recompute'] else 'without'} recompute), "
                     f"{_gib(d['bytes_per_rank']).strip()} per rank, "
                     f"{d['comm_bytes_per_block'] / 2 ** 20:.1f} MiB per Evoformer block per rank")
    if r.get("batch_cap"):
        lines.append(f"  GPUs vs global batch: {r['batch_cap']['reason']}")
    if r.get("data_parallel"):
        lines.append(f"  data parallel: {r['data_parallel']['reason']}")
    return "\n".join(lines)
