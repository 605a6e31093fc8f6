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

Besides the PAE file and the structure, each target names the files that feed its numbers
(`siblings`, {role: path}, the same names `protdp.interface.readers.sibling_files` finds), so
`protdp gate` reads, copies and binds every one of them. A target whose files are incomplete is
returned with `problem` set (the batch records it and goes on). A target name is text: bytes of
a file name that are not UTF-8 become backslash escapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from protdp.errors import InputError
from protdp.interface.inputs import read_input_bytes
from protdp.interface.readers import sibling_files

SOURCES = ("colabfold", "alphafold2", "alphafold3", "boltz")


@dataclass(frozen=True)
class Found:
    target: str
    pae: Path | None
    structure: Path | None
    siblings: dict = field(default_factory=dict)  # {"summary"|"plddt"|"ranking": path}
    problem: str | None = None
    model: str | None = None                      # AlphaFold2: ranking_debug.json's order[0]


def _text(name: str) -> str:
    """A name from a file name as valid text (undecodable bytes as \\xNN escapes)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _colabfold(root: Path) -> list[Found]:
    out = []
    for scores in sorted(root.rglob("*_scores_rank_001_*.json")):
        target, _, rest = scores.name.partition("_scores_rank_001_")
        model = rest.removesuffix(".json")
        candidates = [scores.with_name(f"{target}_{kind}_rank_001_{model}.pdb")
                      for kind in ("unrelaxed", "relaxed")]
        structure = next((p for p in candidates if p.is_file()), None)
        out.append(Found(_text(target), scores, structure, problem=None if structure else
                         f"no {candidates[0].name} beside {scores}"))
    return out


def _alphafold2(root: Path) -> list[Found]:
    out = []
    for debug in sorted(root.rglob("ranking_debug.json")):
        folder, target = debug.parent, _text(debug.parent.name)
        try:
            model = ranked_first(read_input_bytes(debug, root), debug)
        except InputError as exc:
            out.append(Found(target, None, None, problem=str(exc)))
            continue
        pae, ranked = folder / f"pae_{model}.json", folder / "ranked_0.pdb"
        conf = folder / f"confidence_{model}.json"
        missing = [p.name for p in (pae, ranked, conf) if not p.is_file()]
        out.append(Found(target, pae, ranked, {"plddt": conf, "ranking": debug},
                         problem=f"{folder}: missing {', '.join(missing)}" if missing else None,
                         model=model))
    return out


def _alphafold3(root: Path) -> list[Found]:
    out = []
    for conf in sorted(root.rglob("*_confidences.json")):
        if conf.name.endswith("_summary_confidences.json"):
            continue
        target = conf.name.removesuffix("_confidences.json")
        out.append(_af3_found(target, conf, conf.with_name(f"{target}_model.cif")))
    for full in sorted(root.rglob("*_full_data_0.json")):
        target = full.name.removesuffix("_full_data_0.json")
        out.append(_af3_found(target.removeprefix("fold_"), full,
                              full.with_name(f"{target}_model_0.cif")))
    return out


def _af3_found(target, pae: Path, cif: Path) -> Found:
    return Found(_text(target), pae, cif if cif.is_file() else None,
                 sibling_files(pae, "alphafold3"),
                 problem=None if cif.is_file() else f"no {cif.name} beside {pae}")


def _boltz(root: Path) -> list[Found]:
    out = []
    for pae in sorted(root.rglob("pae_*_model_0.npz")):
        stem = pae.name.removeprefix("pae_").removesuffix(".npz")
        structure = next((p for p in (pae.with_name(f"{stem}.cif"), pae.with_name(f"{stem}.pdb"))
                          if p.is_file()), None)
        out.append(Found(_text(stem.removesuffix("_model_0")), pae, structure,
                         sibling_files(pae, "boltz"),
                         problem=None if structure else f"no {stem}.cif or .pdb beside {pae}"))
    return out


def ranked_first(data: bytes, path: Path) -> str:
    """The top model (`order[0]`) of AlphaFold2's ranking_debug.json bytes."""
    try:
        model = json.loads(data)["order"][0]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        model = None
    if not isinstance(model, str) or not model or "/" in model or "\\" in model \
            or "\x00" in model or model in (".", ".."):
        raise InputError("no readable 'order' (a list of model names)", path=path)
    return model


def discover(root: str | Path, source: str) -> list[Found]:
    """Every target's top-ranked prediction under `root` in `source`'s layout."""
    finders = {"colabfold": _colabfold, "alphafold2": _alphafold2, "alphafold3": _alphafold3,
               "boltz": _boltz}
    return finders[source](Path(root))
