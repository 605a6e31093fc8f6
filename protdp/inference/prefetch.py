"""Features of the next targets prepared in worker processes while the model predicts the
current one (issue 45): bounded prefetch, bounded host memory.

The process claims `lookahead` targets beyond the one it predicts (`workqueue.drain`, their
leases renewed too) and hands each to a pool of `workers` processes, which validate the
sequence, find and parse its MSA files (`targets.load_msa`), align its --template files
(kalign) or read its template features (`templates.inputs.TemplateProvider`), and sample the
features of every (checkpoint, seed) (`msa_passes.query_features`, AF2's MSA sampling and masking: a pure function of
sequence, MSA, seed and settings; pass 0's sample, the later ones built by the model per pass). At most `lookahead` targets' inputs are held at a time, and
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
from pathlib import Path

import numpy as np
import torch

from protdp.data.msa_passes import query_features   # passes built by the consumer
from protdp.inference.targets import clean_sequence, find_msa_files, load_msa

DEFAULT_LOOKAHEAD = 1


def _passes(config, model_recycles: list[int]) -> list[int]:
    return sorted({(config.num_recycles if config.num_recycles is not None else r) + 1
                   for r in model_recycles})


def feature_key(sequence: str, family_id: str, seed: int, passes: int) -> tuple:
    return (sequence, family_id, int(seed), int(passes))


def prepare_target(job: dict) -> dict | None:
    """In a worker: the target's sequence, MSA files, parsed MSA and features of every
    (passes, seed); None when anything fails (the predictor then does it inline)."""
    c = job["config"]
    try:
        seq = clean_sequence(job["raw_sequence"], max_length=c.max_length,
                             max_unknown_fraction=c.max_unknown_fraction)
        if c.msa_mode == "single_sequence":
            paths = []
        elif job["msa_files"] is not None:
            paths = [Path(p) for p in job["msa_files"]]
        else:
            paths = find_msa_files(job["msa_dir"], job["file_name"])
        msa = load_msa(paths)
        templates = None
        if job["templates"] is not None:       # custom templates aligned (kalign), or read
            inputs, record = job["templates"].for_target(seq, job["msa_dir"], job["file_name"])
            templates = ({k: (v.numpy() if torch.is_tensor(v) else v) for k, v in inputs.items()},
                         record)
        feats = {}
        for passes in job["passes"]:
            for seed in job["seeds"]:
                f = query_features(seq, msa, max_msa_rows=c.max_msa_rows, seed=seed,
                                   family_id=job["file_name"],
                                   max_extra_msa_rows=c.max_extra_msa_rows,
                                   msa_samples=passes,
                                   masked_msa_fraction=c.masked_msa_fraction)
                feats[feature_key(seq, job["file_name"], seed, passes)] = {
                    k: (v.numpy() if torch.is_tensor(v) else v) for k, v in f.items()}
        return {"msa_paths": tuple(str(p) for p in paths), "msa": msa, "features": feats,
                "sequence": seq, "templates": templates}
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
        self.passes = _passes(c, [m.config.num_recycles for m in pred.models])
        pred.msa_loader = self._load_msa
        pred.feature_cache = self._features
        self._template_loader = pred.template_loader
        if pred.template_loader is not None:
            pred.template_loader = self._load_templates

    def submit(self, idx: int) -> None:
        t = self.targets[idx]
        if idx in self.futures or t.error or "complex" in t.extra or self.pred.multimer:
            return
        job = {"config": self.pred.config, "raw_sequence": t.raw_sequence,
               "file_name": t.file_name, "msa_dir": self.info["msa_dir"],
               "msa_files": t.extra.get("msa_files"), "seeds": self.seeds,
               "passes": self.passes, "templates": self.pred.templates}
        self.futures[idx] = self.pool.submit(prepare_target, job)

    def take(self, idx: int) -> None:
        """Install target `idx`'s prepared inputs (waiting for them) for the next
        `predict_target`; nothing when it was not prefetched or failed."""
        fut = self.futures.pop(idx, None)
        try:
            self._current = None if fut is None else fut.result()
        except Exception:   # noqa: BLE001  (a dead worker: inline)
            self._current = None

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
