"""Held-out data of a checkpoint under judgement: the explicit `--data` / `--families`, or the
training run's own validation split recomputed from its recorded config (the same store, seed
and fraction). Shared by the release gate (`protdp.safety.release`, `complex_release`) and the
calibration report (`protdp.safety.calibration`), which is why it lives in neither.
"""

from __future__ import annotations

from pathlib import Path

from protdp.config import from_dict
from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.train.args import TrainArgs
from protdp.train.trainer import split_families


def held_out(trained_meta: dict, data: str | Path | None, families: list[str] | None,
             open_store=FamilyStore) -> tuple[Path, list[str]]:
    """(store, held-out ids): explicit ones, or the training run's validation split
    (`open_store`: FamilyStore, or ComplexStore for a multimer checkpoint)."""
    config = trained_meta.get("config") or {}
    store = Path(data) if data else (Path(config["data"]) if config.get("data") else None)
    if store is None:
        raise InputError("no held-out data: give --data STORE (and --families) for a checkpoint "
                         "that is not a training run", field="--data")
    if families is not None:
        return store, families
    if not config.get("data"):
        raise InputError("give --families: the checkpoint records no validation split",
                         field="--families")
    args = from_dict(TrainArgs, {k: v for k, v in config.items()
                                 if k in TrainArgs.__dataclass_fields__}, source="meta.json")
    with open_store(store) as s:
        held = split_families(list(s.family_ids), args)[1]
    if not held:
        raise InputError("the training run held out nothing (--val-fraction 0 and no "
                         "--val-families): give --families", field="--families")
    return store, held
