"""PNG figures of a prediction, as ColabFold writes them: pLDDT per residue (one line per
ranked model), the PAE matrix of the top model, and the MSA coverage (rows with a residue at
each query position). Matplotlib with the non-interactive Agg backend; written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    os.replace(tmp, path)
    return path


def write_plots(folder: Path, name: str, preds: dict[str, dict], order: list[str],
                coverage: list[int]) -> dict[str, str]:
    """`<name>_plddt.png`, `<name>_pae.png` (when the model has the PAE head),
    `<name>_coverage.png`; returns {kind: file name}."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    out = {}
    fig = Figure(figsize=(6, 3), layout="constrained")
    ax = fig.subplots()
    for k, n in enumerate(order):
        ax.plot(np.arange(1, len(preds[n]["plddt"]) + 1), preds[n]["plddt"], lw=1,
                label=f"rank {k + 1}: {n}")
    ax.set(xlabel="residue", ylabel="pLDDT", ylim=(0, 100), title=f"{name}: predicted lDDT")
    ax.legend(fontsize=6, loc="lower right")
    out["plddt_png"] = _save(fig, folder / f"{name}_plddt.png").name
    top = preds[order[0]]
    if top.get("pae") is not None:
        fig = Figure(figsize=(4.5, 3.5), layout="constrained")
        ax = fig.subplots()
        im = ax.imshow(top["pae"], cmap="bwr", vmin=0, vmax=30)
        fig.colorbar(im, ax=ax, label="expected position error (Å)")
        ax.set(xlabel="scored residue", ylabel="aligned residue", title=f"{name}: PAE ({order[0]})")
        out["pae_png"] = _save(fig, folder / f"{name}_pae.png").name
    fig = Figure(figsize=(6, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot(np.arange(1, len(coverage) + 1), coverage, color="black", lw=1)
    ax.set(xlabel="query position", ylabel="sequences", title=f"{name}: MSA coverage")
    out["coverage_png"] = _save(fig, folder / f"{name}_coverage.png").name
    return out
