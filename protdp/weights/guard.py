"""What `protdp weights import` checks before it writes (issue 47): imported values within
MAX_WEIGHT_MAGNITUDE (a 1e30 weight overflows every forward pass to NaN), and one kind of
checkpoint per folder - a folder holding `model.pt` (monomer) is not given a
`multimer_model.pt` or the other way round, since `predict` would pick one of them while
provenance.json describes the last import."""

from __future__ import annotations

from pathlib import Path

from protdp.errors import InputError
from protdp.model.weight_checks import weights_problem

FOLDER_FILES = {"monomer": "model.pt", "multimer": "multimer_model.pt"}


def check_import(state: dict, source, out, kind: str) -> None:
    """InputError when the imported `state` holds unusable values or `out` already holds a
    checkpoint of the other kind."""
    problem = weights_problem(state)
    if problem:
        raise InputError(f"refused: {problem}", path=source)
    out = Path(out)
    for other, name in FOLDER_FILES.items():
        if other != kind and (out / name).exists():
            raise InputError(f"--out already holds a {other} checkpoint ({name}); a folder holds "
                             f"one kind, so this {kind} import goes to another folder (or "
                             f"remove {out / name} first)", path=out)
