"""`protdp report RUN_DIR`: render a run's metrics.jsonl as PNG plots (matplotlib).

loss.png (total and each loss term), lddt.png (train lDDT-Cα, validation lDDT-Cα of the EMA
weights, Spearman pLDDT vs true lDDT), breakdown.png (stacked step time per phase: data wait,
forward, backward, exposed communication, optimizer) and throughput.png (samples/s,
residues/s, peak memory) and data_wait.png (`data_report`). A resumed run appends to the same file; the last record of each
iteration wins.
"""

from __future__ import annotations

import json
from pathlib import Path

from protdp.errors import InputError
from protdp.train.data_report import plot_data_wait
from protdp.train.logging import PHASES


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(train records, eval records), each sorted by iteration, deduplicated (last wins)."""
    if not path.exists():
        raise InputError("no metrics.jsonl here (is this a run directory?)", path=path)
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    lines = path.read_text().splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            it = int(rec["iteration"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            if lineno == len(lines):  # a run killed mid-write may leave a torn last line
                continue
            raise InputError(f"not a metrics record ({exc})", path=path, line=lineno) from None
        (evals if rec.get("type") == "eval" else train)[it] = rec
    return [train[k] for k in sorted(train)], [evals[k] for k in sorted(evals)]


def _series(recs: list[dict], key: str):
    pts = [(r["iteration"], r[key]) for r in recs if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def render(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write the PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = read_metrics(run_dir / "metrics.jsonl")
    if not train:
        raise InputError("metrics.jsonl holds no training steps", path=run_dir / "metrics.jsonl")
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*_series(train, "loss"), label="total", lw=2, color="black")
    for key in sorted({k for r in train for k in r if k.startswith("loss/")}):
        ax.plot(*_series(train, key), label=key.split("/", 1)[1], lw=1)
    if evals and any("val_loss" in e for e in evals):
        ax.plot(*_series(evals, "val_loss"), "o--", label="val total (EMA)")
    ax.set(xlabel="iteration", ylabel="loss", title="training loss")
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "loss.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    if any("train_lddt_ca" in r for r in train):
        ax.plot(*_series(train, "train_lddt_ca"), label="train lDDT-Cα", alpha=0.6)
    if evals:
        ax.plot(*_series(evals, "val_lddt_ca"), "o-", label="val lDDT-Cα (EMA)")
        ax.plot(*_series(evals, "val_plddt_spearman"), "s--", label="val Spearman(pLDDT, lDDT)")
    ax.set(xlabel="iteration", ylabel="score", title="lDDT-Cα and pLDDT calibration")
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "lddt.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    its = [r["iteration"] for r in train]
    stacks = [[1000 * (r.get("time/" + p) or 0.0) for r in train] for p in PHASES]
    ax.stackplot(its, stacks, labels=[p.replace("_", " ") for p in PHASES])
    ax.plot(its, [1000 * (r.get("time/step") or 0.0) for r in train], color="black", lw=1,
            label="step (slowest rank)")
    ax.set(xlabel="iteration", ylabel="ms (mean over ranks)", title="step-time breakdown")
    ax.legend(fontsize=8, loc="upper right")
    written.append(_save(fig, out_dir / "breakdown.png"))

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, key, label in zip(axes, ("samples_per_s", "residues_per_s", "max_memory_mb"),
                              ("samples/s", "residues/s", "peak memory (MiB)")):
        ax.plot(*_series(train, key))
        ax.set(xlabel="iteration", title=label)
    written.append(_save(fig, out_dir / "throughput.png"))
    written.append(plot_data_wait(train, out_dir / "data_wait.png", plt))   # issue 44
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
