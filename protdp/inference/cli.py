"""`protdp predict`: batch structure prediction with the confidence gate and review queue.

    protdp predict --checkpoint CKPT --fasta targets.fasta --msa-dir DIR --out OUT \
        [--queue-url URL] [--gating configs/gating.yaml] [--screening FASTA] [--max-length N]
    protdp predict ... [--msa-dir DIR] --db uniref90.fasta.gz [--db mgnify.fasta.gz]

With --db, each target without an MSA in --msa-dir gets one from `protdp msa search` (pyhmmer,
AF2's jackhmmer settings) into OUT/msa_search when a process claims it (in the --prefetch
worker while the model runs, else just before its prediction: `claimed_search`);
provenance.json records the databases, their sha256 and the search settings
(config.msa_search).

Under torchrun / mpirun / srun (`pipelines/predict.py`), and for several `protdp predict`
processes on the same inputs and --out (job-array tasks), every process claims targets from
one leased work queue (`protdp.inference.work`); a killed process's target is claimed again
when its lease runs out. `protdp predict --status OUT` shows the run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from protdp.data.safeio import writable_folder
from protdp.errors import ConfigError, DistributedError, InputError
from protdp.inference.predictor import BATCH_SEEDS, MSA_MODES, PredictConfig
from protdp.msa.cli import add_search_arguments
from protdp.complex.pair_modes import PAIR_MODES
from protdp.workflows import add_gate_arguments, predict, review_commands


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, action="append",
                   help="model file (protdp-model-v1) or training run / iter_N folder; repeat it "
                        "for an ensemble (AlphaFold's model_1..5), or give a folder holding "
                        "model_1 .. model_5 checkpoints; a multimer checkpoint (`weights import` "
                        "of params_model_N_multimer_v3.npz) reads --fasta as complexes "
                        "(ColabFold 'A:B' records or one FASTA file per complex)")
    p.add_argument("--fasta", required=True,
                   help="targets: a FASTA file (one record each), a folder of FASTA / a3m files "
                        "or a CSV with id,sequence columns (ColabFold's batch inputs); with a "
                        "multimer checkpoint also the --out folder of `protdp complex features`")
    p.add_argument("--msa-dir", default=None,
                   help="MSAs as <name>.a3m|.sto|.fasta|.aln or a folder <name>/ (merged), where "
                        "<name> is the target id when it is a plain name ([A-Za-z0-9_.-], up to "
                        "53 characters) and otherwise the sanitised file_name of summary.tsv; "
                        "no MSA: single-sequence mode (flagged shallow_msa). Complexes: "
                        "ColabFold's <complex>.a3m, <complex>/paired/<chain>.a3m (your own "
                        "pairing) or `msa search --complexes` folders")
    p.add_argument("--out", required=True, help="output folder (targets/<name>/, summary.tsv)")
    add_gate_arguments(p)
    p.add_argument("--calibration", default=None,
                   help="calibration.json from `protdp calibrate`; tightens the gate's mean-pLDDT "
                        "threshold (default: CHECKPOINT/calibration.json when present)")
    p.add_argument("--screening", default=None, help="FASTA of sequences of concern")
    p.add_argument("--allow-unreleased", action="store_true",
                   help="run a checkpoint without a passing release record (`protdp release`): "
                        "recorded in provenance.json, every prediction goes to review")
    d = PredictConfig()
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help="reject longer targets (%(default)s)")
    p.add_argument("--max-msa-rows", type=int, default=d.max_msa_rows,
                   help="MSA depth cap (%(default)s)")
    p.add_argument("--num-recycles", type=int, default=None,
                   help="recycling passes (default: the checkpoint's config)")
    p.add_argument("--template", action="append", default=[], metavar="FILE.cif[:CHAIN]",
                   help="custom template for every target (repeatable; aligned with kalign; "
                        "one that cannot be used is an error naming it)")
    _add_ensemble_arguments(p, d)
    s = p.add_argument_group("MSA search for targets without an MSA (protdp msa search)")
    add_search_arguments(s, db_required=False, prefix="search-")
    s.add_argument("--msa-search-dir", default=None,
                   help="searched MSAs, kept between runs (default OUT/msa_search)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    p.add_argument("--bf16", action="store_true",
                   help="run the trunk (Evoformer, extra-MSA stack) under bf16 autocast; the "
                        "structure module and heads stay fp32 (recorded in provenance.json "
                        "and scores.json's trunk_dtype)")
    p.add_argument("--dap-size", type=int, default=1,
                   help="ranks that share each target, its Evoformer split over them (dynamic "
                        "axial parallelism) for targets too long for one device; world = "
                        "target-parallel ranks x dap size (%(default)s)")
    add_work_queue_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dist-timeout-minutes", type=float, default=24 * 60.0,
                   help="timeout of the end-of-run barrier across ranks (%(default)s)")
    return p


def _add_ensemble_arguments(p: argparse.ArgumentParser, d: PredictConfig) -> None:
    """Seeds, batching, MSA / pair modes, early stop, memory and output flags (`d`: defaults)."""
    e = p.add_argument_group("ensembles, early stop, memory, outputs")
    e.add_argument("--seeds", type=int, default=d.num_seeds,
                   help="predictions per checkpoint, seeds --random-seed .. +N-1 (%(default)s)")
    e.add_argument("--random-seed", type=int, default=d.seed, help="first seed (%(default)s)")
    e.add_argument("--batch-seeds", choices=BATCH_SEEDS, default=d.batch_seeds,
                   help="run a checkpoint's seeds as one batch when memory allows: auto = on "
                        "CUDA only (on a CPU it was measured slower), always, never "
                        "(%(default)s)")
    e.add_argument("--msa-mode", choices=MSA_MODES, default=d.msa_mode,
                   help="single_sequence: ignore MSAs (%(default)s)")
    e.add_argument("--pair-mode", choices=PAIR_MODES, default=d.pair_mode,
                   help="complexes: paired block, unpaired rows or both (ColabFold's names; "
                        "%(default)s)")
    e.add_argument("--sort-queries-by-length", action="store_true",
                   help="run the shortest targets first")
    e.add_argument("--recycle-early-stop-tolerance", type=float, default=None,
                   help="stop recycling when the Cα distance matrix changes less than this "
                        "(Å, ColabFold's definition)")
    e.add_argument("--stop-at-score", type=float, default=None,
                   help="stop recycling, and further models, once the mean pLDDT reaches this")
    e.add_argument("--max-memory", type=float, default=None,
                   help="GiB one prediction may use: the chunk size is chosen to fit it "
                        "(out-of-memory errors retry with smaller chunks either way)")
    e.add_argument("--save-distogram", action="store_true",
                   help="keep the distogram logits in result_*.npz")
    e.add_argument("--relax", action="store_true",
                   help="Amber-relax the top-ranked model (pip install 'protdp[relax]'); "
                        "a failure keeps the unrelaxed model and is reported in relax.json")
    e.add_argument("--relax-timeout", type=float, default=d.relax_timeout_s,
                   help="seconds one relaxation may take (%(default)s)")
    e.add_argument("--no-plots", action="store_true",
                   help="no pLDDT / PAE / MSA-coverage PNGs")


def add_work_queue_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the leased work queue the processes of a run share (issue 45)."""
    from protdp.workqueue import DEFAULT_LEASE_S

    w = p.add_argument_group("work queue (every process / rank of a run shares it)")
    w.add_argument("--work-queue-url", default=os.environ.get("PROTDP_WORK_QUEUE_URL"),
                   help="postgresql:// (e.g. the review queue's server) for ranks on several "
                        "nodes, or a SQLite file (default OUT/.summary_parts/work_queue.sqlite, "
                        "one node)")
    w.add_argument("--lease-seconds", type=float, default=DEFAULT_LEASE_S,
                   help="a claimed target whose process stops renewing its lease for this "
                        "long (killed, node lost) is claimed again (%(default)s)")
    w.add_argument("--prefetch", type=int, default=None, metavar="N",
                   help="worker processes preparing the next target's MSA and features while "
                        "the model predicts (default: 1 on CUDA, 0 on a CPU, where they "
                        "would share the cores)")
    w.add_argument("--status", metavar="OUT", default=None,
                   help="print the run in OUT: done / running (rank, host, pid, since) / left / "
                        "failed, and exit (no other flag needed)")


def print_status(argv: list[str] | None) -> int | None:
    """`protdp predict --status OUT [--work-queue-url URL]`: None when --status is not given."""
    p = argparse.ArgumentParser(prog="protdp predict", add_help=False)
    add_work_queue_arguments(p)
    args, _ = p.parse_known_args(argv)
    if args.status is None:
        return None
    from protdp.inference.work import default_queue_url
    from protdp.workqueue import format_status, run_status

    out = Path(args.status)
    if not out.is_dir():
        raise InputError("output folder not found", path=out)
    url = default_queue_url(out, args.work_queue_url)
    if "://" not in url and not Path(url).is_file():
        raise InputError("no prediction run has started in this folder (no work queue)",
                         path=out)
    print(format_status(run_status(url, label=str(out.resolve()))))
    return 0


def expand_checkpoints(paths: list[str]) -> list[str]:
    """A folder holding `model_1`, `model_2`, ... checkpoints (AlphaFold's five, imported with
    `protdp weights import`) stands for all of them, in order; anything else as given."""
    import re

    out = []
    for p in paths:
        folder = Path(p)
        subs = sorted((d for d in folder.iterdir() if re.fullmatch(r"model_\d+(_\w+)?", d.name))
                      if folder.is_dir() else [], key=lambda d: int(d.name.split("_")[1]))
        out += [str(d) for d in subs] or [p]
    return out


def load_checkpoints(paths: list[str], device: str | None) -> list:
    """Multimer checkpoints (`protdp weights import` of params_model_N_multimer_v3.npz, or a
    run fine-tuned on complexes) loaded here (`protdp.inference.multimer_loading`, as
    `protdp release` loads them); anything else as given (the predictor loads it). A multimer
    model makes `protdp predict` read the input as complexes."""
    from protdp.inference.checkpoint import is_multimer_checkpoint

    out = []
    for p in paths:
        if not is_multimer_checkpoint(p):
            out.append(p)
            continue
        import torch

        from protdp.inference.multimer_loading import load_multimer_checkpoint

        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        out.append(load_multimer_checkpoint(p, dev))    # as `protdp release` loads it
    return out


def _gate_policy(args):
    """Gate policy YAML, tightened by calibration reports: `--calibration` (a pLDDT-vs-lDDT
    report or a reviewed calibration from `protdp calibrate --from-reviews`) and, for a kind
    not given explicitly, CHECKPOINT/calibration.json and CHECKPOINT/review_calibration.json
    when present. Calibrations only tighten; the policy's `calibrations` (path, sha256, what
    changed) are recorded in provenance.json with the rest of the policy."""
    from protdp.gating import load_calibrated_policy, load_gate_policy
    from protdp.gating.policy import (CALIBRATION_FORMAT, REVIEWED_CALIBRATION_FORMAT,
                                      read_calibration_report)
    from protdp.inference.checkpoint import checkpoint_home

    policy = load_gate_policy(args.gating)
    reports = []
    if args.calibration is not None:
        reports.append(Path(args.calibration))
    given = {read_calibration_report(p)["format"] for p in reports}
    home = checkpoint_home(args.checkpoint[0])
    for name, kind in (("calibration.json", CALIBRATION_FORMAT),
                       ("review_calibration.json", REVIEWED_CALIBRATION_FORMAT)):
        if kind not in given and (home / name).is_file():
            reports.append(home / name)
    for path in reports:
        before = policy
        policy = load_calibrated_policy(path, policy)
        if policy is before:
            print(f"protdp predict: {path} changes nothing (too few reviews)")
            continue
        print(f"protdp predict: gate threshold mean pLDDT >= {policy.accept_mean_plddt:g} "
              f"(calibrated: {path}); very-low fraction <= {policy.max_very_low_fraction:g}, "
              f"MSA depth >= {policy.min_msa_depth}")
        if (policy.min_iptm, policy.max_interface_pae, policy.min_ipsae) != (
                before.min_iptm, before.max_interface_pae, before.min_ipsae):
            print(f"protdp predict: complexes: ipTM >= {policy.min_iptm:g}, interface PAE <= "
                  f"{policy.max_interface_pae:g} Å, ipSAE >= {policy.min_ipsae:g} "
                  f"(calibrated: {path})")
    return policy


def _claimed_search(args, config: PredictConfig, multimer: bool):
    """--db: the MSA search run for each target when a process claims it
    (`claimed_search`). Returns (msa_dir, msa_search provenance or None, ClaimedSearch or
    None); without --db: (--msa-dir, None, None)."""
    if not args.db:
        return args.msa_dir, None, None
    from protdp.inference.claimed_search import prepare_search
    from protdp.msa.cli import settings_from_args

    if multimer and args.msa_dir:
        raise ConfigError("complexes: give --msa-dir (precomputed `protdp msa search "
                          "--complexes`) or --db (search here), not both")
    if args.msa_dir and not Path(args.msa_dir).is_dir():
        raise InputError("MSA directory not found", path=args.msa_dir)
    search_dir = Path(args.msa_search_dir) if args.msa_search_dir else Path(args.out) / "msa_search"
    search, provenance = prepare_search(
        args.db, search_dir, settings_from_args(args), user_dir=args.msa_dir,
        workers=args.workers, max_length=config.max_length,
        max_unknown_fraction=config.max_unknown_fraction,
        complexes_fasta=args.fasta if multimer else None)
    # complexes read the searched chains' folders; monomers their own MSAs, else the searched
    return (search.search_dir if multimer else args.msa_dir), provenance, search


def main(argv: list[str] | None = None) -> int:
    status = print_status(argv if argv is not None else sys.argv[1:])
    if status is not None:
        return status
    args = build_parser().parse_args(argv)
    # a typo: one line, and no empty --out folder left behind
    if not os.path.lexists(args.fasta):
        raise InputError("file not found", path=args.fasta)
    for path in args.checkpoint:
        if not os.path.lexists(path):
            raise InputError("checkpoint not found", path=path)
    writable_folder(args.out, "output folder (--out)")   # one clear line before any work
    config = _predict_config(args)
    _work_queue(args)                        # a bad --lease-seconds before any work
    from protdp.parallel.env import detect_launch_env

    launch = detect_launch_env()
    if launch.local_world_size < launch.world_size and not args.work_queue_url \
            and launch.rank == 0:     # SQLite's locks are not reliable over network file systems
        print("protdp predict: warning: ranks on several nodes share the SQLite work queue in "
              "--out; give --work-queue-url postgresql://... (e.g. the review queue's server)",
              file=sys.stderr)
    if args.dap_size < 1 or launch.world_size % args.dap_size:
        raise ConfigError(f"--dap-size {args.dap_size}: must be >= 1 and divide the world size "
                          f"{launch.world_size}")
    device, barrier = args.device, None
    if args.dap_size > 1:
        return _main_dap(args, config, launch)
    if launch.world_size > 1:
        device, barrier = _join_ranks(args, launch, device)
    args.checkpoint = expand_checkpoints(args.checkpoint)
    gating = _gate_policy(args)
    try:
        checkpoints = load_checkpoints(args.checkpoint, device)
        multimer = any(not isinstance(c, str) for c in checkpoints)
        msa_dir, msa_search, search = _claimed_search(args, config, multimer)
        result = predict(checkpoints, args.fasta, args.out, msa_dir=msa_dir,
                         msa_search=msa_search, claimed_search=search,
                         config=config, gating=gating, screening=args.screening,
                         queue_url=args.queue_url, rank=launch.rank,
                         world_size=launch.world_size, barrier=barrier, device=device,
                         progress=not args.no_progress, templates=tuple(args.template),
                         release_gate="review" if args.allow_unreleased else "enforce",
                         sort_by_length=args.sort_queries_by_length, **_work_queue(args))
    finally:
        if barrier is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    if launch.rank == 0:
        c = result.counts
        print(f"protdp predict: {len(result.rows)} targets: {c['accepted']} accepted, "
              f"{c['needs_review']} need review, {c['rejected']} rejected "
              f"({result.skipped} already complete, skipped); summary: {result.summary_path}")
        if c["needs_review"]:
            print("review the flagged predictions with:\n" + review_commands(result.queue_url))
    return 0


def _predict_config(args) -> PredictConfig:
    """PredictConfig from the flags; a bad value is one ConfigError line."""
    try:
        config = PredictConfig(max_length=args.max_length, max_msa_rows=args.max_msa_rows,
                               num_recycles=args.num_recycles, seed=args.random_seed,
                               num_seeds=args.seeds, msa_mode=args.msa_mode,
                               pair_mode=args.pair_mode,
                               recycle_early_stop_tolerance=args.recycle_early_stop_tolerance,
                               stop_at_score=args.stop_at_score, max_memory_gib=args.max_memory,
                               save_distogram=args.save_distogram, plots=not args.no_plots,
                               relax=args.relax, relax_timeout_s=args.relax_timeout,
                               bf16=args.bf16, batch_seeds=args.batch_seeds)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return config


def _join_ranks(args, launch, device):
    """Several ranks: gloo only for the end-of-run barrier (prediction needs no collectives);
    -> (device, barrier)."""
    import torch
    import torch.distributed as dist

    from protdp.parallel.env import init_distributed

    # prediction needs no collectives: gloo only for the end-of-run barrier
    init_distributed(timeout=args.dist_timeout_minutes * 60.0, backend="gloo")

    def dist_barrier():
        try:
            dist.barrier()
        except RuntimeError as exc:
            raise DistributedError(f"rank {launch.rank}: barrier(predict summary) failed: "
                                   f"{exc}") from None

    barrier = dist_barrier
    if device is None and torch.cuda.is_available():
        device = f"cuda:{launch.local_rank}"
    return device, barrier


def _work_queue(args) -> dict:
    """predict()'s work-queue keywords from the flags."""
    from protdp.inference.work import default_queue_url

    if not args.lease_seconds > 0:
        raise ConfigError(f"--lease-seconds {args.lease_seconds:g}: must be > 0")
    if args.prefetch is not None and args.prefetch < 0:
        raise ConfigError(f"--prefetch {args.prefetch}: must be >= 0")
    prefetch = args.prefetch
    if prefetch is None:
        import torch
        prefetch = 1 if (args.device or ("cuda" if torch.cuda.is_available() else "cpu")
                         ).startswith("cuda") else 0
    return {"work_queue_url": default_queue_url(args.out, args.work_queue_url),
            "lease_s": args.lease_seconds, "prefetch_workers": prefetch}


def _main_dap(args, config: PredictConfig, launch) -> int:
    """--dap-size K: leaders (rank 0 of each DAP group) predict their targets, followers join
    every forward (`protdp.inference.dap`); only leaders write."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from protdp.inference.checkpoint import load_model_checkpoint
    from protdp.inference.dap import LeaderModel, follow
    from protdp.parallel.env import init_distributed
    from protdp.parallel.groups import build_groups

    from protdp.inference.checkpoint import is_multimer_checkpoint

    checkpoints = expand_checkpoints(args.checkpoint)
    if any(is_multimer_checkpoint(c) for c in checkpoints):
        raise ConfigError(f"--dap-size {args.dap_size}: multimer checkpoints (complexes) run "
                          "without DAP for now; leave --dap-size at 1")
    if len(checkpoints) != 1:
        raise ConfigError(f"--dap-size {args.dap_size} runs one checkpoint at a time; got "
                          f"{len(checkpoints)} (run the ensemble members one after another)")
    init_distributed(timeout=args.dist_timeout_minutes * 60.0)   # NCCL for CUDA tensors
    groups = build_groups(args.dap_size)
    device = args.device or (f"cuda:{launch.local_rank}" if torch.cuda.is_available() else "cpu")
    gating = _gate_policy(args)
    loaded = load_model_checkpoint(checkpoints[0], device=device)
    loaded.trunk_config.bf16 |= config.bf16     # --bf16 on every rank of the DAP group alike
    loaded.model.set_axial_comm(groups.axial_comm())
    leader = dist.get_global_rank(groups.dap_group, 0)
    if groups.dap_rank != 0:
        try:
            follow(loaded.model, groups.dap_group, leader, torch.device(device))
            dist.barrier()
        finally:
            dist.destroy_process_group()
        return 0
    model = LeaderModel(loaded.model, groups.dap_group, leader)
    state = {"stopped": False, "synced": False}

    def barrier():
        if not state["stopped"]:
            state["stopped"] = True
            model.stop()
        state["synced"] = True
        dist.barrier()

    try:
        msa_dir, msa_search, search = _claimed_search(args, config, False)
        result = predict(dataclasses.replace(loaded, model=model), args.fasta, args.out,
                         msa_dir=msa_dir, msa_search=msa_search, claimed_search=search,
                         config=config, gating=gating,
                         screening=args.screening, queue_url=args.queue_url, rank=groups.dp_rank,
                         world_size=groups.dp_size, barrier=barrier, device=device,
                         progress=not args.no_progress,
                         release_gate="review" if args.allow_unreleased else "enforce",
                         **_work_queue(args))
    finally:
        if not state["synced"]:      # an error: release the followers, then leave together
            barrier()
        dist.destroy_process_group()
    if launch.rank == 0:
        c = result.counts
        print(f"protdp predict: {len(result.rows)} targets on dp {groups.dp_size} x dap "
              f"{groups.dap_size} ranks: {c['accepted']} accepted, {c['needs_review']} need "
              f"review, {c['rejected']} rejected; summary: {result.summary_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
