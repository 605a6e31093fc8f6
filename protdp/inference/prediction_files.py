"""Every file of one prediction, written into its (hidden, not yet published) folder: the
top-ranked model as `<name>.pdb` (pLDDT B-factors) and `<name>.cif` (ModelCIF: every ranked
model with its QA metrics and PAE), AlphaFold's `unrelaxed_*` / `ranked_*` (.pdb and .cif) /
`result_*` / `confidence_*` / `pae_*` / `ranking_debug.json` / `timings.json` /
`msas/chain_id_map.json` (complexes), ColabFold's scores, structures and PAE JSON, the AFDB
PAE JSON, PNGs, a copy of the MSA inputs, and with --relax the Amber-relaxed top model
(`relaxed_<model>.pdb`, `relax.json`, its seconds in timings.json as `relax_<model>`)."""

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
                           chains: list[tuple[str, str]] | None = None,
                           records: dict[str, dict] | None = None) -> dict[str, str]:
    """Every file of one prediction into `folder`; returns {kind: file name}. The top-ranked
    model is `<name>.pdb` (pLDDT B-factors) and `<name>.cif` (ModelCIF: every ranked model
    with its QA metrics, the top-ranked one's PAE). `chains` [(chain id, sequence)] in residue order: a complex,
    every structure file holds every chain (`protdp.complex.outputs`) and the PAE JSON names
    each chain's residue range; `records` {chain id: {"description", "sequence"}}: the FASTA
    records the ModelCIF's entities / asym units name, and (a complex) AlphaFold's
    `msas/chain_id_map.json`."""
    from protdp.model.heads import pae_bin_centres
    top = preds[order[0]]
    plddt = round_plddt(top["plddt"])
    outputs = {}
    if np.isfinite(top["positions"]).all() and np.isfinite(plddt).all():
        files = _structures(folder, name, seq, top, plddt, chains, kinds=("pdb",))
        outputs["pdb"] = files["pdb"].name
        outputs["cif"] = _modelcif(folder / f"{name}.cif", name, seq, preds, order, details,
                                   chains, records).name
    outputs.update(_model_structures(folder, name, seq, preds, order, chains))
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
    if records and chains:                   # AlphaFold writes it for multimer runs
        outputs["chain_id_map"] = write_chain_id_map(folder, records)
    if plots:
        outputs.update(write_plots(folder, name, preds, order, coverage))
    for i, src in enumerate(msa_paths):   # the prediction's own copy of its MSA inputs
        dst = folder / f"msa_{i}_{Path(src).name}"
        shutil.copyfile(src, dst)
        outputs[f"msa_{i}"] = dst.name
    return outputs


CHAIN_ID_MAP = "msas/chain_id_map.json"     # AlphaFold-Multimer's, in its output folder


def write_chain_id_map(folder: Path, records: dict[str, dict]) -> str:
    """AlphaFold-Multimer's `msas/chain_id_map.json`: {chain id: {"description", "sequence"}}
    (`pipeline_multimer._make_chain_id_map`, sorted keys, indent 4); returns its path in
    the folder."""
    import json

    from protdp.fileio import atomic_write_bytes
    path = folder / CHAIN_ID_MAP
    path.parent.mkdir(exist_ok=True)
    atomic_write_bytes(path, json.dumps(records, indent=4, sort_keys=True).encode())
    return CHAIN_ID_MAP


MODELCIF_PAE_MODELS = 1
"""Ranked models whose PAE matrix goes into `<name>.cif` (`_ma_qa_metric_local_pairwise`, L^2
rows each): the top-ranked one. Measured (python-modelcif, 400 residues): 4.6 s and 6 MB for
one model's PAE, 40 s and 30 MB for five; every model's PAE is in its pae_<m>.json."""


def _modelcif(path: Path, name: str, seq: str, preds: dict, order: list[str], details: dict,
              chains, records) -> Path:
    """`<name>.cif`: every ranked model with finite coordinates, best first, each with its
    pLDDT / pTM / ipTM; the PAE of the first `MODELCIF_PAE_MODELS`."""
    ranked = [n for n in order if _finite(preds[n])]
    models = [{**preds[n], "plddt": round_plddt(preds[n]["plddt"]),
               "pae": preds[n].get("pae") if k < MODELCIF_PAE_MODELS else None,
               "label": f"rank {order.index(n) + 1}: {n} ({preds[n].get('model_name', n)})"}
              for k, n in enumerate(ranked)]
    return write_modelcif(path, name, models, details, chains=chains or [("A", seq)],
                          records=None if not records else
                          {c: r["description"] for c, r in records.items()})


def _finite(pred: dict) -> bool:
    return bool(np.isfinite(pred["positions"]).all() and np.isfinite(pred["plddt"]).all())


def _model_structures(folder: Path, name: str, seq: str, preds: dict, order: list[str],
                      chains) -> dict[str, str]:
    """Per model, AlphaFold's `unrelaxed_<m>.pdb|.cif` and `ranked_<k>.pdb|.cif`, and
    ColabFold's `<name>_unrelaxed_rank_NNN_<tag>.pdb` beside its scores JSON."""
    from protdp.inference.af_outputs import colabfold_name
    outputs = {}
    for k, n in enumerate(order):
        p = preds[n]
        if not _finite(p):
            continue
        plddt = round_plddt(p["plddt"])
        for kind in (f"unrelaxed_{n}", f"ranked_{k}"):
            f = _structures(folder, kind, seq, p, plddt, chains, kinds=("pdb", "cif"))
            outputs[kind], outputs[f"cif_{kind}"] = f["pdb"].name, f["cif"].name
        colabfold = folder / colabfold_name(name, "unrelaxed", k + 1,
                                            p.get("colabfold_tag", n), "pdb")
        shutil.copyfile(folder / outputs[f"unrelaxed_{n}"], colabfold)
        outputs[f"unrelaxed_rank_{k + 1:03d}"] = colabfold.name
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
    from protdp.complex.outputs import write_complex_structures
    return write_complex_structures(folder, name, chains, pred["positions"], plddt,
                                    pred["atom_mask"], kinds=kinds)
