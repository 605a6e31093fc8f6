"""Every file of one prediction, written into its (hidden, not yet published) folder: the
top-ranked model as `<name>.pdb` (pLDDT B-factors) and `<name>.cif` (ModelCIF with QA
metrics), AlphaFold's `unrelaxed_*` / `ranked_*` / `result_*` / `ranking_debug.json` /
`timings.json`, the AFDB PAE JSON, ColabFold scores, PNGs, a copy of the MSA inputs, and with
--relax the Amber-relaxed top model (`relaxed_<model>.pdb`, `relax.json`, its seconds in
timings.json as `relax_<model>`)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from protdp.inference.af_outputs import write_af_files
from protdp.inference.modelcif_out import write_modelcif
from protdp.inference.plots import write_plots
from protdp.inference.writers import round_plddt, write_json, write_structures


def write_prediction_files(folder: Path, name: str, seq: str, preds: dict, order: list[str],
                           ranking_debug: dict, timings: dict, coverage: list[int], model_config,
                           *, save_distogram: bool, plots: bool, msa_paths: list[str],
                           details: dict, relax: bool = False,
                           relax_timeout_s: float = 300.0,
                           chains: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Every file of one prediction into `folder`; returns {kind: file name}. The top-ranked
    model is `<name>.pdb` (pLDDT B-factors) and `<name>.cif` (ModelCIF with QA metrics).
    `chains` [(chain id, sequence)] in residue order: a complex, every structure file holds
    every chain (`protdp.multimer.outputs`; the ModelCIF has one asym unit per chain and ipTM)
    and the PAE JSON names each chain's residue range."""
    from protdp.model.heads import pae_bin_centres
    top = preds[order[0]]
    plddt = round_plddt(top["plddt"])
    outputs = {}
    if np.isfinite(top["positions"]).all() and np.isfinite(plddt).all():
        files = _structures(folder, name, seq, top, plddt, chains)
        outputs["pdb"] = files["pdb"].name
        outputs["cif"] = write_modelcif(files["cif"], name, seq, top["positions"],
                                        top["atom_mask"], plddt, top.get("ptm"), details,
                                        chains=chains, iptm=top.get("iptm")).name
    for k, n in enumerate(order):
        p = preds[n]
        if not (np.isfinite(p["positions"]).all() and np.isfinite(p["plddt"]).all()):
            continue
        for kind, fname in ((f"unrelaxed_{n}", f"unrelaxed_{n}"), (f"ranked_{k}", f"ranked_{k}")):
            f = _structures(folder, fname, seq, p, round_plddt(p["plddt"]), chains,
                            kinds=("pdb",))
            outputs[kind] = f["pdb"].name
    max_pae = float(pae_bin_centres(model_config)[-1]) if top.get("pae") is not None else None
    edges = np.linspace(model_config.distogram_min, model_config.distogram_max,
                        model_config.distogram_bins - 1)
    timings = dict(timings)
    if relax and "ranked_0" in outputs:
        outputs.update(_relax_top(folder, order[0], folder / outputs["ranked_0"],
                                  relax_timeout_s, timings))
    outputs.update(write_af_files(folder, name, preds, order, ranking_debug, timings, max_pae,
                                  save_distogram=save_distogram, distogram_edges=edges,
                                  chains=chains))
    if plots:
        outputs.update(write_plots(folder, name, preds, order, coverage))
    for i, src in enumerate(msa_paths):   # the prediction's own copy of its MSA inputs
        dst = folder / f"msa_{i}_{Path(src).name}"
        shutil.copyfile(src, dst)
        outputs[f"msa_{i}"] = dst.name
    return outputs


def _relax_top(folder: Path, model: str, ranked_0: Path, timeout_s: float,
               timings: dict) -> dict[str, str]:
    """Amber-relax the top-ranked model (AlphaFold's --models_to_relax=best) into
    `relaxed_<model>.pdb` with its report `relax.json`; the seconds it took (also when it
    failed or timed out) go into `timings` as `relax_<model>`, AlphaFold's timings.json key."""
    from protdp.relax import RelaxConfig, relax_pdb
    dst = folder / f"relaxed_{model}.pdb"
    t0 = time.perf_counter()
    result = relax_pdb(ranked_0, dst, RelaxConfig(timeout_s=timeout_s))
    timings[f"relax_{model}"] = round(time.perf_counter() - t0, 3)
    files = {"relax": write_json(folder / "relax.json", {"model": model,
                                                        **result.to_dict()}).name}
    if result.relaxed:
        files["relaxed"] = dst.name
    return files


def _structures(folder: Path, name: str, seq: str, pred: dict, plddt: np.ndarray,
                chains: list[tuple[str, str]] | None, kinds=("pdb", "cif")) -> dict[str, Path]:
    """One chain A (a monomer) or every chain of a complex."""
    if not chains:
        return write_structures(folder, name, seq, pred["positions"], plddt, pred["atom_mask"],
                                kinds=kinds)
    from protdp.multimer.outputs import write_complex_structures
    return write_complex_structures(folder, name, chains, pred["positions"], plddt,
                                    pred["atom_mask"], kinds=kinds)
