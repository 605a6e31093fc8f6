"""Batch structure prediction behind the confidence gate (AF2 supplement Algorithm 2 at
inference: no BERT masking, no crop, `num_recycles` recycling passes, EMA weights).

Per target (targets sharded over data-parallel ranks by index: rank r takes i % world == r):

    validate id/sequence/length -> find + parse MSA (depth cap) -> screening list
    -> model -> gate.route -> write PDB + mmCIF (pLDDT as B-factor) and scores.json
    -> flagged: handed to the review sink -> provenance.json (written last: the completion mark)

A target whose provenance.json matches the current inputs (checkpoint, sequence, MSA files,
settings, gate policy, screening list: one `fingerprint`) is skipped on a re-run. A bad target
(any `ProtdpError`, or running out of memory) is recorded as `rejected` with its reason and
the batch goes on. Nothing flagged can reach a user unreviewed: flagged predictions are handed
to the sink (`ReviewSink`; `protdp.workflows` wires it to the review queue) before they are
marked complete, and a sink failure stops the batch. This package never imports the review
store.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from protdp import __version__
from protdp.config import to_dict
from protdp.data.bounds import check_predict_bounds
from protdp.data.msa_passes import query_features
from protdp.templates.inputs import target_template_files, template_names, template_provider
from protdp.data.residues import GAP_ID
from protdp.data.screening import ScreeningList
from protdp.errors import ConfigError, InputError, ProtdpError
from protdp.gating import GateDecision, GatePolicy, load_gate_policy, route
from protdp.gating.release import weaker_thresholds
from protdp.inference.checkpoint import LoadedModel, checkpoint_home, sha256_file
from protdp.inference.complex_features_input import check_unchanged
from protdp.inference.targets import (Target, clean_sequence, find_msa_files, load_msa,
                                      sha256_text)
from protdp.inference.complexes import (COMPLEX_HINT, COMPLEX_SCORE_KEYS, complex_inputs,
                                       interface_rows,
                                       is_complex_record, run_complex_ensemble)
from protdp.inference.model_names import describe_members
from protdp.inference.scores_json import prediction_scores
from protdp.inference.ensemble import run_ensemble
from protdp.inference.layout import (current_prediction, prediction_id,
                                     publish_build, set_aside_damaged, start_build,
                                     write_current)
from protdp.inference.prediction_files import write_prediction_files
from protdp.inference.ranking import ensemble_spread, rank, split_failed
from protdp.inference.records import PENDING_FILE, completed_record, intact_pending, item_paths
from protdp.inference.recycling import RecycleEarlyStop
from protdp.inference.writers import round_plddt, write_json
from protdp.model.attention import backend_report
from protdp.train.release_record import read_release

CLINICAL_NOTICE = ("Computational prediction for research use. NOT for clinical or diagnostic "
                   "decisions without review by a qualified person; see the gate route and reasons.")
TARGETS_DIR = "targets"
MSA_MODES = ("auto", "single_sequence")
BATCH_SEEDS = ("auto", "always", "never")
PARTS_DIR = ".summary_parts"
# settings added after prediction folders were first written: at these values they are left out
# of the fingerprint, so a rerun over an older folder with the setting off skips it, not redoes it
LATER_SETTINGS = {"bf16": False, "pair_mode": "unpaired_paired", "batch_seeds": "auto"}


@dataclass
class PredictConfig:
    """Predictor settings (recorded in provenance and part of the resume fingerprint)."""

    max_length: int = 1024
    """Targets longer than this are rejected (--max-length)."""
    max_msa_rows: int = 512
    """MSA depth cap: rows given to the model, query first (AF2 N_clust 512 at inference)."""
    max_unknown_fraction: float = 0.5
    """Reject sequences with a larger fraction of unknown residues (X, B, Z, ...)."""
    max_extra_msa_rows: int = 5120
    """Extra-MSA rows for models with the extra-MSA stack (AF2 inference: 5120)."""
    masked_msa_fraction: float = 0.15
    """MSA positions BERT-masked at inference, as AlphaFold's own inference does (0.15)."""
    num_recycles: int | None = None
    """Recycling passes (None: the checkpoint's model config); each pass gets its own MSA
    sample, as AF2's resample_msa_in_recycling."""
    seed: int = 0
    """Seed of the MSA sampling and masking (deterministic for a given seed); --random-seed."""
    num_seeds: int = 1
    """Predictions per checkpoint, seeds `seed .. seed + num_seeds - 1` (--seeds)."""
    recycle_early_stop_tolerance: float | None = None
    """Stop recycling when the Cα distance matrix changes less than this (Å, ColabFold)."""
    stop_at_score: float | None = None
    """Stop recycling, and the ensemble, once the mean pLDDT reaches this (ColabFold)."""
    max_memory_gib: float | None = None
    """Memory budget of one prediction: the chunk size is chosen to fit it (--max-memory)."""
    msa_mode: str = "auto"
    """"auto": the target's MSA files when found; "single_sequence": never an MSA."""
    pair_mode: str = "unpaired_paired"
    """Complexes: MSA rows given to AlphaFold-Multimer (`protdp.complex.pair_modes`)."""
    save_distogram: bool = False
    """Keep the distogram logits in result_*.npz (--save-distogram)."""
    relax: bool = False
    """Amber-relax the top-ranked model (`protdp.relax`, needs the `relax` extra): written as
    relaxed_<model>.pdb next to the unrelaxed files; a failure is reported, never fatal."""
    relax_timeout_s: float = 300.0
    """Time bound of one relaxation (--relax-timeout)."""
    plots: bool = True
    """Write the pLDDT / PAE / MSA-coverage PNGs (--no-plots: ~1 s less per target on CPU)."""
    bf16: bool = False
    """Run every model's trunk under bf16 autocast (--bf16; the model config's `bf16`, a
    multimer's `trunk.bf16`): structure module, heads and confidences stay fp32
    (`protdp.model.precision`). A checkpoint whose config already sets it runs bf16 anyway."""
    batch_seeds: str = "auto"
    """--seeds N as one batch when memory allows (`ensemble.seed_groups`): "auto" on CUDA
    only (on a CPU one batch was measured slower), "always", or "never" (--batch-seeds)."""

    def __post_init__(self):
        if isinstance(self.num_seeds, bool) or not isinstance(self.num_seeds, int) \
                or self.num_seeds < 1:
            raise ValueError(f"num_seeds must be a positive integer, got {self.num_seeds!r}")
        if self.msa_mode not in MSA_MODES:
            raise ValueError(f"msa_mode must be one of {MSA_MODES}, got {self.msa_mode!r}")
        if self.batch_seeds not in BATCH_SEEDS:
            raise ValueError(f"batch_seeds must be one of {BATCH_SEEDS}, got {self.batch_seeds!r}")
        if self.max_memory_gib is not None and not self.max_memory_gib > 0:
            raise ValueError(f"max_memory_gib must be > 0, got {self.max_memory_gib!r}")
        RecycleEarlyStop(self.recycle_early_stop_tolerance, self.stop_at_score)   # validates
        if not 0.0 <= self.masked_msa_fraction <= 1.0:
            raise ValueError(f"masked_msa_fraction must be in [0, 1], got {self.masked_msa_fraction}")
        if isinstance(self.max_extra_msa_rows, bool) or not isinstance(self.max_extra_msa_rows, int) \
                or self.max_extra_msa_rows < 0:
            raise ValueError(f"max_extra_msa_rows must be a non-negative integer, got "
                             f"{self.max_extra_msa_rows!r}")
        for name in ("max_length", "max_msa_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not 0.0 <= self.max_unknown_fraction <= 1.0:
            raise ValueError(f"max_unknown_fraction must be in [0, 1], got {self.max_unknown_fraction}")
        if self.num_recycles is not None and (not isinstance(self.num_recycles, int)
                                              or self.num_recycles < 0):
            raise ValueError(f"num_recycles must be a non-negative integer or null, got {self.num_recycles!r}")
        check_predict_bounds(self.seed, self.num_seeds, self.num_recycles)   # issue 47


@dataclass
class RunResult:
    """What one `predict` call did (rows: every target of the FASTA when merged on rank 0,
    else this rank's shard)."""

    out_dir: Path
    rows: list[dict]
    queue_url: str
    summary_path: Path | None
    counts: dict = field(default_factory=dict)
    skipped: int = 0


def _code_version() -> dict:
    from protdp.train.checkpointing import code_version
    return code_version()


def msa_coverage(msa, length: int) -> list[int]:
    """Rows of the MSA with a residue (not a gap) at each query position [L] (1 without MSA)."""
    if msa is None:
        return [1] * length
    return (msa.tokens() != GAP_ID).sum(axis=0).astype(int).tolist()


def input_files(t: Target, paths: list[Path], digests: list[str] | None = None) -> list[dict]:
    """[{"path", "sha256"}] of the input files a target was predicted from: `digests` of the
    bytes loaded where the loader hashed them (a precomputed complex's features.npz, read once:
    `complex_features_input.features_inputs`), else hashed after they were read. A features.npz
    must still be the bytes hashed at start-up (`check_unchanged`)."""
    if digests is None:
        digests = [sha256_file(p) for p in paths]
    check_unchanged(t, digests, paths[0] if paths else None)
    return [{"path": str(p), "sha256": d} for p, d in zip(paths, digests)]


def check_template_files(hashed: list[dict], record: dict) -> None:
    """The template files parsed (`record["files"]`, digests of the bytes read) must be those
    hashed into the prediction's identity."""
    check_parsed(hashed, {f["path"]: f["sha256"] for f in record.get("files", [])})


def check_msa_files(hashed: list[dict], paths: list[Path], msa) -> None:
    """The MSA files parsed (`Msa.file_sha256`, digests of the bytes read; possibly in a
    prefetch worker, before the identity was computed) must be those hashed into it."""
    check_parsed(hashed, {} if msa is None else dict(zip(map(str, paths), msa.file_sha256)))


def check_parsed(hashed: list[dict], parsed: dict[str, str]) -> None:
    """{path: sha256} of the bytes a target was parsed from must equal the digests in its
    identity (`hashed`); a file changed in between is this target's error, never a prediction
    recorded under bytes it was not made from."""
    want = {f["path"]: f["sha256"] for f in hashed}
    for path in sorted(set(parsed) | set(want)):
        if parsed.get(path) != want.get(path):
            raise InputError(f"changed since this target's identity was computed (sha256 "
                             f"{str(want.get(path))[:12]}, parsed {str(parsed.get(path))[:12]})"
                             ": run again", path=path)


RELEASE_GATES = ("enforce", "review", "off")


class ReviewSink(Protocol):
    """Where flagged predictions go. `enqueue` is idempotent per `prediction_id` and returns
    the review item id (`rebind`: the files were just written by this run, so an item bound to
    other bytes is replaced: `protdp.review.enqueue`); `display` names the destination in
    provenance (no secrets)."""

    display: str

    def enqueue(self, prediction_id: str, target: str, scores: dict, paths: dict,
                reasons: list[str], *, details: dict, actor: str, rebind: bool = False) -> int: ...

    def close(self) -> None: ...


class NoReviewSink:
    """Refuses every flagged prediction: a batch without a review destination stops at the
    first prediction that needs review instead of marking it complete unreviewed."""

    display = "<none>"

    def enqueue(self, prediction_id, target, scores, paths, reasons, *, details, actor,
                rebind=False) -> int:
        raise ConfigError(f"target {target!r} needs review but no review sink is configured")

    def close(self) -> None:
        pass


class Predictor:
    """Holds the models (an ensemble: one or more checkpoints), gate policy, screening list and
    review sink for a batch."""

    def __init__(self, loaded: LoadedModel | list[LoadedModel], out_dir: str | Path, *,
                 config: PredictConfig | None = None, policy: GatePolicy | None = None,
                 screening: ScreeningList | None = None, screening_path: str | Path | None = None,
                 sink: ReviewSink | None = None, device: str | torch.device = "cpu",
                 release_gate: str = "enforce",
                 rank: int = 0, world_size: int = 1, msa_search: dict | None = None,
                 templates: tuple[str, ...] = ()):
        self.models = list(loaded) if isinstance(loaded, (list, tuple)) else [loaded]
        if not self.models:
            raise ConfigError("predict needs at least one checkpoint")
        self.loaded = self.models[0]
        self.member_names = describe_members(self.models)   # AlphaFold / ColabFold names
        self.device = torch.device(device)
        for m in self.models:
            if next(m.model.parameters()).device != self.device:
                raise ConfigError(f"model is on {next(m.model.parameters()).device}, "
                                  f"predictor on {self.device}: load it with device={device!r}")
            m.model.eval()
        self.model = self.loaded.model
        self.config = config or PredictConfig()
        # --bf16: the trunks the flag switches on, switched back by close()
        self._bf16_switched = [m.trunk_config for m in self.models
                               if self.config.bf16 and not m.trunk_config.bf16]
        for trunk in self._bf16_switched:
            trunk.bf16 = True
        self.policy = policy or load_gate_policy()
        self.screening = screening
        self.screening_sha = sha256_file(screening_path) if screening_path else None
        self.screening_path = str(screening_path) if screening_path else None
        self.out_dir = Path(out_dir).resolve()
        self.targets_dir = self.out_dir / TARGETS_DIR
        if self.targets_dir.is_symlink():
            raise ConfigError(f"{self.targets_dir} is a symbolic link; protdp never writes "
                              "through a link in its output folder: remove it")
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.sink = sink if sink is not None else NoReviewSink()
        # issue 45: inputs prepared ahead in worker processes (`prefetch.FeaturePrefetcher`)
        self.msa_loader, self.feature_cache = load_msa, None
        self.forced_reasons, releases = {}, []
        for m in self.models:
            record, forced = self._check_release(release_gate, m)
            releases.append(record)
            self.forced_reasons.update(forced)
        self.release = releases[0] if len(releases) == 1 else releases
        self.rank, self.world_size = rank, world_size
        self._code = _code_version()
        shas = [m.sha256 for m in self.models]
        self.settings = {"predict": to_dict(self.config), "gate_policy": to_dict(self.policy),
                         "release": self.release,
                         "screening_list_sha256": self.screening_sha,
                         "checkpoint_sha256": shas[0] if len(shas) == 1 else shas}
        # one digest for the review item: the checkpoint's, or of the ensemble's list
        self.checkpoints_digest = shas[0] if len(shas) == 1 else hashlib.sha256(
            "\n".join(shas).encode()).hexdigest()
        if msa_search is not None:   # databases (sha256) and settings of `protdp msa search`
            self.settings["msa_search"] = msa_search
        # issue 31: template inputs for the members with a template module (AlphaFold's
        # model_1/2 of the five); None when no member has one (--template is then an error)
        self.multimer = self.loaded.is_multimer
        if any(m.is_multimer != self.multimer for m in self.models):
            raise ConfigError("an ensemble mixes monomer and multimer checkpoints; run them "
                              "as two batches")
        if self.multimer and templates:
            raise ConfigError("--template is not supported for complexes yet")
        with_templates = [m for m in self.models if m.config.templates]
        self.templates = None if self.multimer else template_provider(
            (with_templates or self.models)[0].config, templates)
        self.template_loader = None if self.templates is None else self.templates.for_target
        if templates:   # custom templates: their bytes are part of the prediction's identity
            self.settings["templates"] = [   # the bytes every target parses (read once)
                {"spec": f.spec, "sha256": f.sha256} for f in self.templates.files]

    def _check_release(self, gate: str, loaded: LoadedModel) -> tuple[dict, dict]:
        """The checkpoint's release record under `gate`: "enforce" refuses an unreleased
        checkpoint, "review" runs it with every prediction sent to review, "off" (evaluation
        tools: red-team) does not look. Returns (provenance entry, forced gate reasons)."""
        if gate not in RELEASE_GATES:
            raise ConfigError(f"release_gate={gate!r}: expected one of {RELEASE_GATES}")
        if gate == "off":
            return {"gate": "off", "released": None}, {}
        status = read_release(checkpoint_home(loaded.path), loaded.sha256,
                              floor=weaker_thresholds,     # the site's policy is a floor
                              multimer=loaded.is_multimer)
        record = {"gate": gate, **status.to_dict()}
        if status.released:
            return record, {}
        reason = status.reason          # monomer and multimer checkpoints alike
        if gate == "enforce":
            raise ConfigError(f"checkpoint {loaded.path} is not released: {reason}; "
                              "pass --allow-unreleased to run it anyway (every prediction then "
                              "goes to review)")
        return record, {"unreleased_checkpoint": reason}

    def close(self) -> None:
        self.sink.close()
        for trunk in self._bf16_switched:
            trunk.bf16 = False

    # -- one target ------------------------------------------------------------------------
    def fingerprint(self, seq_sha: str, msa_files: list[dict],
                    template_files: list[dict] = ()) -> str:
        """The prediction's identity: settings, sequence, the MSA files' bytes and the target's
        searched template files' bytes (left out when there are none, so older runs keep theirs)."""
        predict = {k: v for k, v in self.settings["predict"].items()
                   if k not in LATER_SETTINGS or v != LATER_SETTINGS[k]}
        doc = {"settings": {**self.settings, "predict": predict}, "sequence_sha256": seq_sha,
               "msa": [m["sha256"] for m in msa_files]}
        if template_files:
            doc["template_files"] = [m["sha256"] for m in template_files]
        return sha256_text(json.dumps(doc, sort_keys=True))

    def target_template_files(self, t: Target, fasta: dict) -> list[dict]:
        """[{"path", "sha256"}] of the templates.npz / templates.json a target's templates are
        read from (none with --template or a template-free checkpoint)."""
        if self.templates is None or self.templates.specs:
            return []
        return [{"path": str(p), "sha256": sha256_file(p)}
                for p in target_template_files(fasta["msa_dir"], t.file_name)]

    def features(self, sequence: str, msa, family_id: str = "query", *,
                 seed: int | None = None, loaded: LoadedModel | None = None) -> dict:
        """The model's inputs for one target under this predictor's settings (one MSA sample
        per recycling pass, AF2's inference masking; pass i's built when the model reaches it,
        `protdp.data.msa_passes`, so memory does not grow with the recycles)."""
        c, loaded = self.config, loaded or self.loaded
        passes = (c.num_recycles if c.num_recycles is not None else loaded.config.num_recycles) + 1
        return query_features(sequence, msa, max_msa_rows=c.max_msa_rows,
                              seed=c.seed if seed is None else seed,
                              family_id=family_id, max_extra_msa_rows=c.max_extra_msa_rows,
                              msa_samples=passes, masked_msa_fraction=c.masked_msa_fraction)

    def _run_ensemble(self, seq: str, msa, family_id: str, forward=None,
                      template_inputs: dict | None = None) -> tuple[dict, dict]:
        """Every (model, seed) prediction -> ({name: prediction}, timings.json), seeds batched
        when memory allows (`ensemble.run_ensemble`)."""
        return run_ensemble(self, seq, msa, family_id, forward, template_inputs)

    def predict_target(self, t: Target, fasta: dict, forward=None) -> dict:
        """Predict (every member of the ensemble), rank, gate, write and (if flagged) enqueue
        one target; returns its summary row. `forward` replaces the model call (tests)."""
        row = {"index": t.index, "target": t.target_id, "file_name": t.file_name, "line": t.line,
               "length": None, "route": "rejected", "reasons": ["invalid_input"],
               "mean_plddt": None, "band": None, "ptm": None, "msa_depth": None, "status": "rejected",
               "detail": "", "paths": {}}
        try:
            if t.error:
                raise InputError(t.error)
            built = None
            if "complex" in t.extra or "features_npz" in t.extra:   # AlphaFold-Multimer inputs
                msa_dir = None if self.config.msa_mode == "single_sequence" else fasta["msa_dir"]
                built = complex_inputs(t, msa_dir,
                                       max_length=self.config.max_length,
                                       max_unknown_fraction=self.config.max_unknown_fraction,
                                       pair_mode=self.config.pair_mode)
                seq = "".join(s for _, s in built["chains"])
                row["length"] = len(seq)
                msa_paths = built["files"]
            elif is_complex_record(t.raw_sequence):
                raise InputError(f"target '{t.target_id}' {COMPLEX_HINT}", path=t.extra.get(
                    "source"), line=t.line)
            else:
                seq, msa_paths = self._monomer_inputs(t, fasta)
                row["length"] = len(seq)
            msa_files = input_files(t, msa_paths, (built or {}).get("sha256s"))
            template_files = [] if built else self.target_template_files(t, fasta)
            fp = self.fingerprint(sha256_text(t.raw_sequence if built else seq), msa_files,
                                  template_files)
            tdir = self.targets_dir / t.file_name
            pid = prediction_id(fp)
            pdir = tdir / pid
            for own in (tdir, pdir):    # planted links: never written through nor trusted
                if own.is_symlink():
                    raise InputError("is a symbolic link; protdp never writes through (or "
                                     "trusts) a link in its output folder: remove it", path=own)
            done = completed_record(pdir, fp)
            if done is None and pdir.exists():
                if intact_pending(pdir, fp):
                    return self._finish_pending(t, tdir, pdir, fp)
                set_aside_damaged(pdir)
            if done is None and built is not None:
                t0 = time.perf_counter()
                hits = self.screening.hits(seq) if self.screening is not None else []
                preds, timings = run_complex_ensemble(self.models, built["features"], self.device,
                                                      self.config, self.member_names)
                timings["features"] = round(time.perf_counter() - t0 - sum(timings.values()), 3)
                msa_depth, coverage, template_record = built["msa_depth"], built["coverage"], None
            elif done is None:
                t0 = time.perf_counter()
                msa = self.msa_loader(msa_paths)
                check_msa_files(msa_files, msa_paths, msa)
                msa_depth = 1 if msa is None else msa.depth
                hits = self.screening.hits(seq) if self.screening is not None else []
                template_inputs, template_record = None, None
                if self.templates is not None:
                    template_inputs, template_record = self.template_loader(
                        seq, fasta["msa_dir"], t.file_name)
                    check_template_files(template_files, template_record)
                preds, timings = self._run_ensemble(seq, msa, t.file_name, forward,
                                                    template_inputs)
                timings["features"] = round(time.perf_counter() - t0 - sum(
                    v for k, v in timings.items()), 3)
                coverage = msa_coverage(msa, len(seq))
        except (ProtdpError, MemoryError, torch.OutOfMemoryError) as exc:
            row["detail"] = str(exc) if isinstance(exc, ProtdpError) else f"out of memory: {exc}"
            decision = route(np.zeros(0), length=0, msa_depth=0, training_crop=None,
                             invalid_reason=row["detail"], policy=self.policy)
            row["gate"] = decision.to_dict()
            return row

        if done is not None:
            return self._skip(t, tdir, pdir, fp, done)
        return self._finish(t, seq, tdir, pid, fp, fasta, msa_files, msa_depth, hits, preds,
                            timings, coverage, row, template_record, built)

    def _monomer_inputs(self, t: Target, fasta: dict) -> tuple[str, list[Path]]:
        """The validated sequence and MSA files of a single-chain target."""
        if self.multimer:
            raise InputError(f"target '{t.target_id}' is a single chain: predict it with a "
                             "monomer checkpoint")
        try:
            seq = clean_sequence(t.raw_sequence, max_length=self.config.max_length,
                                 max_unknown_fraction=self.config.max_unknown_fraction)
        except InputError as exc:
            if exc.path is not None or "source" not in t.extra:
                raise
            raise InputError(exc.reason, path=t.extra["source"], line=t.line,
                             field=exc.field) from None
        if self.config.msa_mode == "single_sequence":
            return seq, []
        if "msa_files" in t.extra:
            return seq, [Path(p) for p in t.extra["msa_files"]]
        return seq, find_msa_files(fasta["msa_dir"], t.file_name)

    def _skip(self, t: Target, tdir: Path, pdir: Path, fp: str, done: dict) -> dict:
        """A prediction completed by an earlier run: its recorded row (flagged ones re-enqueued,
        idempotently, in case --queue-url changed). Queue errors propagate: they stop the batch
        instead of turning a flagged prediction into a 'rejected' row."""
        row = {**done["summary"], "index": t.index, "status": "skipped"}
        if row["route"] == "needs_review":
            scores = json.loads((pdir / "scores.json").read_text())
            row["review_item"] = self._enqueue(t, fp, scores, item_paths(row["paths"], pdir))
        if current_prediction(tdir) != pdir:
            write_current(tdir, pdir.name)
        return row

    def _enqueue(self, t: Target, fp: str, scores: dict, paths: dict, rebind: bool = False) -> int:
        """Hand a flagged prediction to the review sink (same prediction id -> same item) with
        every file of its folder; `rebind`: this run wrote them (a damaged folder predicted
        again replaces its item, bound to bytes that are gone)."""
        keep = ("sequence", "plddt", "mean_plddt", "afdb_bands", "band", "very_low_fraction", "ptm",
                "msa_depth", "msa_rows_used", "msa_coverage", "length", "num_recycles", "ensemble",
                *COMPLEX_SCORE_KEYS)
        return self.sink.enqueue(f"{t.file_name}:{fp[:16]}", t.target_id,
                                  {**{k: scores[k] for k in keep if k in scores},
                                   "checkpoint_sha256": self.checkpoints_digest},  # queue binds it
                                  paths, scores["reasons"],
                                  details=scores["details"], actor="predictor", rebind=rebind)

    def _finish(self, t, seq, tdir, pid, fp, fasta, msa_files, msa_depth, hits, preds, timings,
                coverage, row, template_record=None, built=None):
        """Rank, gate and write the prediction folder (built hidden, renamed into place), then
        enqueue and mark it complete (`_complete_published`). `built`: a complex's inputs
        (`complexes.complex_inputs`): chains in the files, ipTM / interface PAE in the gate."""
        preds, failed = split_failed(preds)       # a NaN member is failed, the rest ranked
        order, ranking_debug = rank(preds)
        if failed:
            ranking_debug["failed_members"] = failed
        spread = ensemble_spread(preds, order) if len(preds) > 1 else None
        top = preds[order[0]]
        finite_xyz = np.isfinite(top["positions"]).all(axis=(-1, -2))             # [L]
        plddt = round_plddt(top["plddt"])
        plddt[~finite_xyz] = np.nan   # no position, no confidence: the gate flags invalid_plddt
        decision = self._decide(seq, plddt, msa_depth, hits, spread, template_record, built, top)
        build = start_build(tdir, pid)
        outputs = self._write_files(build, t, seq, preds, order, ranking_debug, timings,
                                    coverage, msa_files, built)
        scores = prediction_scores(t, seq, preds, order, decision, plddt, finite_xyz,
                                   spread=spread, hits=hits, msa_depth=msa_depth,
                                   coverage=coverage, bf16=self.loaded.trunk_config.bf16,
                                   built=built)
        write_json(build / "scores.json", scores)
        outputs["scores"] = "scores.json"
        pdir = tdir / pid
        row.update(route=decision.route, reasons=decision.reasons, mean_plddt=decision.mean_plddt,
                   band=scores["band"], ptm=top.get("ptm"), iptm=top.get("iptm"),
                   chain_pair_iptm=scores.get("chain_pair_iptm"),
                   best_interface=scores.get("best_interface"),
                   msa_depth=msa_depth, model_name=top.get("model_name"),
                   num_recycles=top["num_recycles"], top_model=order[0],
                   ensemble=scores["ensemble"], prediction_id=pid, status="predicted",
                   detail="; ".join(scores["details"].values()),
                   paths={k: str(pdir / v) for k, v in outputs.items()})
        provenance = self._provenance(t, seq, pid, fp, fasta, msa_files, template_record,
                                      decision, outputs, row)
        # the pending record (everything but the review item) travels inside the build, so a
        # crash after the rename is finished by the rerun without redoing the model
        provenance["outputs_sha256"] = {n: sha256_file(build / n) for n in outputs.values()}
        write_json(build / PENDING_FILE, provenance)
        publish_build(build, pdir)
        return self._complete_published(t, tdir, pdir, fp, provenance, scores, rebind=True)

    def _decide(self, seq, plddt, msa_depth, hits, spread, template_record, built,
                top) -> GateDecision:
        """The gate's decision on the top-ranked prediction (`plddt` [L], NaN where the model
        gave no position), with this batch's forced reasons (an unreleased checkpoint)."""
        hit_text = [f"{h.entry} (query {h.query_start + 1}-{h.query_end}, {h.method})"
                    for h in hits]
        return route(plddt, length=len(seq), msa_depth=msa_depth,
                     training_crop=self.loaded.training_crop, screening_hits=hit_text,
                     policy=self.policy, sequence=seq, forced_reasons=self.forced_reasons,
                     ensemble_ca_rmsd=None if spread is None else spread["max_ca_rmsd"],
                     templates=template_names(template_record),
                     interface=None if built is None else
                     {"iptm": top["iptm"], "interface_pae": top["interface_pae"],
                      "interface_scores": interface_rows(built["chains"], top)})

    def _write_files(self, build, t, seq, preds, order, ranking_debug, timings, coverage,
                     msa_files, built) -> dict[str, str]:
        """Every structure / score file of the prediction into the build folder."""
        top = preds[order[0]]
        return write_prediction_files(build, t.file_name, seq, preds, order, ranking_debug,
                                      timings, coverage, self.loaded.trunk_config,
                                      save_distogram=self.config.save_distogram,
                                      plots=self.config.plots, relax=self.config.relax,
                                      relax_timeout_s=self.config.relax_timeout_s,
                                      msa_paths=[m["path"] for m in msa_files],
                                      chains=None if built is None else built["chains"],
                                      records={"A": {"description": t.header, "sequence": seq}}
                                      if built is None else built["records"],
                                      details={"checkpoint_sha256": top["checkpoint_sha256"],
                                               "model_name": top.get("model_name"),
                                               "seed": top["seed"],
                                               "num_recycles": top["num_recycles"]})

    def _provenance(self, t, seq, pid, fp, fasta, msa_files, template_record, decision,
                    outputs, row) -> dict:
        """provenance.json (less the review item and the outputs' digests)."""
        return {
            "target": t.target_id, "header": t.header, "file_name": t.file_name,
            "prediction_id": pid,
            "not_for_clinical_use": True, "notice": CLINICAL_NOTICE,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "protdp_version": __version__, "code_version": self._code,
            "host": socket.gethostname(), "rank": self.rank, "world_size": self.world_size,
            "checkpoint": self.loaded.describe(),
            "checkpoints": [{**m.describe(), **names} for m, names in
                            zip(self.models, self.member_names)],
            "inputs": {"fasta": fasta["path"], "fasta_sha256": fasta["sha256"],
                       "fasta_line": t.line, "sequence_sha256": sha256_text(seq),
                       "msa_files": msa_files, "screening_list": self.screening_path,
                       "screening_list_sha256": self.screening_sha},
            "config": {"model": to_dict(self.loaded.config), **self.settings},
            "attention": backend_report(self.loaded.trunk_config.attention_backend, self.device),
            "templates": template_record,
            "gate": decision.to_dict(), "outputs": outputs, "fingerprint": fp,
            "summary": {k: v for k, v in row.items() if k != "gate"},
        }

    def _finish_pending(self, t, tdir, pdir, fp) -> dict:
        """A published folder whose run stopped before the queue / completion mark."""
        provenance = json.loads((pdir / PENDING_FILE).read_text())
        scores = json.loads((pdir / "scores.json").read_text())
        return self._complete_published(t, tdir, pdir, fp, provenance, scores)

    def _complete_published(self, t, tdir, pdir, fp, provenance, scores, rebind=False) -> dict:
        row = {**provenance["summary"], "index": t.index}
        if row["route"] == "needs_review":
            row["review_item"] = self._enqueue(t, fp, scores, item_paths(row["paths"], pdir),
                                               rebind)
        provenance.update(review_queue=self.sink.display if "review_item" in row else None,
                          review_item=row.get("review_item"),
                          summary={k: v for k, v in row.items() if k != "gate"})
        write_json(pdir / "provenance.json", provenance)
        write_current(tdir, pdir.name)
        row["paths"]["provenance"] = str(pdir / "provenance.json")
        return row

