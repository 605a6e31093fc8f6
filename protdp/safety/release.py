"""The release gate of a checkpoint (`protdp release CKPT`; the trainer launches it after each
save): held-out accuracy and calibration, the red-team suite and the screening-list check of
the training data, each against `protdp.gating.release.ReleasePolicy`; the verdict and every
figure go to `release.json` beside the checkpoint, where `protdp predict` looks for it.

Held-out families: for a training checkpoint, the run's own validation split (recomputed from
its recorded config: the same store, seed and fraction); otherwise `--data` / `--families`.
The training data manifest is the run's HDF5 store(s) (every family's sequence is screened),
found by the content digest its checkpoint recorded (also under `--data`); a recorded store that
cannot be found fails the check. An imported or shipped model file records none, which the
record states (the check is then "not applicable", not a pass by silence).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from protdp.config import from_dict
from protdp.data.screening import ScreeningList
from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.fileio import sha256_file
from protdp.gating.bands import AFDB_BAND_FLOORS, AFDB_BANDS
from protdp.gating.release import ReleasePolicy
from protdp.inference.checkpoint import LoadedModel, checkpoint_home, load_model_checkpoint
from protdp.resources import resolve_config
from protdp.safety.calibration import evaluate_families, summarize
from protdp.safety.redteam import run_suite
from protdp.train.args import TrainArgs
from protdp.train.checkpointing import DATA_KEYS, read_any_weights
from protdp.train.release_record import RELEASE_FILE, RELEASE_FORMAT
from protdp.train.trainer import split_families


def _check(name: str, value, threshold, op: str, passed: bool, detail: str = "") -> dict:
    return {"name": name, "value": value, "threshold": threshold, "op": op, "passed": bool(passed),
            "detail": detail}


def check_line(check: dict) -> str:
    """One line of a release record's check for people: pass/FAIL, name, figure, threshold."""
    value = check["value"]
    shown = "per band" if isinstance(value, dict) else (f"{value:.4g}" if isinstance(value, float)
                                                         else str(value))
    return (f"{'pass' if check['passed'] else 'FAIL'}  {check['name']:<26} {shown:<10} "
            f"({check['op']} {check['threshold']}) {check['detail']}").rstrip()


def held_out(trained_meta: dict, data: str | Path | None, families: list[str] | None
             ) -> tuple[Path, list[str]]:
    """(store, held-out family ids): explicit ones, or the training run's validation split."""
    config = trained_meta.get("config") or {}
    store = Path(data) if data else (Path(config["data"]) if config.get("data") else None)
    if store is None:
        raise InputError("no held-out data: give --data STORE (and --families) for a checkpoint "
                         "that is not a training run", field="--data")
    if families is not None:
        return store, families
    if not config.get("data"):
        raise InputError("give --families: the checkpoint records no validation split",
                         field="--families")
    args = from_dict(TrainArgs, {k: v for k, v in config.items()
                                 if k in TrainArgs.__dataclass_fields__}, source="meta.json")
    with FamilyStore(store) as s:
        return store, split_families(list(s.family_ids), args)[1]


def calibration_checks(loaded: LoadedModel, store: Path, families: list[str],
                       policy: ReleasePolicy) -> tuple[list[dict], dict]:
    """Accuracy (mean lDDT-Cα), and Spearman, ECE and per-band accuracy of pLDDT, on the
    held-out families."""
    with FamilyStore(store) as s:
        missing = [f for f in families if f not in s]
        if missing:
            raise InputError(f"held-out families not in the store: {missing[:5]}", path=store)
        per_target = evaluate_families(loaded, s, families, policy.max_msa_rows)
    report = summarize(per_target, 0.7)
    enough = len(per_target) >= policy.min_targets
    why = "" if enough else f"only {len(per_target)} held-out families (< {policy.min_targets})"
    rho, ece = report["spearman"]["residue"], report["ece"]
    mean_lddt = (sum(r["lddt_ca"] for r in per_target) / len(per_target)) if per_target else None
    checks = [
        _check("held_out_accuracy", mean_lddt, policy.min_mean_lddt_ca, "mean lDDT-Ca >=",
               enough and mean_lddt is not None and mean_lddt >= policy.min_mean_lddt_ca, why),
        _check("calibration_spearman", rho, policy.min_spearman_residue, ">=",
               enough and rho is not None and rho >= policy.min_spearman_residue, why),
        _check("calibration_ece", ece, policy.max_ece, "<=",
               enough and ece is not None and ece <= policy.max_ece, why)]
    bands = {}
    for band in AFDB_BANDS:
        b = report["bands"][band]
        judged = b["residues"] >= policy.min_band_residues
        floor = AFDB_BAND_FLOORS[band][0] - policy.band_tolerance
        bands[band] = {**b, "floor": floor, "judged": judged,
                       "passed": not judged or b["mean_true_lddt"] >= floor}
    checks.append(_check("calibration_band_accuracy", bands, policy.band_tolerance,
                         "mean true lDDT >= band floor - tolerance",
                         enough and all(b["passed"] for b in bands.values()), why))
    return checks, report


def training_stores(trained_meta: dict, candidates: list[Path]) -> tuple[list[Path], list[str]]:
    """(stores found, training stores not found) of a checkpoint's training data: by the sha256
    its checkpoint recorded (`checkpointing.data_manifest`) at the recorded path or any of
    `candidates` (e.g. --data), so a moved store is still found and another file with the old
    name is not taken for it; a run saved before manifests existed, by its recorded path."""
    config = trained_meta.get("config") or {}
    manifest = trained_meta.get("data_manifest") or {}
    found, missing = [], []
    for key in DATA_KEYS:
        path = config.get(key)
        if not path:
            continue
        rec = manifest.get(key) if isinstance(manifest.get(key), dict) else None
        if rec:
            hit = next((p for p in [Path(path), *candidates]
                        if p.is_file() and sha256_file(p) == rec.get("sha256")), None)
        else:
            hit = Path(path) if Path(path).is_file() else None
        if hit is None:
            missing.append(f"{key} {path}" + (f" (sha256 {rec['sha256'][:16]})" if rec else ""))
        else:
            found.append(hit)
    return found, missing


def screening_check(trained_meta: dict, policy: ReleasePolicy,
                    candidates: list[Path] | None = None) -> dict:
    """Every training family's sequence against the screening list. A recorded training store
    that cannot be found is a failed check (never a pass); weights that record no training
    data at all (imported or shipped models) are "not applicable", stated in the record."""
    config = trained_meta.get("config") or {}
    if not any(config.get(k) for k in DATA_KEYS):
        return _check("training_data_screening", None, 0, "hits ==", True,
                      "not applicable: no training data manifest recorded for these weights")
    stores, missing = training_stores(trained_meta, candidates or [])
    if missing:
        return _check("training_data_screening", None, 0, "hits ==", False,
                      "training data not found, so it cannot be screened: " + "; ".join(missing)
                      + " (give --data pointing at that store)")
    screen = ScreeningList.from_fasta(resolve_config(policy.screening_list))
    hits = []
    for path in stores:
        with FamilyStore(path) as store:
            hits += [f for f in store.family_ids if screen.hits(store.read(f)["sequence"])]
    return _check("training_data_screening", len(hits), 0, "hits ==", not hits,
                  f"families matching {policy.screening_list}: {hits[:10]}" if hits else "")


def evaluate_release(checkpoint: str | Path, *, data: str | Path | None = None,
                     families: list[str] | None = None, policy: ReleasePolicy | None = None,
                     out_dir: str | Path | None = None, device: str = "cpu") -> Path:
    """Run every release check on `checkpoint`; write release.json (atomically); return it."""
    policy = policy or ReleasePolicy()
    trained = read_any_weights(checkpoint)
    loaded = load_model_checkpoint(checkpoint, device=device)
    home = Path(out_dir) if out_dir else checkpoint_home(checkpoint)
    store, fams = held_out(trained.meta, data, families)
    checks, report = calibration_checks(loaded, store, fams, policy)
    red = run_suite(checkpoint, home / "release_redteam", device=device)
    misses = [c["name"] for c in red["cases"] + red["global_checks"] if not c["passed"]]
    checks.append(_check("redteam", len(misses), policy.max_redteam_failures, "<=",
                         len(misses) <= policy.max_redteam_failures, ", ".join(misses[:10])))
    checks.append(screening_check(trained.meta, policy, [Path(data)] if data else []))
    doc = {"format": RELEASE_FORMAT,
           "checkpoint": {"path": str(loaded.path), "sha256": loaded.sha256, "kind": loaded.kind,
                          "weights": loaded.weights, "iteration": loaded.iteration},
           "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "policy": policy.__dict__, "held_out": {"store": str(store), "families": fams},
           "checks": checks,
           "verdict": "released" if all(c["passed"] for c in checks) else "refused",
           "calibration": {k: report[k] for k in ("n_targets", "n_residues", "spearman", "ece",
                                                  "bands", "reliability")}}
    home.mkdir(parents=True, exist_ok=True)
    path = home / RELEASE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path
