"""Checks of imported parameter files before any conversion: one clear line naming the file and
the key for every malformed input, and no allocation a file's header merely asks for.

* `.npz` (AlphaFold): every zip member's `.npy` header is read first (`npz_headers`): duplicate
  members (np.load silently keeps the last), object / integer / complex / 0-d arrays, and a
  header whose declared shape needs more bytes than the member holds (np.load would allocate
  the declared size first: a `MemoryError`) are refused before any array is read.
* OpenFold `.pt` state dicts (`check_tensors`): meta tensors (no values), sparse tensors and
  non-float dtypes (integer; complex would silently lose its imaginary part) are refused;
  `check_complete` names a missing parameter in OpenFold's own spelling instead of a raw
  `KeyError` from the parameter table.
* `naming(path)`: any InputError raised inside gets the file's name; a `KeyError` of the
  parameter table becomes "parameter is missing" naming the key.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterable, Mapping

from protdp.data.npz_headers import (HEADER_ERRORS, DuplicateMember, declared_problem,
                                     read_npz_headers)
from protdp.errors import InputError
from protdp.model.weight_checks import value_problem

FLOAT_KINDS = ("f",)                 # numpy dtype kinds a parameter array may have


def npz_file(path: str | Path, what: str = "parameter file") -> Path:
    """`path` if it is a file; a folder or a missing path is one error naming it as `what`."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"a directory, not an .npz {what}", path=path)
    if not path.is_file():
        raise InputError(f"{what} not found", path=path)
    return path


def npz_headers(path: str | Path) -> dict[str, tuple]:
    """{key: shape} of every array of an .npz from its member headers only
    (`protdp.data.npz_headers`), each checked: a float dtype, at least one axis, a declared
    size the member really holds, no duplicates."""
    path = npz_file(path)
    try:
        headers = read_npz_headers(path)
    except DuplicateMember as exc:
        raise InputError("the archive holds this array twice (duplicate zip member); refusing "
                         "to guess which one is meant", path=path, field=exc.key) from None
    except HEADER_ERRORS as exc:
        raise InputError(f"not a readable .npz parameter file ({type(exc).__name__}: {exc})",
                         path=path) from None
    for key, header in headers.items():
        dtype = header.dtype
        if dtype.hasobject or dtype.kind not in FLOAT_KINDS:
            raise InputError(f"dtype {dtype} is not a floating-point parameter array",
                             path=path, field=key)
        if not header.shape:
            raise InputError("a 0-d (scalar) array, expected a parameter array with "
                             "at least one axis", path=path, field=key)
        problem = declared_problem(key, header)
        if problem:
            raise InputError(problem.removeprefix(f"{key}: "), path=path, field=key)
    return {key: header.shape for key, header in headers.items()}


def check_tensors(state: Mapping, path: str | Path) -> None:
    """Every value a dense, real floating-point tensor holding finite values within
    MAX_WEIGHT_MAGNITUDE (`protdp.model.weight_checks`)."""
    import torch

    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise InputError(f"a {type(value).__name__}, expected a tensor", path=path,
                             field=key)
        if value.is_meta:
            raise InputError("a meta tensor (a shape without values); save the real weights",
                             path=path, field=key)
        if value.layout != torch.strided:
            raise InputError(f"a sparse tensor ({value.layout}); save it dense (.to_dense())",
                             path=path, field=key)
        if value.is_complex() or not value.is_floating_point():
            raise InputError(f"dtype {value.dtype} is not a real floating-point parameter",
                             path=path, field=key)
        problem = value_problem(key, value)   # finite, |w| <= MAX_WEIGHT_MAGNITUDE
        if problem:
            raise InputError(problem, path=path, field=key)


def check_complete(state: Mapping, expected: Iterable[str], source_name: Callable[[str], str],
                   ignore_prefix: str = "") -> None:
    """InputError naming the first parameter of `expected` (protdp names) `state` lacks, in the
    source's own spelling (`source_name`)."""
    missing = sorted(k for k in expected if k not in state and
                     not (ignore_prefix and k.startswith(ignore_prefix)))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"parameter is missing{more}", field=source_name(missing[0]))


@contextlib.contextmanager
def naming(path: str | Path):
    """Errors inside name `path`: an InputError without a file gets it; a KeyError of the
    parameter tables (a parameter the file lacks) becomes one line naming the key."""
    try:
        yield
    except InputError as exc:
        if exc.path is not None:
            raise
        raise InputError(exc.reason, path=path, field=exc.field) from None
    except KeyError as exc:
        key = exc.args[0] if exc.args else "?"
        raise InputError("parameter is missing", path=path, field=str(key)) from None
