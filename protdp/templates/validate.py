"""Template features checked at the door (issue 47): every `templates.npz` / `templates.json`
that prediction or `protdp templates add-to-store` reads, and every template group a store
holds, is refused with one line naming the file and the key unless it has AlphaFold's template
layout (`protdp.templates.featurize`):

    template_aatype              float [T, L, 22]   one-hot (HHblits order; 21 = gap)
    template_all_atom_positions  float [T, L, 37, 3] finite, |x| <= COORD_LIMIT (Å)
    template_all_atom_masks      float [T, L, 37]   0 / 1

with T in [1, MAX_TEMPLATES] and L the target's (family's) length. A NaN coordinate would
otherwise make every pLDDT NaN, and a short or mis-shaped array crash a batch or poison
training silently.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from protdp.data.atoms import COORD_LIMIT
from protdp.data.bounds import MAX_TEMPLATES
from protdp.data.npz_headers import HEADER_ERRORS, declared_problem, read_npz, read_npz_headers
from protdp.data.residue_constants import NUM_ATOM37
from protdp.errors import InputError
from protdp.fileio import read_json_object

AATYPE_CLASSES = 22                   # HHblits alphabet: 20 amino acids, X, gap
FEATURE_KEYS = ("template_aatype", "template_all_atom_positions", "template_all_atom_masks")
FEATURES_WHAT = "template features file"


TRAILING_SHAPES = {"template_aatype": (AATYPE_CLASSES,),                 # [T, L, *tail]
                   "template_all_atom_positions": (NUM_ATOM37, 3),
                   "template_all_atom_masks": (NUM_ATOM37,)}
NAMES_KEY = "template_domain_names"   # [T] bytes, read by `protdp templates add-to-store`
MAX_NAME_BYTES = 1024                 # one domain name ("1abc_A"; PDB ids are 4 + chain)


def shape_problem(key: str, shape: tuple, length: int, what: str = "target") -> str | None:
    """Why one template array's shape is not [T, length, *TRAILING_SHAPES[key]] with T <=
    MAX_TEMPLATES (None: it is); the same words for a declared (header) and a loaded shape."""
    tail = TRAILING_SHAPES[key]
    if len(shape) != 2 + len(tail) or tuple(shape[2:]) != tail:
        return f"{key} has shape {tuple(shape)}, expected [T, {length}, " \
               f"{', '.join(map(str, tail))}]"
    if shape[1] != length:
        return f"{key} covers {shape[1]} residues, the {what} has {length}"
    if shape[0] > MAX_TEMPLATES:
        return f"{key} has {shape[0]} templates (expected 1 to {MAX_TEMPLATES}, " \
               "protdp.data.bounds)"
    return None


def header_problem(path: Path, length: int, what: str = "target",
                   data: bytes | None = None) -> str | None:
    """Why a templates.npz's member headers cannot describe template features of a
    `length`-residue target (None: its arrays may be loaded): declared bytes
    (`protdp.data.npz_headers`) and declared shapes (`shape_problem`) checked before np.load
    allocates what they declare."""
    try:
        headers = read_npz_headers(path if data is None else io.BytesIO(data),
                                   set(FEATURE_KEYS) | {NAMES_KEY})
    except HEADER_ERRORS as exc:
        text = str(exc).strip().splitlines()
        return f"unreadable template features: {text[0][:200] if text else type(exc).__name__}"
    for key, h in headers.items():
        problem = declared_problem(key, h)
        if problem:
            return problem
        if key == NAMES_KEY:
            if len(h.shape) != 1 or h.shape[0] > MAX_TEMPLATES or \
                    h.dtype.itemsize > MAX_NAME_BYTES:
                return (f"{key} declares shape {h.shape} ({h.dtype}), expected [T <= "
                        f"{MAX_TEMPLATES}] names of up to {MAX_NAME_BYTES} bytes")
        else:
            problem = shape_problem(key, h.shape, length, what)
            if problem:
                return problem
    return None


def feature_problem(feats: dict, length: int, what: str = "target") -> str | None:
    """Why `feats` are not template features of a `length`-residue target (None: they are)."""
    missing = [k for k in FEATURE_KEYS if k not in feats]
    if missing:
        return f"key {missing[0]} missing"
    T = None
    for key in TRAILING_SHAPES:
        a = feats[key]
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf":
            return f"{key} is not a numeric array"
        problem = shape_problem(key, a.shape, length, what)
        if problem:
            return problem
        if T is not None and a.shape[0] != T:
            return f"{key} has {a.shape[0]} templates, template_aatype has {T}"
        T = a.shape[0]
    if not 1 <= T <= MAX_TEMPLATES:
        return f"{T} templates (expected 1 to {MAX_TEMPLATES}, protdp.data.bounds)"
    pos, mask = feats["template_all_atom_positions"], feats["template_all_atom_masks"]
    if not np.isfinite(pos).all() or (np.abs(pos) > COORD_LIMIT).any():
        return f"template_all_atom_positions holds NaN/Inf or |x| > {COORD_LIMIT:g} Å"
    if not np.isin(mask, (0, 1)).all():
        return "template_all_atom_masks is not 0/1"
    aatype = feats["template_aatype"]
    if not np.isin(aatype, (0, 1)).all() or (aatype.sum(-1) > 1).any():
        return "template_aatype is not a one-hot [T, L, 22] array (values other than 0/1)"
    return None


def check_features(feats: dict, length: int, path, what: str = "target") -> dict:
    """`feats` if they are template features of a `length`-residue target, else InputError."""
    problem = feature_problem(feats, length, what)
    if problem:
        raise InputError(f"not usable template features: {problem}", path=path)
    return feats


def read_features(path: Path, length: int, what: str = "target",
                  data: bytes | None = None) -> dict:
    """The template keys of one templates.npz (never unpickled; parsed from `data`, its bytes
    read earlier, when given), checked: the member headers first (`header_problem`: nothing
    allocated beyond what the file holds), then the arrays (`check_features`)."""
    problem = header_problem(path, length, what, data)
    if problem:
        raise InputError(f"not usable template features: {problem}", path=path)
    feats = read_npz(path if data is None else data, FEATURES_WHAT, keys=FEATURE_KEYS,
                     path=path)                                  # headers checked again there
    return check_features(feats, length, path, what)


def read_domain_names(path: Path) -> np.ndarray:
    """The [T] template_domain_names of one templates.npz (`protdp templates add-to-store`),
    through the one header-checked reader (`protdp.data.npz_headers.read_npz`)."""
    names = read_npz(path, FEATURES_WHAT, keys=(NAMES_KEY,))
    if NAMES_KEY not in names:
        raise InputError(f"not usable template features: key {NAMES_KEY} missing", path=path)
    return names[NAMES_KEY]


def read_record(path: Path, data: bytes | None = None) -> dict:
    """templates.json (or `data`, its bytes read earlier): an object whose `templates` is a
    list of objects (id, chain, ...)."""
    try:
        record = read_json_object(path, "a template record object", data)
    except OSError as exc:
        raise InputError(f"unreadable template record: {exc.strerror or exc}", path=path) from None
    templates = record.get("templates", [])
    if not isinstance(templates, list) or not all(
            isinstance(t, dict) and isinstance(t.get("id"), str) and isinstance(t.get("chain"), str)
            for t in templates):
        raise InputError("'templates' must be a list of objects with string 'id' and 'chain'",
                         path=path, field="templates")
    return record


def real_templates(feats: dict) -> int:
    """Templates with any atom (AlphaFold's no-template placeholder row has none)."""
    mask = np.asarray(feats["template_all_atom_masks"])
    return int((mask.reshape(mask.shape[0], -1) > 0).any(-1).sum()) if mask.size else 0
