"""The end-of-run summary of a pretraining run (`Trainer.train` prints it and writes
RUN_DIR/summary.json): mean step-time breakdown, throughput, memory, final losses and lDDT."""

from __future__ import annotations

from protdp.train.logging import PHASES


def summarize(records: list[dict], val: dict | None, iteration: int) -> dict:
    """Mean step-time breakdown (first step excluded as warm-up) and final lDDT numbers."""
    steady = records[1:] or records
    out = {"iterations": iteration, "steps_this_run": len(records)}
    if steady:
        step = sum(r["time/step"] for r in steady)
        step_mean = sum(r["time/step_mean"] for r in steady)
        out["mean_step_s"] = step / len(steady)
        for p in PHASES:
            out[f"mean_{p}_s"] = sum(r[f"time/{p}"] for r in steady) / len(steady)
            out[f"fraction_{p}"] = sum(r[f"time/{p}"] for r in steady) / step_mean
        out["samples_per_s"] = sum(r["samples"] for r in steady) / step
        out["residues_per_s"] = sum(r["residues"] for r in steady) / step
        out["max_memory_mb"] = max(r["max_memory_mb"] for r in steady)
        waits = sorted(r.get("time/data_wait_max", r["time/data_wait"]) for r in steady)
        out["data_wait_p99_s"] = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))]
        out["quarantined"] = records[-1].get("quarantine/total", 0)   # issue 44
        tail = [r["train_lddt_ca"] for r in records[-10:] if r.get("train_lddt_ca") is not None]
        out["final_train_lddt_ca"] = sum(tail) / len(tail) if tail else None
        out["final_loss"] = sum(r["loss"] for r in records[-10:]) / len(records[-10:])
    if val:
        out.update({k: v for k, v in val.items() if k.startswith("val_")})
    return out


def format_summary(s: dict) -> str:
    lines = [f"trained to iteration {s['iterations']} ({s['steps_this_run']} steps in this run)"]
    if "mean_step_s" in s:
        lines.append(f"mean step {1000 * s['mean_step_s']:.0f} ms: " + ", ".join(
            f"{p.replace('_', ' ')} {1000 * s[f'mean_{p}_s']:.0f} ms ({100 * s[f'fraction_{p}']:.0f}%)"
            for p in PHASES))
        lines.append(f"throughput {s['samples_per_s']:.2f} samples/s, {s['residues_per_s']:.0f} residues/s; "
                     f"max memory {s['max_memory_mb']:.0f} MiB per rank")
        lines.append(f"data wait p99 {1000 * s['data_wait_p99_s']:.0f} ms (slowest rank); "
                     f"{s['quarantined']} families set aside (quarantine.jsonl)")
        tl = s.get("final_train_lddt_ca")
        lines.append(f"final train loss {s['final_loss']:.4f}, train lDDT-Cα "
                     f"{'n/a' if tl is None else f'{tl:.3f}'} (mean of the last 10 steps)")
    if "val_lddt_ca" in s:
        sp = s.get("val_plddt_spearman")
        lines.append(f"final val lDDT-Cα (EMA weights) {s['val_lddt_ca']:.3f} on {s['val_families']} "
                     f"held-out families; Spearman(pLDDT, true lDDT) "
                     f"{'n/a' if sp is None else f'{sp:.3f}'}")
    return "\n".join(lines)
