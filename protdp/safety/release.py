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

Multimer checkpoints (a folder with `multimer_model.pt`: imported AlphaFold-Multimer weights,
or a run fine-tuned on complexes) are judged on held-out complexes of a complex store: the
fine-tuning run's validation split, else `--data STORE --families ...`
(`protdp.safety.complex_release`: lDDT-Cα over all chains, interface lDDT-Cα, pLDDT and ipTM
calibration, the gate's complex thresholds), the complex red-team suite
(`protdp.safety.complex_redteam`) and the screening of every chain of the training store; the
record names these checks and carries each complex's figures under "complexes".
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from protdp.data.screening import ScreeningList
from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.fileio import atomic_write_json, sha256_file
from protdp.gating.bands import AFDB_BAND_FLOORS, AFDB_BANDS
from protdp.gating.release import ReleasePolicy
from protdp.inference.checkpoint import (MULTIMER_MODEL_FILE, LoadedModel, checkpoint_home,
                                        is_multimer_checkpoint, load_model_checkpoint)
from protdp.complex.store import ComplexStore, is_complex_store
from protdp.resources import resolve_config
from protdp.safety.calibration import evaluate_families, summarize
from protdp.safety.heldout import held_out
from protdp.safety.redteam import run_suite
from protdp.train.checkpointing import DATA_KEYS, read_any_weights
from protdp.train.release_record import RELEASE_FILE, RELEASE_FORMAT


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


def calibration_checks(loaded: LoadedModel, store: Path, families: list[str],
                       policy: ReleasePolicy) -> tuple[list[dict], dict]:
    """Accuracy and pLDDT calibration (`judge_calibration`) on the held-out families."""
    with FamilyStore(store) as s:
        missing = [f for f in families if f not in s]
        if missing:
            raise InputError(f"held-out families not in the store: {missing[:5]}", path=store)
        per_target = evaluate_families(loaded, s, families, policy.max_msa_rows)
    return judge_calibration(per_target, policy)


def judge_calibration(per_target: list[dict], policy: ReleasePolicy) -> tuple[list[dict], dict]:
    """Accuracy (mean lDDT-Cα), and Spearman, ECE and per-band accuracy of pLDDT, of held-out
    predictions (families, or complexes scored over all their chains)."""
    report = summarize(per_target, 0.7)
    enough = len(per_target) >= policy.min_targets
    why = "" if enough else f"only {len(per_target)} held-out targets (< {policy.min_targets})"
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
    hits = [name for path in stores for name, seq in store_sequences(path) if screen.hits(seq)]
    return _check("training_data_screening", len(hits), 0, "hits ==", not hits,
                  f"training sequences matching {policy.screening_list}: {hits[:10]}"
                  if hits else "")


def store_sequences(path: Path):
    """(name, sequence) of every training example of a store: each family of a family store,
    each chain of a complex store ("complex/chain")."""
    if is_complex_store(path):
        with ComplexStore(path) as store:
            for cid in store.complex_ids:
                for chain in store.read(cid)["chains"]:
                    yield f"{cid}/{chain['chain_id']}", str(chain["sequence"])
        return
    with FamilyStore(path) as store:
        for fid in store.family_ids:
            yield fid, store.read(fid)["sequence"]


def evaluate_release(checkpoint: str | Path, *, data: str | Path | None = None,
                     families: list[str] | None = None, policy: ReleasePolicy | None = None,
                     out_dir: str | Path | None = None, device: str = "cpu") -> Path:
    """Run every release check on `checkpoint` (a monomer one, or a multimer one on held-out
    complexes: `protdp.safety.complex_release`); write release.json (atomically); return it."""
    policy = policy or ReleasePolicy()
    if not is_multimer_checkpoint(checkpoint) and \
            (Path(checkpoint).resolve().parent / MULTIMER_MODEL_FILE).is_file():
        raise InputError("a checkpoint of a run fine-tuned on complexes: release the run folder "
                         f"(its {MULTIMER_MODEL_FILE} holds the EMA weights of the newest save, "
                         "the weights `protdp predict` serves)", path=checkpoint)
    home = Path(out_dir) if out_dir else checkpoint_home(checkpoint)
    extra = {}
    if is_multimer_checkpoint(checkpoint):
        loaded, meta, store, fams, checks, report, red, extra = _multimer_checks(
            checkpoint, data, families, policy, home, device)
    else:
        meta = read_any_weights(checkpoint).meta
        loaded = load_model_checkpoint(checkpoint, device=device)
        store, fams = held_out(meta, data, families)
        checks, report = calibration_checks(loaded, store, fams, policy)
        _stage("red-team suite")
        red = run_suite(checkpoint, home / "release_redteam", device=device)
    misses = [c["name"] for c in red["cases"] + red["global_checks"] if not c["passed"]]
    checks.append(_check("redteam", len(misses), policy.max_redteam_failures, "<=",
                         len(misses) <= policy.max_redteam_failures, ", ".join(misses[:10])))
    checks.append(screening_check(meta, policy, [Path(data)] if data else []))
    doc = {"format": RELEASE_FORMAT,
           "checkpoint": {"path": str(loaded.path), "sha256": loaded.sha256, "kind": loaded.kind,
                          "weights": loaded.weights, "iteration": loaded.iteration},
           "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "policy": policy.__dict__, "held_out": {"store": str(store), "families": fams},
           "checks": checks,
           "verdict": "released" if all(c["passed"] for c in checks) else "refused",
           "calibration": {k: report[k] for k in ("n_targets", "n_residues", "spearman", "ece",
                                                  "bands", "reliability")}, **extra}
    return atomic_write_json(home / RELEASE_FILE, doc, allow_nan=True, default=str)


def _stage(what: str) -> None:
    """One progress line on stderr: a release runs for minutes on a CPU."""
    print(f"protdp release: {what} ...", file=sys.stderr, flush=True)


def _multimer_checks(checkpoint, data, families, policy: ReleasePolicy, home: Path, device):
    """The held-out complexes' checks and the complex red-team suite of a multimer checkpoint
    (`protdp.safety.complex_release`, `protdp.safety.complex_redteam`)."""
    from protdp.gating import load_gate_policy
    from protdp.inference.multimer_loading import load_multimer_checkpoint
    from protdp.safety import complex_release as cr
    from protdp.safety.complex_redteam import run_complex_suite

    loaded = load_multimer_checkpoint(checkpoint, device=device)
    meta = cr.training_meta(loaded.path)
    store, ids = held_out(meta, data, families, open_store=ComplexStore)
    with ComplexStore(store) as s:
        missing = [c for c in ids if c not in s.complex_ids]
        if missing:
            raise InputError(f"held-out complexes not in the complex store: {missing[:5]}",
                             path=store)
        per_complex = cr.evaluate_complexes(loaded, s, ids, policy.max_msa_rows, device)
    checks, report = judge_calibration(per_complex, policy)
    enough = len(per_complex) >= policy.min_targets
    why = "" if enough else f"only {len(per_complex)} held-out complexes (< {policy.min_targets})"
    gate = load_gate_policy()
    checks += cr.interface_checks(per_complex, policy, gate, _check, enough, why)
    _stage("complex red-team suite")
    red = run_complex_suite(loaded, home / "release_redteam", device=device)
    extra = {"complexes": {"gate": {"min_iptm": gate.min_iptm,
                                    "max_interface_pae": gate.max_interface_pae},
                           **cr.complex_summary(per_complex)}}
    return loaded, meta, store, ids, checks, report, red, extra
