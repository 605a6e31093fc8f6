"""Sharded, atomic, reshardable checkpoints for `DataParallel` + `DistributedOptimizer`.

Megatron concept: the distributed optimizer's "dp-reshardable" checkpoint format. Rank 0 writes the
model once (`model.pt`: `module.state_dict()` + caller's `extra`); each rank that owns optimizer
state writes its shard (`optim_rank00003.pt`) as per-parameter fragments with DP padding removed
(`DistributedOptimizer.state_dict`), so any DP size can load it. `meta.json` is written last.

Atomicity: everything is written to `<dir>.tmp`, then rank 0 swaps it in (`<dir>` -> `<dir>.old`,
`<dir>.tmp` -> `<dir>`, delete `<dir>.old`). A crash at any point leaves a loadable checkpoint at
`<dir>` or, between the two renames, at `<dir>.old`, which `load_checkpoint` falls back to.
All ranks must see the same filesystem.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from protdp.errors import InputError
from protdp.fileio import read_json_object, torch_load_refusal
from protdp.model.weight_checks import check_weights
from protdp.parallel import collectives as coll
from protdp.parallel.ddp import DataParallel
from protdp.parallel.optimizer import DistributedOptimizer, merge_fragments

CHECKPOINT_FORMAT = "protdp-checkpoint-v1"
MODEL_FILE = "model.pt"   # {"model": module.state_dict(), "extra": ...}, written once by rank 0
META_FILE = "meta.json"   # written last: format, optimizer shard files


def _atomic_save(obj, path: Path):
    tmp = path.with_name(path.name + f".partial{os.getpid()}")
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _barrier(model: DataParallel, what: str):
    if model.dp > 1:
        coll.run(f"barrier({what})", lambda: dist.barrier(group=model.group), model.rank)


def save_checkpoint(path: str | Path, model: DataParallel,
                    optimizer: DistributedOptimizer | None = None, extra: dict | None = None):
    """Collective: every rank calls it. `extra` (plain data/tensors) is saved once by rank 0.
    Under DAP only rank 0 of each DAP group writes (its peers hold the same state)."""
    path = Path(path)
    dap_peer = getattr(model, "dap_rank", 0) != 0
    tmp = path.with_name(path.name + ".tmp")
    old = path.with_name(path.name + ".old")
    model.finish_param_sync()
    if model.rank == 0 and not dap_peer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(model, "checkpoint: create directory")
    optim_files = []
    if optimizer is not None:
        # unsharded: every rank holds the full state, rank 0's copy is enough
        writers = range(model.dp) if optimizer.sharded else [0]
        optim_files = [f"optim_rank{r:05d}.pt" for r in writers]
        if model.rank in writers and not dap_peer:
            _atomic_save(optimizer.state_dict(), tmp / f"optim_rank{model.rank:05d}.pt")
    if model.rank == 0 and not dap_peer:
        _atomic_save({"model": model.module.state_dict(), "extra": extra}, tmp / MODEL_FILE)
    _barrier(model, "checkpoint: shards written")
    if model.rank == 0 and not dap_peer:
        meta = {"format": CHECKPOINT_FORMAT, "data_parallel_size": model.dp,
                "layout_hash": model.layout_hash, "optimizer_files": optim_files,
                "sharded_optimizer": bool(optimizer is not None and optimizer.sharded),
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(tmp / META_FILE, "w") as fh:
            json.dump(meta, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier(model, "checkpoint: committed")


def resolve_checkpoint(path: str | Path) -> Path:
    """The complete checkpoint directory at `path` (or its `.old` copy after a crashed swap)."""
    path = Path(path)
    for candidate in (path, path.with_name(path.name + ".old")):
        if (candidate / META_FILE).is_file():
            return candidate
    raise InputError("no complete checkpoint here (meta.json missing)", path=path)


def _read_meta(path: Path) -> dict:
    meta = read_json_object(path / META_FILE, "the checkpoint's meta object")
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}",
                         path=path / META_FILE, field="format")
    return meta


def _load_tensors(f: Path):
    """torch.load with weights_only=True; a pickled object (code) or corrupt file is an
    InputError naming the file, never unpickled and never a traceback."""
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"refused: {torch_load_refusal(exc)}", path=f) from None


def _master_weights(state) -> dict:
    """{"name[start:end]": fp32 master fragment} of one optimizer shard file: the weights a
    resume copies into the model (checked as weights, `protdp.model.weight_checks`)."""
    frags = state.get("fragments") if isinstance(state, dict) else None
    if not isinstance(frags, dict):
        return {}
    return {f"{name}[{fr.get('start')}:{fr.get('end')}]": fr["master"]
            for name, pieces in frags.items() if isinstance(pieces, list)
            for fr in pieces if isinstance(fr, dict) and "master" in fr}


def _optimizer_states(path: Path, meta: dict) -> list[dict]:
    states = []
    for name in meta["optimizer_files"]:
        f = path / name
        if not f.is_file():
            raise InputError("optimizer shard listed in meta.json is missing", path=f)
        states.append(_load_tensors(f))
        check_weights(_master_weights(states[-1]), f, "master")
    return states


def load_checkpoint(path: str | Path, model: DataParallel,
                    optimizer: DistributedOptimizer | None = None) -> dict | None:
    """Collective: load model (+ optimizer, resharded to this run's DP size); returns `extra`."""
    path = resolve_checkpoint(path)
    meta = _read_meta(path)
    model.finish_param_sync()
    blob = _load_tensors(path / MODEL_FILE)
    if not isinstance(blob, dict) or "model" not in blob:
        raise InputError("expected a dict with key 'model'", path=path / MODEL_FILE)
    check_weights(blob["model"], path / MODEL_FILE, "model")  # |w| <= MAX_WEIGHT_MAGNITUDE
    with torch.no_grad():
        try:
            model.module.load_state_dict(blob["model"])  # copies into the param buffer views
        except RuntimeError as exc:
            detail = " ".join(str(exc).split())[:600]
            raise InputError(f"the saved model does not fit this model: {detail}",
                             path=path / MODEL_FILE) from None
    if optimizer is not None:
        if not meta["optimizer_files"]:
            raise InputError("checkpoint has no optimizer state", path=path / META_FILE)
        optimizer.load_state_dict(_optimizer_states(path, meta))
    _barrier(model, "checkpoint: loaded")
    return blob["extra"]


def consolidate_optimizer(path: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """All ranks' optimizer fragments merged per parameter: {name: {key: tensor [*shape]}}."""
    path = resolve_checkpoint(path)
    meta = _read_meta(path)
    states = _optimizer_states(path, meta)
    full, covered = merge_fragments(states)
    for name, mask in covered.items():
        if not bool(mask.all()):
            raise InputError(f"parameter '{name}' is only partly covered by the shard files",
                             path=path)
    shapes = states[0]["shapes"]
    return {n: {k: v.view(shapes[n]) for k, v in d.items()} for n, d in full.items()}
