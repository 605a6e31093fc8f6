"""The top-ranked prediction of every target in a folder of another tool's outputs:

* `colabfold`:  `<t>_scores_rank_001_<model>.json` + `<t>_unrelaxed_rank_001_<model>.pdb`
  (or `_relaxed_`), ColabFold's batch layout (one folder, searched recursively);
* `alphafold2`: a folder per target with `ranking_debug.json` (its `order[0]` is the top
  model), `ranked_0.pdb`, `pae_<model>.json` (AlphaFold >= 2.3; `result_*.pkl` is never
  unpickled) and `confidence_<model>.json` (pLDDT);
* `alphafold3`: `<t>_confidences.json` + `<t>_model.cif` (+ `<t>_summary_confidences.json`),
  AlphaFold 3's top-level files, or the server's `fold_<t>_full_data_0.json` +
  `fold_<t>_model_0.cif` (+ `_summary_confidences_0.json`);
* `boltz`: `pae_<t>_model_0.npz` + `<t>_model_0.cif` (or `.pdb`) (+ `plddt_*.npz`,
  `confidence_*.json`).

A target whose files are incomplete is returned with `problem` set (the batch records it and
goes on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("colabfold", "alphafold2", "alphafold3", "boltz")


@dataclass(frozen=True)
class Found:
    target: str
    pae: Path | None
    structure: Path | None
    extra: dict = field(default_factory=dict)   # {"confidence": path, "summary": path}
    problem: str | None = None


def _colabfold(root: Path) -> list[Found]:
    out = []
    for scores in sorted(root.rglob("*_scores_rank_001_*.json")):
        target, _, rest = scores.name.partition("_scores_rank_001_")
        model = rest.removesuffix(".json")
        candidates = [scores.with_name(f"{target}_{kind}_rank_001_{model}.pdb")
                      for kind in ("unrelaxed", "relaxed")]
        structure = next((p for p in candidates if p.is_file()), None)
        out.append(Found(target, scores, structure, problem=None if structure else
                         f"no {candidates[0].name} beside {scores}"))
    return out


def _alphafold2(root: Path) -> list[Found]:
    out = []
    for debug in sorted(root.rglob("ranking_debug.json")):
        folder, target = debug.parent, debug.parent.name
        try:
            model = json.loads(debug.read_text())["order"][0]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            out.append(Found(target, None, None, problem=f"{debug}: no readable 'order'"))
            continue
        pae, ranked = folder / f"pae_{model}.json", folder / "ranked_0.pdb"
        missing = [p.name for p in (pae, ranked) if not p.is_file()]
        conf = folder / f"confidence_{model}.json"
        out.append(Found(target, pae, ranked,
                         {"confidence": conf} if conf.is_file() else {},
                         problem=f"{folder}: missing {', '.join(missing)}" if missing else None))
    return out


def _alphafold3(root: Path) -> list[Found]:
    out = []
    for conf in sorted(root.rglob("*_confidences.json")):
        if conf.name.endswith("_summary_confidences.json"):
            continue
        target = conf.name.removesuffix("_confidences.json")
        out.append(_af3_found(target, conf, conf.with_name(f"{target}_model.cif"),
                              conf.with_name(f"{target}_summary_confidences.json")))
    for full in sorted(root.rglob("*_full_data_0.json")):
        target = full.name.removesuffix("_full_data_0.json")
        out.append(_af3_found(target.removeprefix("fold_"), full,
                              full.with_name(f"{target}_model_0.cif"),
                              full.with_name(f"{target}_summary_confidences_0.json")))
    return out


def _af3_found(target, pae: Path, cif: Path, summary: Path) -> Found:
    return Found(target, pae, cif if cif.is_file() else None,
                 {"summary": summary} if summary.is_file() else {},
                 problem=None if cif.is_file() else f"no {cif.name} beside {pae}")


def _boltz(root: Path) -> list[Found]:
    out = []
    for pae in sorted(root.rglob("pae_*_model_0.npz")):
        stem = pae.name.removeprefix("pae_").removesuffix(".npz")
        structure = next((p for p in (pae.with_name(f"{stem}.cif"), pae.with_name(f"{stem}.pdb"))
                          if p.is_file()), None)
        conf = pae.with_name(f"confidence_{stem}.json")
        out.append(Found(stem.removesuffix("_model_0"), pae, structure,
                         {"summary": conf} if conf.is_file() else {},
                         problem=None if structure else f"no {stem}.cif or .pdb beside {pae}"))
    return out


def discover(root: str | Path, source: str) -> list[Found]:
    """Every target's top-ranked prediction under `root` in `source`'s layout."""
    finders = {"colabfold": _colabfold, "alphafold2": _alphafold2, "alphafold3": _alphafold3,
               "boltz": _boltz}
    return finders[source](Path(root))
