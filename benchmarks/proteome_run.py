"""The "Predict a proteome" recipe (docs/prediction.md) run on real chains of the shared data, with
the shared AlphaFold2 reference weights (imported with `protdp weights import`) and with a small
checkpoint trained on the shared data (`--checkpoint`), every promised output checked.

For each weight set, `protdp predict` (the CLI, as a user runs it) predicts the chains with
their real MSAs (links into ../shared/data/msa, merged per chain as `--msa-dir DIR/<id>/`),
an ensemble of seeds, early stop, `--sort-queries-by-length` and `--relax`; then every file
of the output table (docs/prediction.md) is read back (json, numpy, gemmi, Biopython, PNG headers), the
ranking is recomputed from the result files, the review queue is opened and counted, and the
relaxation of each top-ranked model is reported (clashes and peptide-bond violations before /
after, heavy-atom and Cα RMSD moved, AlphaFold's 1 Å safety check). Cα lDDT / RMSD against the
experimental chain say whether the predictions are protein-like.

    python benchmarks/proteome_run.py --checkpoint RUN_OR_ITER_DIR [--af2-params NPZ]
        [--work DIR]   -> benchmarks/results/proteome_run.json

The checkpoint of the recorded run: `make demo`'s training recipe (configs/train/demo.yaml,
one rank, iter_0000240). With --work, a rerun skips the finished predictions (their recorded
seconds stay in summary.csv / relax.json) and redoes missing ones. The protein-like prediction
of tests/test_relax.py (the small model overfitted on 2p90_A02) is relaxed as well, for the
numbers of a relaxation that is kept.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protdp.data.parse import merge_msas, parse_msa  # noqa: E402
from protdp.data.store import FamilyStore, build_store  # noqa: E402
from protdp.inference.layout import current_prediction  # noqa: E402
from protdp.metrics import lddt_ca, rmsd_ca  # noqa: E402
from protdp.paths import data_root  # noqa: E402
from protdp.resources import config_file  # noqa: E402

CHAINS = ("5awl_A", "7a4d_E", "2p90_A02", "2q2k_A", "2qke_E", "2jp1_A", "4qhf_A", "7a4d_A",
          "4hhb_A", "1a3a_A")
RECIPE = ("--seeds", "2", "--sort-queries-by-length", "--recycle-early-stop-tolerance", "0.5",
          "--max-memory", "4", "--relax", "--allow-unreleased", "--no-progress")
# the trained checkpoint's early-training predictions are collapsed (thousands of clashes):
# their minimisations are bounded at 120 s instead of the default 300 s
CKPT_RELAX_TIMEOUT = ("--relax-timeout", "120")
AF2_DIR = data_root().parent / "af2_reference"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_inputs(work: Path, chains) -> tuple[Path, Path]:
    """proteome.fasta (each chain's merged MSA query) and msa/<id>/ links to its MSA files."""
    files: dict[str, list[Path]] = {}
    with open(data_root() / "PAIRS.tsv", newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            files.setdefault(row["pair_id"], []).append(data_root() / row["msa_file"])
    lines = []
    for pid in chains:
        lines += [f">{pid}", merge_msas([parse_msa(f) for f in files[pid]]).query]
        d = work / "inputs" / "msa" / pid
        d.mkdir(parents=True, exist_ok=True)
        for f in files[pid]:
            if not (d / f.name).exists():
                (d / f.name).symlink_to(f.resolve())
    fasta = work / "inputs" / "proteome.fasta"
    fasta.write_text("\n".join(lines) + "\n")
    return fasta, work / "inputs" / "msa"


def protdp(*args) -> tuple[float, str]:
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run([sys.executable, "-m", "protdp.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"protdp {' '.join(map(str, args[:2]))} failed:\n{proc.stderr[-3000:]}")
    return round(time.perf_counter() - t0, 1), proc.stdout


def experimental_ca(store: FamilyStore, family: str, length: int):
    """Cα of the experimental chain aligned to the query (the data store's alignment)."""
    fam = store.read(family)
    pos, mask = fam["backbone_positions"][:, 1], fam["backbone_mask"][:, 1]
    return (pos, mask) if len(pos) == length else (None, None)


def _check_ranking(pdir: Path, names: list[str], L: int, problems: list[str]):
    """ranking_debug.json against the result files' mean pLDDT; ranked_K.pdb = unrelaxed_*.pdb.
    Returns (ranking_debug, {name: result npz})."""
    from Bio.PDB import PDBParser
    debug = json.loads((pdir / "ranking_debug.json").read_text())
    results = {n: np.load(pdir / f"result_{n}.npz") for n in names}
    means = {n: float(r["plddt"].mean()) for n, r in results.items()}
    conf = debug.get("plddts", {})         # full floats; "ptm" beside it since issue 41
    if not {"plddts", "order"} <= set(debug) or set(conf) != set(names) \
            or any(abs(conf[n] - means[n]) > 1e-4 for n in names) \
            or debug["order"] != sorted(names, key=lambda n: (-conf[n], n)):
        problems.append("ranking_debug.json order is not the result files' mean pLDDT order")
    parser = PDBParser(QUIET=True)
    for k, n in enumerate(debug["order"]):
        ranked = (pdir / f"ranked_{k}.pdb").read_text()
        if ranked != (pdir / f"unrelaxed_{n}.pdb").read_text():
            problems.append(f"ranked_{k}.pdb is not unrelaxed_{n}.pdb")
        if len(list(parser.get_structure(n, pdir / f"ranked_{k}.pdb").get_residues())) != L:
            problems.append(f"ranked_{k}.pdb: residue count != {L}")
    return debug, results


def _check_pae_files(pdir: Path, target: str, top, scores_top: dict, L: int) -> list[str]:
    """The top model's two PAE files against its result file (`protdp.inference.af_outputs`):
    ColabFold's `<target>_predicted_aligned_error_v1.json`, one object holding its rank-1 scores
    file's `pae` (2 decimals) and `max_pae` (the matrix maximum), and the AFDB's
    `AF-<target>-F1-predicted_aligned_error_v4.json`, a one-element list, 1 decimal,
    `max_predicted_aligned_error` the head's largest bin (the result file's)."""
    problems = []
    pae = np.asarray(top["predicted_aligned_error"], np.float64)
    v1 = json.loads((pdir / f"{target}_predicted_aligned_error_v1.json").read_text())
    if not (isinstance(v1, dict)
            and set(v1) == {"predicted_aligned_error", "max_predicted_aligned_error"}
            and v1["predicted_aligned_error"] == scores_top.get("pae")
            and v1["max_predicted_aligned_error"] == scores_top.get("max_pae")
            and np.asarray(v1["predicted_aligned_error"]).shape == (L, L)
            and np.allclose(v1["predicted_aligned_error"], pae, atol=0.005 + 1e-9)
            and abs(v1["max_predicted_aligned_error"] - pae.max()) < 1e-6):
        problems.append("ColabFold PAE JSON (_v1) is not the rank-1 scores' pae / max_pae")
    afdb = json.loads((pdir / f"AF-{target}-F1-predicted_aligned_error_v4.json").read_text())
    if not (isinstance(afdb, list) and len(afdb) == 1 and isinstance(afdb[0], dict)
            and np.asarray(afdb[0]["predicted_aligned_error"]).shape == (L, L)
            and np.allclose(afdb[0]["predicted_aligned_error"], pae, atol=0.05 + 1e-9)
            and abs(afdb[0]["max_predicted_aligned_error"]
                    - float(top["max_predicted_aligned_error"])) < 0.01):
        problems.append("AFDB PAE JSON (AF-...-v4) does not match the top result")
    return problems


def _check_af_files(pdir: Path, target: str, results: dict, names: list[str], L: int,
                    has_pae: bool) -> list[str]:
    """AlphaFold's per-model `confidence_<m>.json` / `pae_<m>.json` against each result file,
    and ColabFold's `log.txt` (query, every model's tag, the ranking, `Done`)."""
    problems = []
    for n in names:
        plddt = np.round(np.asarray(results[n]["plddt"], np.float64), 2)
        conf = json.loads((pdir / f"confidence_{n}.json").read_text())
        if conf.get("residueNumber") != list(range(1, L + 1)) \
                or conf.get("confidenceScore") != plddt.tolist() \
                or len(conf.get("confidenceCategory", ())) != L:
            problems.append(f"confidence_{n}.json != the result's pLDDT")
        pae_file = pdir / f"pae_{n}.json"
        if not has_pae:
            if pae_file.exists():
                problems.append(f"pae_{n}.json written for a model without a PAE head")
            continue
        (doc,) = json.loads(pae_file.read_text())
        if not np.allclose(doc["predicted_aligned_error"], results[n]["predicted_aligned_error"],
                           atol=0.05 + 1e-9):
            problems.append(f"pae_{n}.json != the result's PAE")
    log = (pdir / "log.txt").read_text()
    if f"Query 1/1: {target} (length {L})" not in log or not log.rstrip().endswith("Done") \
            or log.count(" took ") != len(names):
        problems.append("log.txt lacks the query, a model or the final Done")
    return problems


def _check_pae_scores_plots(pdir: Path, target: str, top, names: list[str], L: int,
                            problems: list[str]) -> bool:
    """PAE JSON files, ColabFold scores files and PNG plots; returns whether the model has a
    PAE head (AF2 `_ptm`)."""
    has_pae = "predicted_aligned_error" in top.files
    score_files = sorted(pdir.glob(f"{target}_scores_rank_*.json"))
    if not has_pae:
        if list(pdir.glob("*predicted_aligned_error*.json")) or (pdir / f"{target}_pae.png").exists():
            problems.append("PAE outputs written for a model without a PAE head")
    elif score_files:
        problems += _check_pae_files(pdir, target, top, json.loads(score_files[0].read_text()), L)
    if len(score_files) != len(names):
        problems.append(f"{len(score_files)} ColabFold scores files for {len(names)} models")
    for f in score_files:
        s = json.loads(f.read_text())
        keys = {"plddt", "pae", "max_pae", "ptm"} if has_pae else {"plddt"}
        if not keys <= set(s) or len(s["plddt"]) != L:
            problems.append(f"{f.name}: keys or length")
    for kind in ("plddt", "pae", "coverage") if has_pae else ("plddt", "coverage"):
        png = pdir / f"{target}_{kind}.png"
        if not png.is_file() or png.read_bytes()[:8] != PNG_MAGIC:
            problems.append(f"{png.name} missing or not a PNG")
    return has_pae


def _check_records(pdir: Path, target: str, top, scores: dict, names: list[str],
                   summary_rows: list[dict], problems: list[str]) -> dict:
    """ModelCIF vs PDB vs pLDDT, provenance / pending / CURRENT / MSA copies, timings and
    summary.csv rows; returns the target's summary.csv rows by member name."""
    import gemmi
    L = scores["length"]
    doc = gemmi.cif.read(str(pdir / f"{target}.cif")).sole_block()
    rows = list(doc.find("_ma_qa_metric_local.", ["model_id", "metric_value"]))
    local = [r[1] for r in rows if rows and r[0] == rows[0][0]]   # every ranked model: the top one's
    st = gemmi.read_structure(str(pdir / f"{target}.pdb"))
    b = [r[0].b_iso for r in st[0][0]]
    if len(local) != L or not np.allclose([float(v) for v in local], b, atol=0.01) \
            or not np.allclose(b, np.round(top["plddt"], 2), atol=0.01):
        problems.append("ModelCIF _ma_qa_metric_local != PDB B-factors != top pLDDT")
    if len(gemmi.read_structure(str(pdir / f"{target}.cif"))[0][0]) != L:
        problems.append("ModelCIF residue count")
    prov = json.loads((pdir / "provenance.json").read_text())
    if not isinstance(prov, dict) or not (pdir / "pending.json").is_file() \
            or (pdir.parent / "CURRENT").read_text().strip() != pdir.name \
            or not list(pdir.glob("msa_*")):     # every chain here has MSA files
        problems.append("provenance.json / pending.json / CURRENT / MSA copies")
    timings = json.loads((pdir / "timings.json").read_text())
    if not all(f"predict_and_compile_{n}" in timings for n in names):
        problems.append("timings.json lacks a member")
    rows = {_row_name(r): r for r in summary_rows if r["id"] == target}
    if sorted(rows) != sorted(names):
        problems.append("summary.csv rows != ensemble members")
    glob = {v: doc.find_values(f"_ma_qa_metric_global.{v}") for v in ("metric_id", "metric_value")}
    if not any(abs(float(v) - scores["mean_plddt"]) < 0.01 for v in glob["metric_value"]):
        problems.append("ModelCIF global pLDDT != scores.json mean pLDDT")
    return rows


def _relax_outcome(pdir: Path, problems: list[str]) -> dict:
    """relax.json's outcome (with the Cα movement of a kept relaxation)."""
    relax = json.loads((pdir / "relax.json").read_text())
    relaxed_file = pdir / f"relaxed_{relax['model']}.pdb"
    if relax["relaxed"] != relaxed_file.is_file():
        problems.append("relax.json and relaxed_*.pdb disagree")
    out = {k: relax.get(k) for k in ("relaxed", "reason", "heavy_atom_rmsd",
                                     "outer_iterations", "energy_kcal", "seconds")}
    for when in ("before", "after"):
        v = relax.get(when) or {}
        out[when] = {k: v[k] for k in ("clashes", "bond_violations") if k in v}
    if relax["relaxed"]:
        ca_u = _ca(pdir / f"unrelaxed_{relax['model']}.pdb")
        ca_r = _ca(relaxed_file)
        out["ca_rmsd_moved"] = round(float(np.sqrt(((ca_u - ca_r) ** 2).sum(-1).mean())), 3)
    return out


def check_target(pdir: Path, target: str, summary_rows: list[dict], store) -> dict:
    """Read back every file of the output table (docs/prediction.md); returns the measured
    numbers and the list of problems (empty when every promised output is there and
    consistent)."""
    problems = []
    scores = json.loads((pdir / "scores.json").read_text())
    L = scores["length"]
    names = [m["name"] for m in scores["ensemble"]]
    debug, results = _check_ranking(pdir, names, L, problems)
    top = results[debug["order"][0]]
    has_pae = _check_pae_scores_plots(pdir, target, top, names, L, problems)
    problems += _check_af_files(pdir, target, results, names, L, has_pae)
    rows = _check_records(pdir, target, top, scores, names, summary_rows, problems)
    out = {"length": L, "has_pae_head": has_pae, "msa_depth": scores["msa_depth"], "route": scores["route"],
           "reasons": scores["reasons"], "mean_plddt": scores["mean_plddt"],
           "ptm": round(scores["ptm"], 4) if scores.get("ptm") is not None else None,
           "num_recycles": scores["num_recycles"], "order": debug["order"],
           "ensemble_max_ca_rmsd": scores["ensemble_spread"]["max_ca_rmsd"],
           "seconds": {n: float(r["seconds"]) for n, r in rows.items()},
           "relax": _relax_outcome(pdir, problems), "problems": problems}
    true_ca, mask = experimental_ca(store, target, L)
    if true_ca is not None:
        pred_ca = np.asarray(top_positions(pdir / f"{target}.pdb"))
        out["vs_experimental"] = {"lddt_ca": round(lddt_ca(pred_ca, true_ca, mask), 3),
                                  "rmsd_ca": round(rmsd_ca(pred_ca, true_ca, mask), 2)}
    ca = _ca(pdir / f"{target}.pdb")
    steps = np.linalg.norm(np.diff(ca, axis=0), axis=-1)
    out["ca_step_median"] = round(float(np.median(steps)), 2) if len(steps) else None
    return out


def _row_name(row: dict) -> str:
    return f"model_{row['model']}_seed_{int(row['seed']):03d}"


def _ca(pdb: Path) -> np.ndarray:
    import gemmi
    st = gemmi.read_structure(str(pdb))
    return np.array([r["CA"][0].pos.tolist() for r in st[0][0]])


def top_positions(pdb: Path) -> np.ndarray:
    return _ca(pdb)


def run_recipe(label: str, weights: list[Path], fasta: Path, msa_dir: Path, out: Path,
               extra: tuple = ()) -> dict:
    """`protdp predict` with the recipe's flags (docs/prediction.md), then every output read back."""
    from protdp.review.store import ReviewStore
    args = ["predict"]
    for w in weights:
        args += ["--checkpoint", w]
    wall, stdout = protdp(*args, "--fasta", fasta, "--msa-dir", msa_dir, "--out", out, *RECIPE, *extra)
    line = next((ln for ln in stdout.splitlines() if ln.startswith("protdp predict:")), "")
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    store = FamilyStore(out.parent / "data.h5")
    targets = {}
    for tdir in sorted((out / "targets").iterdir()):
        pdir = current_prediction(tdir)
        if pdir is not None:
            targets[tdir.name] = check_target(pdir, tdir.name, rows, store)
    queue = ReviewStore(f"sqlite:///{out / 'review_queue.sqlite'}")
    try:
        queued = queue.count()
    finally:
        queue.close()
    routes = [t["route"] for t in targets.values()]
    problems = {t: v["problems"] for t, v in targets.items() if v["problems"]}
    for name in ("summary.tsv", "summary.json"):
        if not (out / name).is_file():
            problems[name] = ["missing"]
    if queued != routes.count("needs_review"):
        problems["review_queue"] = [f"{queued} items for {routes.count('needs_review')} "
                                    "flagged targets"]
    if len(targets) != len(CHAINS) or len(rows) != sum(len(t["order"]) for t in targets.values()):
        problems["summary"] = [f"{len(targets)} targets, {len(rows)} summary.csv rows"]
    relaxed = [t for t in targets.values() if t["relax"]["relaxed"]]
    return {"label": label, "weights": [str(w) for w in weights], "cli_line": line,
            "wall_s_this_invocation": wall,
            "member_seconds_total": round(sum(float(r["seconds"] or 0) for r in rows), 1),
            "relax_seconds_total": round(sum(t["relax"]["seconds"] or 0 for t in targets.values()), 1),
            "routes": {r: routes.count(r) for r in sorted(set(routes))},
            "review_queue_items": queued, "summary_csv_rows": len(rows),
            "relaxed_kept": len(relaxed), "relax_refused": len(targets) - len(relaxed),
            "problems": problems,
            "targets": targets}


def checkpoint_record(ckpt: Path) -> dict:
    """The trained checkpoint's iteration and its held-out evaluation (the run's metrics.jsonl)."""
    m = re.fullmatch(r"iter_(\d+)", ckpt.name)
    run = ckpt.parent if m else ckpt
    it = int(m.group(1)) if m else None
    evals = []
    if (run / "metrics.jsonl").is_file():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "eval" and (it is None or rec.get("iteration") == it):
                evals.append(rec)
    last = evals[-1] if evals else {}
    return {"path": str(ckpt), "iteration": it if it is not None else last.get("iteration"),
            "val_lddt_ca": round(last["val_lddt_ca"], 3) if "val_lddt_ca" in last else None,
            "val_families": last.get("val_families")}


def relax_overfit_prediction(work: Path) -> dict:
    """The protein-like predicted chain of tests/test_relax.py (the small model overfitted from
    a seeded init on 2p90_A02, `model_fixtures.overfitted_2p90`) relaxed: the same numbers as
    for the runs above."""
    sys.path.insert(0, str(ROOT / "tests"))
    from model_fixtures import overfitted_2p90   # noqa: E402
    from protdp.inference.writers import write_structures
    from protdp.relax import relax_pdb
    folder = work / "overfit"
    folder.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    run = overfitted_2p90(data_root() / "structures")
    train_s = time.perf_counter() - t0
    pred = write_structures(folder, "pred_2p90_A02", run["sequence"],
                            *(run["out"][k].numpy() for k in ("final_atom_positions", "plddt",
                                                              "final_atom_mask")),
                            kinds=("pdb",))["pdb"]
    res = relax_pdb(pred, folder / "relaxed.pdb")
    out = {"chain": "2p90_A02", "overfit_lddt_ca": run["history"][-1][1],
           "overfit_seconds": round(train_s, 1),
           **{k: getattr(res, k) for k in ("relaxed", "reason", "heavy_atom_rmsd",
                                           "outer_iterations", "energy_kcal", "seconds")},
           "before": {k: res.before[k] for k in ("clashes", "bond_violations")},
           "after": {k: res.after.get(k) for k in ("clashes", "bond_violations")}}
    if res.relaxed:
        d = _ca(pred) - _ca(folder / "relaxed.pdb")
        out["ca_rmsd_moved"] = round(float(np.sqrt((d ** 2).sum(-1).mean())), 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="trained small checkpoint (run or iter_N folder)")
    ap.add_argument("--af2-params", default=str(AF2_DIR / "params" / "params_model_3_ptm_small.npz"))
    ap.add_argument("--af2-config", default=str(AF2_DIR / "config_model_3_ptm_small.json"))
    ap.add_argument("--af2-weights", default=None,
                    help="a folder of already imported model_N checkpoints (default: import "
                         "--af2-params into WORK/af2_weights)")
    ap.add_argument("--work", default=None, help="working folder (kept; a rerun skips finished work)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "proteome_run.json"))
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="proteome_run_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    fasta, msa_dir = make_inputs(work, CHAINS)
    if not (work / "data.h5").is_file():     # the experimental chains, aligned to the queries
        build_store(work / "data.h5", pairs=data_root() / "PAIRS.tsv", workers=1,
                    config=config_file("data/default.yaml"))
    af2 = Path(args.af2_weights).resolve() if args.af2_weights else work / "af2_weights"
    number = re.search(r"model_(\d+)", Path(args.af2_params).name).group(1)
    model = af2 / f"model_{number}"
    if args.af2_weights is None and not (model / "model.pt").is_file():
        protdp("weights", "import", "--format", "alphafold", args.af2_params,
               "--alphafold-config", args.af2_config, "--out", model)
    runs = [run_recipe("af2_reference_weights", [af2], fasta, msa_dir, work / "af2"),
            run_recipe("trained_small_checkpoint", [Path(args.checkpoint).resolve()], fasta,
                       msa_dir, work / "ckpt", CKPT_RELAX_TIMEOUT)]
    doc = {"what": "docs/prediction.md 'Predict a proteome' recipe on real chains of ../shared/data",
           "trained_checkpoint": checkpoint_record(Path(args.checkpoint)),
           "command": "protdp predict --checkpoint W --fasta proteome.fasta --msa-dir msa/ "
                      "--out OUT " + " ".join(RECIPE),
           "trained_checkpoint_extra_flags": " ".join(CKPT_RELAX_TIMEOUT),
           "chains": list(CHAINS), "runs": runs,
           "relax_protein_like_prediction": relax_overfit_prediction(work)}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in runs:
        print(f"{r['label']}: {r['cli_line']} routes {r['routes']} queue {r['review_queue_items']} "
              f"relaxed {r['relaxed_kept']}/{len(r['targets'])} problems {r['problems']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
