"""Features of the next targets prepared in worker processes while the model predicts the
current one (issue 45): bounded prefetch, bounded host memory.

The process claims `lookahead` targets beyond the one it predicts (`workqueue.drain`, their
leases renewed too) and hands each to a pool of `workers` processes, which search its MSA
when it has none and --db is given (`claimed_search`; for complexes only this), validate the
sequence, find and parse its MSA files (`targets.load_msa`), align its --template files
(kalign) or read its template features (`templates.inputs.TemplateProvider`), and sample the
features of every (checkpoint, seed) (`Predictor.features` itself, AF2's MSA sampling and
masking: a pure function of sequence, MSA, seed and settings; pass 0's sample and a picklable
per-pass source, the later passes built by the model, `data.msa_passes`). At most `lookahead` targets' inputs are held at a time, and
a target's are dropped once it is predicted. The predictor then takes the parsed MSA and the
features instead of computing them (`Predictor.msa_loader` / `template_loader`,
`ensemble._member_features`),
keyed by everything they depend on, so a prefetched input is exactly the inline one.

Prefetch only saves time: whatever fails in a worker (a bad MSA, an invalid sequence, a dead
worker) is simply not prefetched, and the predictor computes it inline, where the failure
becomes the target's summary row with its reason, as without prefetch.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from protdp.inference.ensemble import feature_passes
from protdp.inference.predictor import Predictor
from protdp.inference.targets import clean_sequence, find_msa_files, load_msa

DEFAULT_LOOKAHEAD = 1


def feature_key(sequence: str, family_id: str, seed: int, passes: int) -> tuple:
    return (sequence, family_id, int(seed), int(passes))


@dataclass(frozen=True)
class _Member:
    """A checkpoint as `Predictor.features` reads it (its config), without its weights."""
    config: object


class _WorkerFeatures:
    """`Predictor.features` itself in a worker process (one definition of the features'
    arguments): the predictor's settings, without its models."""
    features = Predictor.features

    def __init__(self, config):
        self.config, self.loaded = config, None


def _msa_paths(job: dict, searched) -> list[Path]:
    """The target's MSA files: none (single sequence), the searched ones (--db), those its
    input names, else those of --msa-dir."""
    if job["config"].msa_mode == "single_sequence":
        return []
    if searched is not None:
        return [Path(p) for p in searched[1]]
    if job["msa_files"] is not None:
        return [Path(p) for p in job["msa_files"]]
    return find_msa_files(job["msa_dir"], job["file_name"])


def prepare_target(job: dict) -> dict | None:
    """In a worker: the target's MSA search (--db, `claimed_search`), sequence, MSA files,
    parsed MSA and features of every (checkpoint's passes, seed); None when anything fails
    (the predictor then does it inline). A failed search is returned as such (its reason
    becomes the target's row; not searched again inline)."""
    c = job["config"]
    try:
        searched = None if job["search"] is None else job["search"].outcome(job["target"])
        if job["search_only"] or (searched is not None and searched[0] == "error"):
            return {"searched": searched, "msa_paths": None, "msa": None, "features": {},
                    "sequence": None, "templates": None}
        seq = clean_sequence(job["target"].raw_sequence, max_length=c.max_length,
                             max_unknown_fraction=c.max_unknown_fraction)
        paths = _msa_paths(job, searched)
        msa = load_msa(paths)
        templates = None
        if job["templates"] is not None:       # custom templates aligned (kalign), or read
            inputs, record = job["templates"].for_target(seq, job["msa_dir"], job["file_name"])
            templates = ({k: (v.numpy() if torch.is_tensor(v) else v) for k, v in inputs.items()},
                         record)
        feats, worker = {}, _WorkerFeatures(c)
        for model_config in job["model_configs"]:
            passes = feature_passes(c, model_config)
            for seed in job["seeds"]:
                key = feature_key(seq, job["file_name"], seed, passes)
                if key not in feats:
                    f = worker.features(seq, msa, job["file_name"], seed=seed,
                                        loaded=_Member(model_config))
                    feats[key] = {k: (v.numpy() if torch.is_tensor(v) else v)
                                  for k, v in f.items()}
        return {"searched": searched, "msa_paths": tuple(str(p) for p in paths), "msa": msa,
                "features": feats, "sequence": seq, "templates": templates}
    except Exception:   # noqa: BLE001  (inline, the predictor records the reason)
        return None


class FeaturePrefetcher:
    """A pool of `workers` processes preparing the targets handed to `submit`; the predictor
    `pred` reads what `take` installed for the target it predicts."""

    def __init__(self, pred, targets: list, info: dict, workers: int = 1):
        self.pred, self.targets, self.info = pred, targets, info
        ctx = mp.get_context("spawn")          # no fork of a process holding torch threads
        self.pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
        self.futures: dict[int, cf.Future] = {}
        self.hits = 0
        self._current: dict | None = None
        c = pred.config
        self.seeds = [c.seed + s for s in range(c.num_seeds)]
        self.model_configs = [m.config for m in pred.models]
        self.search = getattr(pred, "claimed_search", None)      # --db (`claimed_search`)
        pred.msa_loader = self._load_msa
        pred.feature_cache = self._features
        self._template_loader = pred.template_loader
        if pred.template_loader is not None:
            pred.template_loader = self._load_templates

    def submit(self, idx: int) -> None:
        t = self.targets[idx]
        search_only = "complex" in t.extra or self.pred.multimer   # complexes: the search
        if idx in self.futures or t.error or (search_only and self.search is None):
            return
        job = {"config": self.pred.config, "target": t, "file_name": t.file_name,
               "msa_dir": self.info["msa_dir"], "msa_files": t.extra.get("msa_files"),
               "seeds": self.seeds, "model_configs": self.model_configs,
               "templates": self.pred.templates, "search": self.search,
               "search_only": search_only}
        self.futures[idx] = self.pool.submit(prepare_target, job)

    def take(self, idx: int) -> None:
        """Install target `idx`'s prepared inputs (waiting for them) for the next
        `predict_target`; nothing when it was not prefetched or failed."""
        fut = self.futures.pop(idx, None)
        try:
            self._current = None if fut is None else fut.result()
        except Exception:   # noqa: BLE001  (a dead worker: inline)
            self._current = None
        if self._current is not None and self._current["searched"] is not None:
            self.pred.search_outcomes[idx] = self._current["searched"]   # SearchingPredictor

    def _load_msa(self, paths: list[Path]):
        cur = self._current
        if cur is not None and cur["msa_paths"] == tuple(str(p) for p in paths):
            return cur["msa"]
        return load_msa(paths)

    def _load_templates(self, sequence: str, msa_dir, file_name: str) -> tuple[dict, dict]:
        cur = self._current
        if cur is None or cur["templates"] is None or cur["sequence"] != sequence:
            return self._template_loader(sequence, msa_dir, file_name)
        inputs, record = cur["templates"]
        return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                for k, v in inputs.items()}, record

    def _features(self, sequence: str, family_id: str, seed: int, passes: int) -> dict | None:
        cur = self._current
        f = None if cur is None else cur["features"].get(
            feature_key(sequence, family_id, seed, passes))
        if f is None:
            return None
        self.hits += 1
        return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                for k, v in f.items()}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.futures.clear()
        self._current = None
        self.pred.msa_loader = load_msa
        self.pred.feature_cache = None
        self.pred.template_loader = self._template_loader
