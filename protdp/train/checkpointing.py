"""Run-level checkpoints: atomic, keep-last-K, exact resume (Megatron `--save/--load` layout).

    SAVE/latest_checkpointed_iteration.txt     # Megatron's tracker file, replaced atomically
    SAVE/iter_0000020/meta.json                # iteration, config, code version, world size (written last)
    SAVE/iter_0000020/engine/                  # protdp.parallel.save_checkpoint: model.pt (once)
                                               #   + each rank's optimizer shard, reshardable
    SAVE/iter_0000020/ema.pt                   # EMA weights (rank 0)
    SAVE/iter_0000020/rank_00001.pt            # per-rank sampler state and RNG states

All ranks write into `iter_N.tmp/`; after a barrier rank 0 writes `meta.json`, renames the
folder to `iter_N` and only then points the tracker at it, so a crash at any moment leaves
the previous checkpoint loadable. Loading picks the newest folder holding `meta.json`.
Model and optimizer shards are saved and loaded by `protdp.parallel` in a layout-independent form,
so a run may resume at another data-parallel size; RNG states of ranks that did not exist in
the saved run are derived from the seed.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from protdp.errors import ConfigError

TRACKER = "latest_checkpointed_iteration.txt"
ENGINE = "engine"
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


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(save_dir: Path) -> list[int]:
    """Iterations of complete checkpoints (those with meta.json), ascending."""
    if not save_dir.is_dir():
        return []
    its = []
    for p in save_dir.iterdir():
        m = _ITER_RE.match(p.name)
        if m and (p / "meta.json").exists():
            its.append(int(m.group(1)))
    return sorted(its)


def latest_checkpoint(load_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder under `load_dir` (tracker first, then a scan)."""
    load_dir = Path(load_dir)
    tracker = load_dir / TRACKER
    if tracker.exists():
        text = tracker.read_text().strip()
        if text.isdigit() and (load_dir / iter_dir_name(int(text)) / "meta.json").exists():
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
    torch.save({**rank_state, "rng": rng_state()}, tmp / f"rank_{saver.rank:05d}.pt")
    if saver.rank == 0:
        torch.save(ema_state, tmp / "ema.pt")
    saver.barrier()
    if saver.rank == 0:
        meta = {"iteration": iteration, "world_size": saver.world_size, "config": config,
                "code_version": code_version(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if final.exists():  # re-saving an iteration (e.g. after a restart): replace it
            shutil.rmtree(final)
        tmp.rename(final)
        tracker_tmp = save_dir / (TRACKER + ".tmp")
        tracker_tmp.write_text(str(iteration))
        tracker_tmp.replace(save_dir / TRACKER)
        for old in list_checkpoints(save_dir)[:-saver.keep_last]:
            shutil.rmtree(save_dir / iter_dir_name(old), ignore_errors=True)
    saver.barrier()
    return final


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
    meta_path = path / "meta.json"
    if not meta_path.exists():
        raise ConfigError(f"{path}: not a complete checkpoint (no meta.json)")
    meta = json.loads(meta_path.read_text())
    rank_file = path / f"rank_{rank:05d}.pt"
    # onto the CPU: the saving rank's GPU may not exist here (RNG states are CPU tensors anyway;
    # the EMA moves itself onto the model's device)
    rank_state = (torch.load(rank_file, map_location="cpu", weights_only=False)
                  if rank_file.exists() else None)
    return Loaded(path=path, iteration=int(meta["iteration"]), meta=meta,
                  ema_state=torch.load(path / "ema.pt", map_location="cpu", weights_only=True),
                  rank_state=rank_state)
