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

import dataclasses
import datetime as dt
import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch
from tqdm import tqdm

from protdp import __version__
from protdp.config import to_dict
from protdp.data.features import collate, featurize_query
from protdp.templates.inputs import template_names, template_provider
from protdp.data.residues import GAP_ID
from protdp.data.screening import ScreeningList
from protdp.errors import ConfigError, InputError, ProtdpError
from protdp.gating import ROUTES, GateDecision, GatePolicy, band_of, load_gate_policy, route
from protdp.inference.checkpoint import (LoadedModel, checkpoint_home, load_model_checkpoint,
                                        sha256_file)
from protdp.inference.targets import (Target, clean_sequence, find_msa_files, load_msa,
                                      read_targets, sha256_text)
from protdp.inference.writers import round_plddt, write_json, write_structures, write_summary
from protdp.train.release_record import read_release

CLINICAL_NOTICE = ("Computational prediction for research use. NOT for clinical or diagnostic "
                   "decisions without review by a qualified person; see the gate route and reasons.")
TARGETS_DIR = "targets"
PARTS_DIR = ".summary_parts"


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
    """Seed of the MSA sampling and masking (deterministic for a given seed)."""

    def __post_init__(self):
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


RELEASE_GATES = ("enforce", "review", "off")


class ReviewSink(Protocol):
    """Where flagged predictions go. `enqueue` is idempotent per `prediction_id` and returns
    the review item id; `display` names the destination in provenance (no secrets)."""

    display: str

    def enqueue(self, prediction_id: str, target: str, scores: dict, paths: dict,
                reasons: list[str], *, details: dict, actor: str) -> int: ...

    def close(self) -> None: ...


class NoReviewSink:
    """Refuses every flagged prediction: a batch without a review destination stops at the
    first prediction that needs review instead of marking it complete unreviewed."""

    display = "<none>"

    def enqueue(self, prediction_id, target, scores, paths, reasons, *, details, actor) -> int:
        raise ConfigError(f"target {target!r} needs review but no review sink is configured")

    def close(self) -> None:
        pass


class Predictor:
    """Holds the model, gate policy, screening list and review sink for a batch."""

    def __init__(self, loaded: LoadedModel, out_dir: str | Path, *,
                 config: PredictConfig | None = None, policy: GatePolicy | None = None,
                 screening: ScreeningList | None = None, screening_path: str | Path | None = None,
                 sink: ReviewSink | None = None, device: str | torch.device = "cpu",
                 release_gate: str = "enforce",
                 rank: int = 0, world_size: int = 1, msa_search: dict | None = None,
                 templates: tuple[str, ...] = ()):
        self.loaded = loaded
        self.device = torch.device(device)
        if next(loaded.model.parameters()).device != self.device:
            raise ConfigError(f"model is on {next(loaded.model.parameters()).device}, "
                              f"predictor on {self.device}: load it with device={device!r}")
        self.model = loaded.model.eval()
        self.config = config or PredictConfig()
        self.policy = policy or load_gate_policy()
        self.screening = screening
        self.screening_sha = sha256_file(screening_path) if screening_path else None
        self.screening_path = str(screening_path) if screening_path else None
        self.out_dir = Path(out_dir).resolve()
        self.targets_dir = self.out_dir / TARGETS_DIR
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.sink = sink if sink is not None else NoReviewSink()
        self.release, self.forced_reasons = self._check_release(release_gate)
        self.rank, self.world_size = rank, world_size
        self._code = _code_version()
        self.settings = {"predict": to_dict(self.config), "gate_policy": to_dict(self.policy),
                         "release": self.release,
                         "screening_list_sha256": self.screening_sha,
                         "checkpoint_sha256": loaded.sha256}
        if msa_search is not None:   # databases (sha256) and settings of `protdp msa search`
            self.settings["msa_search"] = msa_search
        self.templates = template_provider(loaded.config, templates)   # issue 31 (None: off)
        if templates:
            self.settings["templates"] = [str(t) for t in templates]

    def _check_release(self, gate: str) -> tuple[dict, dict]:
        """The checkpoint's release record under `gate`: "enforce" refuses an unreleased
        checkpoint, "review" runs it with every prediction sent to review, "off" (evaluation
        tools: red-team) does not look. Returns (provenance entry, forced gate reasons)."""
        if gate not in RELEASE_GATES:
            raise ConfigError(f"release_gate={gate!r}: expected one of {RELEASE_GATES}")
        if gate == "off":
            return {"gate": "off", "released": None}, {}
        status = read_release(checkpoint_home(self.loaded.path), self.loaded.sha256)
        record = {"gate": gate, **status.to_dict()}
        if status.released:
            return record, {}
        if gate == "enforce":
            raise ConfigError(f"checkpoint {self.loaded.path} is not released: {status.reason}; "
                              "pass --allow-unreleased to run it anyway (every prediction then "
                              "goes to review)")
        return record, {"unreleased_checkpoint": status.reason}

    def close(self) -> None:
        self.sink.close()

    # -- one target ------------------------------------------------------------------------
    def fingerprint(self, seq_sha: str, msa_files: list[dict]) -> str:
        blob = json.dumps({"settings": self.settings, "sequence_sha256": seq_sha,
                           "msa": [m["sha256"] for m in msa_files]}, sort_keys=True)
        return sha256_text(blob)

    def _complete(self, tdir: Path, fingerprint: str) -> dict | None:
        """The previous run's provenance when this target is done with identical inputs."""
        prov = tdir / "provenance.json"
        if not prov.is_file():
            return None
        try:
            data = json.loads(prov.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if data.get("fingerprint") != fingerprint:
            return None
        if not all((tdir / name).is_file() for name in data.get("outputs", {}).values()):
            return None
        return data

    def features(self, sequence: str, msa, family_id: str = "query") -> dict:
        """The model's inputs for one target under this predictor's settings (one MSA sample
        per recycling pass, AF2's inference masking)."""
        c = self.config
        passes = (c.num_recycles if c.num_recycles is not None else self.loaded.config.num_recycles) + 1
        return featurize_query(sequence, msa, max_msa_rows=c.max_msa_rows, seed=c.seed,
                               family_id=family_id, max_extra_msa_rows=c.max_extra_msa_rows,
                               msa_samples=passes, masked_msa_fraction=c.masked_msa_fraction)

    @torch.no_grad()
    def _run_model(self, features: dict) -> dict:
        batch = {**collate([features]),    # template keys: one target, no padding to collate
                 **{k: v[None] for k, v in features.items() if k.startswith("template_")}}
        batch = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in batch.items()}
        out = self.model(batch, num_recycles=self.config.num_recycles)
        res = {"positions": out["final_atom_positions"][0].float().cpu().numpy(),   # [L, 37, 3]
               "atom_mask": out["final_atom_mask"][0].float().cpu().numpy(),         # [L, 37]
               "plddt": out["plddt"][0].float().cpu().numpy(),                       # [L]
               "num_recycles": int(out["num_recycles"])}
        if "pae" in out:
            res["pae"] = out["pae"][0].float().cpu().numpy()                         # [L, L]
            res["ptm"] = float(out["ptm"].reshape(-1)[0])
        return res

    def predict_target(self, t: Target, fasta: dict) -> dict:
        """Predict, gate, write and (if flagged) enqueue one target; returns its summary row."""
        row = {"index": t.index, "target": t.target_id, "file_name": t.file_name, "line": t.line,
               "length": None, "route": "rejected", "reasons": ["invalid_input"],
               "mean_plddt": None, "band": None, "ptm": None, "msa_depth": None, "status": "rejected",
               "detail": "", "paths": {}}
        try:
            if t.error:
                raise InputError(t.error)
            seq = clean_sequence(t.raw_sequence, max_length=self.config.max_length,
                                 max_unknown_fraction=self.config.max_unknown_fraction)
            row["length"] = len(seq)
            msa_paths = find_msa_files(fasta["msa_dir"], t.file_name)
            msa_files = [{"path": str(p), "sha256": sha256_file(p)} for p in msa_paths]
            fp = self.fingerprint(sha256_text(seq), msa_files)
            tdir = self.targets_dir / t.file_name
            done = self._complete(tdir, fp)
            if done is None:
                msa = load_msa(msa_paths)
                features = self.features(seq, msa, t.file_name)
                if self.templates is not None:
                    template_inputs, template_record = self.templates.for_target(
                        seq, fasta["msa_dir"], t.file_name)
                    features.update(template_inputs)
                msa_depth = 1 if msa is None else msa.depth
                hits = self.screening.hits(seq) if self.screening is not None else []
                out = self._run_model(features)
                out["msa_coverage"] = msa_coverage(msa, len(seq))
                if self.templates is not None:
                    out["templates"] = template_record
        except (ProtdpError, MemoryError, torch.OutOfMemoryError) as exc:
            row["detail"] = str(exc) if isinstance(exc, ProtdpError) else f"out of memory: {exc}"
            decision = route(np.zeros(0), length=0, msa_depth=0, training_crop=None,
                             invalid_reason=row["detail"], policy=self.policy)
            row["gate"] = decision.to_dict()
            return row

        if done is not None:
            return self._skip(t, tdir, fp, done)
        tdir.mkdir(parents=True, exist_ok=True)
        return self._finish(t, seq, tdir, fp, fasta, msa_files, msa_depth,
                            int(features["msa"].shape[-2]), hits, out, row)

    def _skip(self, t: Target, tdir: Path, fp: str, done: dict) -> dict:
        """A target completed by an earlier run: its recorded row (flagged ones re-enqueued,
        idempotently, in case --queue-url changed). Queue errors propagate: they stop the batch
        instead of turning a flagged prediction into a 'rejected' row."""
        row = {**done["summary"], "index": t.index, "status": "skipped"}
        if row["route"] == "needs_review":
            scores = json.loads((tdir / "scores.json").read_text())
            row["review_item"] = self._enqueue(t, fp, scores, row["paths"])
        return row

    def _enqueue(self, t: Target, fp: str, scores: dict, paths: dict) -> int:
        """Hand a flagged prediction to the review sink (same prediction id -> same item)."""
        keep = ("sequence", "plddt", "mean_plddt", "afdb_bands", "band", "very_low_fraction", "ptm",
                "msa_depth", "msa_rows_used", "msa_coverage", "length", "num_recycles")
        return self.sink.enqueue(f"{t.file_name}:{fp[:16]}", t.target_id,
                                  {k: scores.get(k) for k in keep}, paths, scores["reasons"],
                                  details=scores["details"], actor="predictor")

    def _finish(self, t, seq, tdir, fp, fasta, msa_files, msa_depth, rows_used, hits, out, row):
        finite_xyz = np.isfinite(out["positions"]).all(axis=(-1, -2))              # [L]
        plddt = round_plddt(out["plddt"])
        plddt[~finite_xyz] = np.nan   # no position, no confidence: the gate flags invalid_plddt
        hit_text = [f"{h.entry} (query {h.query_start + 1}-{h.query_end}, {h.method})" for h in hits]
        decision: GateDecision = route(plddt, length=len(seq), msa_depth=msa_depth,
                                       training_crop=self.loaded.training_crop,
                                       screening_hits=hit_text, policy=self.policy, sequence=seq,
                                       forced_reasons=self.forced_reasons,
                                       templates=template_names(out.get("templates")))
        outputs = {}
        if finite_xyz.all() and np.isfinite(plddt).all():
            files = write_structures(tdir, t.file_name, seq, out["positions"], plddt, out["atom_mask"])
            outputs = {k: p.name for k, p in files.items()}
        mean = decision.mean_plddt
        scores = {
            "target": t.target_id, "file_name": t.file_name, "sequence": seq, "length": len(seq),
            "plddt": plddt, "mean_plddt": mean, "band": None if mean is None else band_of(mean),
            "afdb_bands": decision.afdb_bands, "very_low_fraction": decision.very_low_fraction,
            "ptm": out.get("ptm"), "pae": None if "pae" not in out else np.round(out["pae"], 2),
            "msa_depth": msa_depth, "msa_rows_used": rows_used,
            "msa_coverage": out["msa_coverage"],
            "num_recycles": out["num_recycles"],
            "nonfinite_residues": int((~finite_xyz).sum() + (~np.isfinite(out["plddt"])).sum()),
            "screening_hits": [dataclasses.asdict(h) for h in hits],
            "route": decision.route, "reasons": decision.reasons, "details": decision.details,
        }
        write_json(tdir / "scores.json", scores)
        outputs["scores"] = "scores.json"
        row.update(route=decision.route, reasons=decision.reasons, mean_plddt=mean,
                   band=scores["band"],
                   ptm=out.get("ptm"), msa_depth=msa_depth, status="predicted",
                   detail="; ".join(decision.details.values()),
                   paths={k: str(tdir / v) for k, v in outputs.items()})
        if decision.route == "needs_review":
            row["review_item"] = self._enqueue(t, fp, scores, row["paths"])
        provenance = {
            "target": t.target_id, "header": t.header, "file_name": t.file_name,
            "not_for_clinical_use": True, "notice": CLINICAL_NOTICE,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "protdp_version": __version__, "code_version": self._code,
            "host": socket.gethostname(), "rank": self.rank, "world_size": self.world_size,
            "checkpoint": self.loaded.describe(),
            "inputs": {"fasta": fasta["path"], "fasta_sha256": fasta["sha256"],
                       "fasta_line": t.line, "sequence_sha256": sha256_text(seq),
                       "msa_files": msa_files, "screening_list": self.screening_path,
                       "screening_list_sha256": self.screening_sha},
            "config": {"model": to_dict(self.loaded.config), **self.settings},
            "templates": out.get("templates"),
            "gate": decision.to_dict(), "review_queue": self.sink.display if "review_item" in row else None,
            "review_item": row.get("review_item"),
            "outputs": outputs, "fingerprint": fp,
            "summary": {k: v for k, v in row.items() if k != "gate"},
        }
        write_json(tdir / "provenance.json", provenance)
        row["paths"]["provenance"] = str(tdir / "provenance.json")
        return row


def _counts(rows: list[dict]) -> dict:
    return {r: sum(1 for row in rows if row["route"] == r) for r in ROUTES}


def predict_batch(checkpoint: str | Path | LoadedModel, fasta: str | Path, out_dir: str | Path, *,
                  sink: ReviewSink | None = None, msa_dir: str | Path | None = None,
                  config: PredictConfig | None = None,
                  gating: str | Path | GatePolicy | None = None,
                  screening: str | Path | None = None, rank: int = 0, world_size: int = 1,
                  barrier: Callable[[], None] | None = None,
                  device: str | torch.device | None = None, progress: bool = True,
                  msa_search: dict | None = None, release_gate: str = "enforce",
                  templates: tuple[str, ...] = ()) -> RunResult:
    """Predict every target of `fasta` owned by this rank, flagged ones handed to `sink`;
    rank 0 merges summary.tsv after `barrier()` (pass one when world_size > 1).
    `release_gate`: "enforce" (an unreleased checkpoint is refused), "review" (it runs, every
    prediction to review) or "off" (evaluation tools only)."""
    fasta = Path(fasta)
    targets = read_targets(fasta)
    if msa_dir is not None and not Path(msa_dir).is_dir():
        raise InputError("MSA directory not found", path=msa_dir)
    if world_size > 1 and barrier is None:
        raise ConfigError("world_size > 1 needs a barrier to merge the summary")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = (checkpoint if isinstance(checkpoint, LoadedModel)
              else load_model_checkpoint(checkpoint, device=device))
    screen = ScreeningList.from_fasta(screening) if screening else None
    pred = Predictor(loaded, out_dir, config=config, policy=load_gate_policy(gating),
                     screening=screen, screening_path=screening, sink=sink,
                     device=device, rank=rank, world_size=world_size, msa_search=msa_search,
                     release_gate=release_gate, templates=templates)
    info = {"path": str(fasta.resolve()), "sha256": sha256_file(fasta),
            "msa_dir": None if msa_dir is None else Path(msa_dir).resolve()}
    mine = [t for t in targets if t.index % world_size == rank]
    rows = []
    try:
        for t in tqdm(mine, desc=f"predict [rank {rank}]" if world_size > 1 else "predict",
                      unit="target", position=rank, disable=not progress, leave=True):
            rows.append(pred.predict_target(t, info))
    finally:
        pred.close()
    parts = pred.out_dir / PARTS_DIR
    parts.mkdir(exist_ok=True)
    part = parts / f"rank{rank:05d}-of-{world_size:05d}.json"
    write_json(part, {"fasta_sha256": info["sha256"], "rows": rows})
    if barrier is not None:
        barrier()
    summary_path = None
    if rank == 0:
        rows = _merge_parts(parts, world_size, info["sha256"], len(targets))
        summary_path = write_summary(pred.out_dir / "summary.tsv", rows)
        write_json(pred.out_dir / "summary.json", {"counts": _counts(rows), "rows": rows,
                                                   "queue_url": pred.sink.display,
                                                   "notice": CLINICAL_NOTICE})
    return RunResult(pred.out_dir, rows, pred.sink.display, summary_path, _counts(rows),
                     sum(1 for r in rows if r["status"] == "skipped"))


def _merge_parts(parts: Path, world_size: int, fasta_sha: str, n_targets: int) -> list[dict]:
    rows = []
    for r in range(world_size):
        data = json.loads((parts / f"rank{r:05d}-of-{world_size:05d}.json").read_text())
        if data["fasta_sha256"] != fasta_sha:
            raise ProtdpError(f"rank {r} summary part is from another FASTA")
        rows += data["rows"]
    if sorted(r["index"] for r in rows) != list(range(n_targets)):
        raise ProtdpError(f"summary parts cover {len(rows)} of {n_targets} targets")
    return sorted(rows, key=lambda r: r["index"])
