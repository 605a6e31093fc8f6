"""Entry points of `protdp redteam` and `protdp calibrate` (the library modules hold no argparse)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from protdp.config import load_config
from protdp.errors import InputError
from protdp.gating import AFDB_BANDS
from protdp.safety import redteam as redteam_mod
from protdp.safety import review_calibration as review_cal
from protdp.safety.calibration import calibrate as run_calibration
from protdp.safety.redteam import DEFAULT_CONFIG, RedTeamConfig, run_suite


def redteam(argv: list[str] | None = None) -> int:
    """`protdp redteam`: exit 1 when any case or global check fails."""
    p = argparse.ArgumentParser(prog="protdp redteam",
                                description=redteam_mod.__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="model file or training run folder")
    p.add_argument("--out", required=True, help="folder for redteam_report.json and the sandbox")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="suite settings (%(default)s)")
    p.add_argument("--data", default=None,
                   help="real data corpus (default: PROTDP_DATA or ../shared/data)")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    cfg = load_config(RedTeamConfig, args.config)
    report = run_suite(args.checkpoint, args.out, cfg, data=args.data, device=args.device)
    for c in report["cases"] + report["global_checks"]:
        mark = "ok  " if c["passed"] else "MISS"
        problems = "" if c["passed"] else ": " + "; ".join(map(str, c["problems"]))
        print(f"{mark} {c['name']}{problems}")
    global_ok = all(g["passed"] for g in report["global_checks"])
    print(f"protdp redteam: {report['passed']}/{len(report['cases'])} cases met their expectation; "
          f"global checks {'passed' if global_ok else 'FAILED'}; "
          f"report: {Path(args.out).resolve() / 'redteam_report.json'}")
    return 0 if report["ok"] else 1


def _families_arg(text: str | None) -> list[str] | None:
    """Comma-separated ids, or @FILE with one id per line."""
    if text is None:
        return None
    if text.startswith("@"):
        from protdp.data.safeio import os_reason, read_text

        path = Path(text[1:])
        try:       # a regular UTF-8 text file: a folder or binary data is one line naming it
            lines = read_text(path).splitlines()
        except OSError as exc:
            raise InputError(f"cannot read family list: {os_reason(exc)}", path=path) from None
        ids = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
        if not ids:
            raise InputError("family list names no family (one id per line)", path=path)
        return ids
    return [f.strip() for f in text.split(",") if f.strip()]


def calibrate(argv: list[str] | None = None) -> int:
    """`protdp calibrate`: pLDDT vs true lDDT (--checkpoint, --data), or what reviewers
    approve (--from-reviews QUEUE_URL)."""
    ap = argparse.ArgumentParser(prog="protdp calibrate",
                                 description="pLDDT vs true lDDT-Cα calibration report, or "
                                             "(--from-reviews) the gate fitted to reviewers' "
                                             "decisions")
    ap.add_argument("--checkpoint", default=None,
                    help="model file or training run/iter folder (required without "
                         "--from-reviews; with it: where review_calibration.json goes)")
    ap.add_argument("--data", default=None, help="HDF5 family store of held-out families")
    ap.add_argument("--out", default=None, help="output folder (default: next to the checkpoint)")
    ap.add_argument("--families", default=None,
                    help="held-out family ids: comma-separated or @file (default: a training "
                         "run's validation split, as release uses; else every family)")
    ap.add_argument("--target-lddt", type=float, default=0.7,
                    help="accepted set's mean true lDDT-Cα must stay >= this (0-1)")
    ap.add_argument("--max-msa-rows", type=int, default=128)
    ap.add_argument("--num-recycles", type=int, default=None)
    rev = ap.add_argument_group("from reviews")
    rev.add_argument("--from-reviews", metavar="QUEUE_URL", default=None,
                     help="fit P(reviewer approves) from the decisions in this review queue and "
                          "propose gate thresholds (writes review_calibration.json/.png)")
    rev.add_argument("--target-reject-rate", type=float, default=review_cal.DEFAULT_TARGET,
                     help="largest predicted share of auto-accepted predictions reviewers "
                          "would reject (%(default)s)")
    rev.add_argument("--method", choices=review_cal.METHODS, default="logistic")
    rev.add_argument("--admin-token", default=None,
                     help="the queue's admin token (prefer env PROTDP_REVIEW_ADMIN_TOKEN): "
                          "reviews are read only after `protdp review verify` passes")
    rev.add_argument("--gating", default=None,
                     help="the configured gate policy YAML: the floor the proposal never "
                          "loosens (default configs/gating.yaml)")
    args = ap.parse_args(argv)
    if args.from_reviews is not None:
        return _calibrate_from_reviews(args)
    if args.checkpoint is None or args.data is None:
        ap.error("--checkpoint and --data are required (or use --from-reviews QUEUE_URL)")
    path = run_calibration(args.checkpoint, args.data, args.out,
                           families=_families_arg(args.families), target_lddt=args.target_lddt,
                           max_msa_rows=args.max_msa_rows, num_recycles=args.num_recycles)
    doc = json.loads(path.read_text())
    thr, sp = doc["threshold"], doc["spearman"]
    print(f"{doc['n_targets']} targets, {doc['n_residues']} residues; Spearman residue "
          f"{sp['residue']}, target {sp['target']}")
    for name in AFDB_BANDS:
        b = doc["bands"][name]
        acc = "-" if b["mean_true_lddt"] is None else f"{b['mean_true_lddt']:.1f}"
        print(f"  {name:<10} {b['residues']:>6} residues  mean true lDDT {acc}")
    print(f"gate threshold (mean pLDDT) {thr['accept_mean_plddt']:.1f}: "
          f"{'achievable' if thr['achievable'] else 'NOT achievable'}, coverage {thr['coverage']:.0%}")
    if "warning" in doc:
        print(f"warning: {doc['warning']}")
    print(f"wrote {path} and {path.parent / doc['plot']}")
    return 0


def _calibrate_from_reviews(args) -> int:
    """`protdp calibrate --from-reviews QUEUE_URL`."""
    from protdp.gating import load_gate_policy

    out = args.out
    if out is None and args.checkpoint is not None:
        from protdp.inference.checkpoint import checkpoint_home
        out = checkpoint_home(args.checkpoint)
    token = args.admin_token or os.environ.get("PROTDP_REVIEW_ADMIN_TOKEN")
    path = review_cal.calibrate_from_reviews(
        args.from_reviews, out if out is not None else ".", floor=load_gate_policy(args.gating),
        admin_token=token,
        target=args.target_reject_rate, method=args.method)
    doc = json.loads(path.read_text())
    c = doc["counts"]
    for r in doc.get("refused", []):
        print(f"refused item {r['item_id']}: {r['reason']}")
    print(f"{c['decisions']} reviewed decisions: {c['approved']} approved, {c['rejected']} "
          f"rejected ({c['skipped']['escalated']} escalated and {c['skipped']['incomplete']} "
          "without features left out)")
    cx = doc.get("complexes") or {}
    if cx.get("status") == "ok":
        cp = cx["policy"]
        print(f"complexes ({cx['counts']['decisions']} reviewed): "
              f"{'proposed' if cp['achievable'] else 'target NOT achievable:'} ipTM >= "
              f"{cp['min_iptm']:g}, interface PAE <= {cp['max_interface_pae']:g} Å "
              f"(configured floor: {cx['floor']})")
        ip = cx.get("ipsae") or {}
        print(f"complexes: ipSAE >= {ip['min_ipsae']:g} (weakest chain pair)" if ip.get(
            "status") == "ok" else f"complexes: ipSAE: {ip.get('message', 'not fitted')}")
    elif cx:
        print(f"complexes: {cx['message']}")
    if doc["status"] != "ok":
        print(f"too few reviews: {doc['message']}; wrote {path}")
        return 0
    pol, rel = doc["policy"], doc["reliability"]
    print(f"fit ({doc['method']}): cross-validated Brier {rel['brier']:.3f}, AUC {rel['auc']:.2f}")
    verdict = "proposed" if pol["achievable"] else "target NOT achievable; review everything:"
    print(f"{verdict} gate: mean pLDDT >= {pol['accept_mean_plddt']:g}, very-low fraction <= "
          f"{pol['max_very_low_fraction']:g}, MSA depth >= {pol['min_msa_depth']} "
          f"(configured floor: {doc['floor']}); worst predicted rejection rate of an accepted "
          f"prediction {pol['worst_reject_probability']}")
    print(f"wrote {path} and {path.parent / doc['plot']}; apply it with `protdp predict "
          f"--calibration {path}` (or keep it beside the checkpoint)")
    return 0


def release(argv: list[str] | None = None) -> int:
    """`protdp release CKPT`: exit 0 when released, 1 when a check failed."""
    from protdp.gating.release import ReleasePolicy, site_policy_path, weaker_thresholds
    from protdp.safety.release import check_line, evaluate_release

    ap = argparse.ArgumentParser(
        prog="protdp release",
        description="release gate of a checkpoint: held-out accuracy and calibration, red-team "
                    "suite and training-data screening; writes release.json beside it. A "
                    "multimer checkpoint (a folder with multimer_model.pt) is judged on "
                    "held-out complexes of a complex store (interface lDDT, ipTM calibration)")
    ap.add_argument("checkpoint", help="training run / iter_N folder or model file (imported "
                                       "AlphaFold/OpenFold weights included), or a multimer "
                                       "checkpoint folder (imported or fine-tuned on complexes)")
    ap.add_argument("--data", default=None,
                    help="HDF5 store of held-out families, or complex store for a multimer "
                         "checkpoint (default: the training run's store)")
    ap.add_argument("--families", default=None,
                    help="held-out family / complex ids, comma-separated or @file (default: "
                         "the run's validation split)")
    ap.add_argument("--config", default=site_policy_path(),
                    help="thresholds (%(default)s: $PROTDP_RELEASE_POLICY or the packaged one); "
                         "a record judged by weaker ones than the site's never serves")
    ap.add_argument("--out", default=None, help="folder for release.json (default: beside the "
                                                "checkpoint)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    policy = load_config(ReleasePolicy, args.config)
    path = evaluate_release(args.checkpoint, data=args.data,
                            families=_families_arg(args.families), policy=policy, out_dir=args.out,
                            device=args.device)
    doc = json.loads(path.read_text())
    for c in doc["checks"]:
        print(check_line(c))
    weaker = weaker_thresholds(doc["policy"], complexes="complexes" in doc)
    if weaker:
        print("note: judged by thresholds weaker than the site's policy, so `protdp predict` "
              "treats this checkpoint as unreleased: " + "; ".join(weaker))
    print(f"protdp release: {doc['verdict']}; record: {path}")
    return 0 if doc["verdict"] == "released" else 1
