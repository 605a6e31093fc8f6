"""The input pipeline's part of `protdp report` (issue 44): data-wait percentiles and the
quarantined families.

data_wait.png: per step the data wait of the rank mean (`time/data_wait`) and of the slowest
rank (`time/data_wait_max`), the run's p50 / p90 / p99 of the slowest rank's wait as lines,
and the steps in which families were set aside (`quarantine/step`) marked. The quarantine
table lists each family of RUN_DIR/quarantine.jsonl once: how often it was set aside, why,
on which ranks and steps (records repeated by a resumed run count once).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protdp.data.pipeline.quarantine import QUARANTINE_FILE, read_quarantine

PERCENTILES = (50, 90, 99)


def data_wait_percentiles(train: list[dict]) -> dict[str, float]:
    """p50/p90/p99 (seconds) of the per-step data wait of the slowest rank (the rank mean
    for runs logged before `time/data_wait_max`)."""
    waits = [r.get("time/data_wait_max", r.get("time/data_wait")) for r in train]
    waits = [w for w in waits if w is not None]
    if not waits:
        return {}
    return {f"p{p}": float(np.percentile(waits, p)) for p in PERCENTILES}


def plot_data_wait(train: list[dict], path: Path, plt) -> Path:
    """Write data_wait.png (module doc) with matplotlib's pyplot `plt`."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    its = [r["iteration"] for r in train]
    ax.plot(its, [1000 * (r.get("time/data_wait") or 0.0) for r in train], lw=1,
            label="data wait, rank mean")
    if any("time/data_wait_max" in r for r in train):
        ax.plot(its, [1000 * (r.get("time/data_wait_max") or 0.0) for r in train], lw=1,
                label="data wait, slowest rank")
    for (name, value), style in zip(data_wait_percentiles(train).items(), (":", "--", "-.")):
        ax.axhline(1000 * value, ls=style, color="gray", lw=1, label=f"{name} {1000 * value:.0f} ms")
    hit = [r["iteration"] for r in train if r.get("quarantine/step")]
    if hit:
        ax.plot(hit, [0.0] * len(hit), "rv", label="families set aside")
    ax.set(xlabel="iteration", ylabel="ms", title="data wait per step")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def quarantine_table(run_dir: Path) -> str:
    """The quarantined families of a run, one line each ('' when none was set aside)."""
    seen, per_family = set(), {}
    for r in read_quarantine(run_dir / QUARANTINE_FILE):
        key = (r["family"], r.get("rank"), r.get("step"), r.get("micro"), r.get("slot"))
        if key in seen:
            continue
        seen.add(key)
        per_family.setdefault(r["family"], []).append(r)
    if not per_family:
        return ""
    lines = [f"quarantined families ({len(per_family)}; {run_dir / QUARANTINE_FILE}):",
             f"{'family':<24} {'times':>5}  {'reasons':<28} {'ranks':<8} steps"]
    for fam, recs in sorted(per_family.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        reasons = ", ".join(sorted({r["reason"] for r in recs}))
        ranks = ",".join(str(x) for x in sorted({r.get("rank") for r in recs}))
        steps = ",".join(str(r.get("step")) for r in recs[:8]) + (" ..." if len(recs) > 8 else "")
        lines.append(f"{fam:<24} {len(recs):>5}  {reasons:<28} {ranks:<8} {steps}")
    return "\n".join(lines)
