"""Run-level checkpoints: atomic, keep-last-K, exact resume (Megatron `--save/--load` layout).

    SAVE/latest_checkpointed_iteration.txt     # Megatron's tracker file, replaced atomically
    SAVE/iter_0000020/meta.json                # iteration, config, code version, world size (written last)
    SAVE/iter_0000020/engine/                  # protdp.parallel.save_checkpoint: model.pt (once)
                                               #   + each rank's optimizer shard, reshardable
    SAVE/iter_0000020/ema.pt                   # EMA weights (rank 0)
    SAVE/iter_0000020/rank_00001.pt            # per-rank sampler state and RNG states
                                               #   (`protdp-rank-v2`: tensors, numbers, strings;
                                               #   read with weights_only=True, never unpickled)

and the single-file model format (`protdp-model-v1`: model config, weights, optional EMA, the
training crop / MSA depth) used to ship a model, e.g. imported AlphaFold/OpenFold weights.

This module is the one owner of both layouts: the trainer writes and resumes through it, and
`read_any_weights` / `merged_weights` are the small reader API that prediction
(`protdp.inference.checkpoint`) and fine-tuning (`--finetune-from`) use; the engine's own shard
format inside `engine/` belongs to `protdp.parallel.checkpoint`.

All ranks write into `iter_N.tmp/`; after a barrier rank 0 writes `meta.json`, renames the
folder to `iter_N` and only then points the tracker at it, so a crash at any moment leaves
the previous checkpoint loadable. Loading picks the newest folder holding `meta.json`.
Model and optimizer shards are saved and loaded by `protdp.parallel` in a layout-independent form,
so a run may resume at another data-parallel size; RNG states of ranks that did not exist in
the saved run are derived from the seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from protdp.errors import ConfigError, InputError
from protdp.fileio import read_json_object, sha256_file, torch_load_refusal
from protdp.model.weight_checks import check_weights
from protdp.parallel.checkpoint import MODEL_FILE

TRACKER = "latest_checkpointed_iteration.txt"
ENGINE = "engine"
META = "meta.json"          # written last: a folder holding it is a complete checkpoint
EMA_FILE = "ema.pt"
MODEL_FILE_FORMAT = "protdp-model-v1"
IMPORTED_MODEL_FILE = "model.pt"   # `protdp weights import` writes CKPT/model.pt + provenance.json
_ITER_RE = re.compile(r"^iter_(\d{7})$")


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def code_version() -> dict:
    """git commit (+ dirty flag) of the running code, and the package version."""
    from protdp import __version__
    from protdp.paths import REPO_ROOT

    info = {"protdp": __version__, "git_commit": None, "git_dirty": None}
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=10, check=True).stdout.strip()
        info["git_dirty"] = bool(subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
            capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


RANK_FILE_FORMAT = "protdp-rank-v2"   # v1 (pickled numpy/python objects) is refused


def rng_state() -> dict:
    """Every RNG stream of this process as tensors, ints and strings only, so the rank file is
    readable with `torch.load(weights_only=True)` (no pickled objects)."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {"python": {"version": int(version), "mt": torch.tensor(mt, dtype=torch.int64),
                        "gauss": None if gauss is None else float(gauss)},
             "numpy": {"name": str(np_name), "keys": torch.from_numpy(np_keys.astype(np.int64)),
                       "pos": int(np_pos), "has_gauss": int(np_has_gauss),
                       "cached_gaussian": float(np_gauss)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(x) for x in py["mt"].tolist()), py["gauss"]))
    np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_rank_file(path: Path) -> dict:
    """A rank file (`RANK_FILE_FORMAT`) read with weights_only=True; the old pickled format and
    anything that is not plain tensors/containers is refused with an InputError naming the file
    (unpickling a shared run folder would run its code)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(
            f"refused: {torch_load_refusal(exc, path)}; rank files written before format "
            f"'{RANK_FILE_FORMAT}' held pickled objects and are not read any more (they could "
            "run code); restart from a newer checkpoint, or fine-tune from this one's weights "
            "with --finetune-from", path=path) from None
    if not isinstance(state, dict) or state.get("format") != RANK_FILE_FORMAT:
        raise InputError(f"not a '{RANK_FILE_FORMAT}' rank file (written by an older protdp?)",
                         path=path)
    return state


def quarantine_state(records: list[dict]) -> dict:
    """The rank file's entry for the tolerant feed's quarantine records (issue 44): one JSON
    string (a rank file holds tensors, numbers and strings only)."""
    return {"quarantine": json.dumps(records, sort_keys=True)}


def quarantine_records(rank_state: dict | None) -> list[dict]:
    """The quarantine records of a rank file ([] for one written before issue 44)."""
    text = (rank_state or {}).get("quarantine")
    if not text:
        return []
    records = json.loads(text)
    if not isinstance(records, list) or not all(isinstance(r, dict) and "family" in r
                                                for r in records):
        raise InputError("the quarantine entry of a rank file is not a list of records")
    return records


def list_checkpoints(save_dir: Path) -> list[int]:
    """Iterations of complete checkpoints (those with meta.json), ascending."""
    if not save_dir.is_dir():
        return []
    its = []
    for p in save_dir.iterdir():
        m = _ITER_RE.match(p.name)
        if m and (p / META).exists():
            its.append(int(m.group(1)))
    return sorted(its)


def latest_checkpoint(load_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder under `load_dir` (tracker first, then a scan)."""
    load_dir = Path(load_dir)
    tracker = load_dir / TRACKER
    if tracker.exists():
        text = tracker.read_text().strip()
        if text.isdigit() and (load_dir / iter_dir_name(int(text)) / META).exists():
            return load_dir / iter_dir_name(int(text))
    its = list_checkpoints(load_dir)
    return load_dir / iter_dir_name(its[-1]) if its else None


@dataclass
class Saver:
    """Everything a checkpoint needs from the running job (the trainer builds one)."""

    rank: int
    world_size: int
    barrier: Callable[[], None]
    save_engine: Callable[[Path], None]  # collective: model once + every rank's optimizer shard
    keep_last: int = 3
    # folders to keep beyond keep_last while something reads them (a running release check);
    # they are pruned at a later save
    in_use: Callable[[], set[Path]] = lambda: set()


def save_checkpoint(saver: Saver, save_dir: str | Path, iteration: int, *, ema_state: dict,
                    rank_state: dict, config: dict) -> Path:
    """Collective: every rank calls this at the same iteration. Returns the final folder."""
    save_dir = Path(save_dir)
    final = save_dir / iter_dir_name(iteration)
    tmp = save_dir / (iter_dir_name(iteration) + ".tmp")
    if saver.rank == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a crash during an earlier save
        tmp.mkdir()
    saver.barrier()
    saver.save_engine(tmp / ENGINE)
    torch.save({**rank_state, "format": RANK_FILE_FORMAT, "rng": rng_state()},
               tmp / f"rank_{saver.rank:05d}.pt")
    if saver.rank == 0:
        torch.save(ema_state, tmp / EMA_FILE)
    saver.barrier()
    if saver.rank == 0:
        meta = {"iteration": iteration, "world_size": saver.world_size, "config": config,
                "code_version": code_version(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "data_manifest": data_manifest(config)}
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if final.exists():  # re-saving an iteration (e.g. after a restart): replace it
            shutil.rmtree(final)
        tmp.rename(final)
        tracker_tmp = save_dir / (TRACKER + ".tmp")
        tracker_tmp.write_text(str(iteration))
        tracker_tmp.replace(save_dir / TRACKER)
        in_use = {p.resolve() for p in saver.in_use()}
        for old in list_checkpoints(save_dir)[:-saver.keep_last]:
            if (save_dir / iter_dir_name(old)).resolve() not in in_use:
                shutil.rmtree(save_dir / iter_dir_name(old), ignore_errors=True)
    saver.barrier()
    return final


_MANIFEST_CACHE: dict[tuple, dict] = {}
DATA_KEYS = ("data", "distillation_data")   # the training stores a run's config names


def data_manifest(config: dict) -> dict:
    """{config key: {"path", "sha256", "num_families", "family_ids_sha256"}} of the training
    stores, so the release's screening finds them by content wherever they are later
    (cached per process by path, size and mtime: a store is hashed once per run)."""
    from protdp.data.store import FamilyStore
    from protdp.complex.store import ComplexStore, is_complex_store

    out = {}
    for key in DATA_KEYS:
        path = config.get(key)
        if not path or not Path(path).is_file():
            continue
        st = Path(path).stat()
        stamp = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
        if stamp not in _MANIFEST_CACHE:
            with (ComplexStore if is_complex_store(path) else FamilyStore)(path) as store:
                ids = sorted(store.family_ids)
            _MANIFEST_CACHE[stamp] = {
                "path": stamp[0], "sha256": sha256_file(path), "num_families": len(ids),
                "family_ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()}
        out[key] = _MANIFEST_CACHE[stamp]
    return out


@dataclass
class Loaded:
    """A checkpoint read back for one rank (model + optimizer: `protdp.parallel.load_checkpoint`
    on `path / ENGINE`)."""

    path: Path
    iteration: int
    meta: dict
    ema_state: dict
    rank_state: dict | None   # None when this rank did not exist in the saved run

    @property
    def saved_world_size(self) -> int:
        return int(self.meta["world_size"])


def load_checkpoint(path: Path, rank: int) -> Loaded:
    """Read the EMA and this rank's own state (model and optimizer are loaded by the engine)."""
    meta_path = path / META
    if not meta_path.exists():
        raise ConfigError(f"{path}: not a complete checkpoint (no meta.json)")
    meta = read_json_object(meta_path, "the checkpoint's meta object")
    if "iteration" not in meta:
        raise InputError("no iteration recorded", path=meta_path, field="iteration")
    rank_file = path / f"rank_{rank:05d}.pt"
    # onto the CPU: the saving rank's GPU may not exist here (RNG states are CPU tensors anyway;
    # the EMA moves itself onto the model's device)
    rank_state = read_rank_file(rank_file) if rank_file.exists() else None
    return Loaded(path=path, iteration=int(meta["iteration"]), meta=meta,
                  ema_state=read_ema_file(path / EMA_FILE), rank_state=rank_state)


def read_ema_file(path: Path) -> dict:
    """`ema.pt` of a training checkpoint ({"shadow": weights, ...}), its shadow weights checked
    (`protdp.model.weight_checks`: finite, |w| <= MAX_WEIGHT_MAGNITUDE)."""
    blob = load_cpu(path)
    if not isinstance(blob, dict) or not isinstance(blob.get("shadow"), dict):
        raise InputError("not an EMA file (expected a dict with a 'shadow' dict)", path=path)
    check_weights(blob["shadow"], path, "shadow")
    return blob


# ------------------------------------------------------------------ reader API (prediction)

def resolve_iteration_dir(path: str | Path) -> Path:
    """A complete iter_N folder: `path` itself, or the newest one under a run folder."""
    path = Path(path)
    if (path / META).is_file() and (path / ENGINE).is_dir():
        return path
    newest = latest_checkpoint(path) if path.is_dir() else None
    if newest is None:
        raise InputError(f"no complete training checkpoint here (expected iter_N/{META})",
                         path=path)
    return newest


@dataclass
class TrainedWeights:
    """Model weights of a training checkpoint or a model file, model-agnostic."""

    path: Path                      # the iter_N folder or model file read
    meta: dict                      # iteration, config (incl. "model", crop_size, max_msa_rows)
    state_dict: dict                # the raw model weights
    ema_shadow: dict | None         # EMA of the weights (preferred for prediction), if saved
    sha256: str                     # digest of the files read (stable wherever they live)
    kind: str = "training-checkpoint"   # or "model-file"

    @property
    def model_config(self) -> dict:
        return self.meta["config"]["model"]

    def meta_int(self, key: str) -> int | None:
        """A positive integer setting of the run (crop_size, max_msa_rows), None if unknown."""
        value = self.meta.get("config", {}).get(key)
        if isinstance(value, float) and math.isfinite(value):
            value = int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
            else None


def load_cpu(path: Path):
    """torch.load onto the CPU, weights only; a missing or corrupt file is an InputError naming it."""
    try:
        with warnings.catch_warnings():    # torch warns about the pickle protocol of foreign files
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError("checkpoint file not found", path=path) from None
    except IsADirectoryError:
        raise InputError("a directory, not a checkpoint file", path=path) from None
    except PermissionError:
        raise InputError("permission denied reading the checkpoint", path=path) from None
    except Exception as exc:  # corrupt/truncated/foreign pickle: say which file
        raise InputError(f"not a readable checkpoint: {torch_load_refusal(exc, path)}",
                         path=path) from None


def _files_digest(root: Path, files: list[Path]) -> str:
    """sha256 over "relative path  file sha256" lines of the files read."""
    lines = [f"{f.relative_to(root).as_posix()}  {sha256_file(f)}\n" for f in files]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _weight_files(it_dir: Path) -> list[Path]:
    """The files a training checkpoint's weights are read from (and digested over)."""
    files = [it_dir / META, it_dir / ENGINE / MODEL_FILE]
    return files + [it_dir / EMA_FILE] if (it_dir / EMA_FILE).is_file() else files


def checkpoint_digest(path: str | Path) -> str:
    """The sha256 `read_weights` gives a training checkpoint, without loading its tensors."""
    it_dir = resolve_iteration_dir(path)
    return _files_digest(it_dir, _weight_files(it_dir))


def read_weights(path: str | Path) -> TrainedWeights:
    """Model weights (+ EMA) and meta of a run folder's newest, or one iter_N, checkpoint."""
    it_dir = resolve_iteration_dir(path)
    meta_path = it_dir / META
    meta = read_json_object(meta_path, "the checkpoint's meta object")
    if not isinstance((meta.get("config") or {}).get("model"), dict):
        raise InputError("no model config recorded", path=meta_path, field="config.model")
    model_pt = it_dir / ENGINE / MODEL_FILE
    blob = load_cpu(model_pt)
    if not isinstance(blob, dict) or "model" not in blob:
        raise InputError("expected a dict with key 'model'", path=model_pt)
    check_weights(blob["model"], model_pt, "model")     # finite, |w| <= MAX_WEIGHT_MAGNITUDE
    ema_pt = it_dir / EMA_FILE
    ema = read_ema_file(ema_pt)["shadow"] if ema_pt.is_file() else None
    return TrainedWeights(it_dir, meta, blob["model"], ema,
                          _files_digest(it_dir, _weight_files(it_dir)))


def save_model_file(path: str | Path, *, model_config: dict, state_dict: dict,
                    ema_shadow: dict | None = None, training_crop: int | None = None,
                    max_msa_rows: int | None = None) -> Path:
    """Write a single-file model checkpoint (atomic: temp file + rename). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"format": MODEL_FILE_FORMAT, "model_config": model_config,
            "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()},
            "ema_shadow": None if ema_shadow is None else {k: v.detach().cpu().float()
                                                           for k, v in ema_shadow.items()},
            "training_crop": training_crop, "max_msa_rows": max_msa_rows}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    return path


def read_model_file(path: str | Path) -> TrainedWeights:
    path = Path(path)
    blob = load_cpu(path)
    if not isinstance(blob, dict) or blob.get("format") != MODEL_FILE_FORMAT:
        raise InputError(f"not a protdp model checkpoint (expected format '{MODEL_FILE_FORMAT}'; "
                         "a training run is given as its folder)", path=path)
    check_weights(blob.get("state_dict"), path, "state_dict")   # |w| <= MAX_WEIGHT_MAGNITUDE
    if blob.get("ema_shadow") is not None:
        check_weights(blob["ema_shadow"], path, "ema_shadow")
    meta = {"config": {"model": blob.get("model_config"), "crop_size": blob.get("training_crop"),
                       "max_msa_rows": blob.get("max_msa_rows")}}
    return TrainedWeights(path, meta, blob["state_dict"], blob.get("ema_shadow"),
                          sha256_file(path), kind="model-file")


def is_imported_folder(path: Path) -> bool:
    """A folder written by `protdp weights import`: a model file, no training meta."""
    return path.is_dir() and (path / IMPORTED_MODEL_FILE).is_file() and not (path / META).is_file()


def read_any_weights(path: str | Path) -> TrainedWeights:
    """A model file, a training run folder (newest checkpoint), one iter_N folder, or an
    imported-weights folder (`protdp weights import`)."""
    path = Path(path).resolve()
    if is_imported_folder(path):
        return read_model_file(path / IMPORTED_MODEL_FILE)
    if path.is_dir():
        return read_weights(path)
    if path.is_file():
        return read_model_file(path)
    raise InputError("checkpoint not found", path=path)


def merged_weights(trained: TrainedWeights) -> tuple[dict, str]:
    """(state dict with the EMA applied where saved, "ema" | "raw"); NaN/Inf (a diverged run can
    save them) and |w| beyond MAX_WEIGHT_MAGNITUDE refused, naming the weight (the readers above
    check each file; this checks what is handed to the model, however it was read)."""
    merged = dict(trained.state_dict)
    weights = "raw"
    if trained.ema_shadow:
        unknown = sorted(set(trained.ema_shadow) - set(merged))
        if unknown:
            raise InputError(f"EMA has entries the model lacks: {unknown[:3]}", path=trained.path)
        merged.update({k: v.to(merged[k].dtype) for k, v in trained.ema_shadow.items()})
        weights = "ema"
    check_weights(merged, trained.path)
    return merged, weights
