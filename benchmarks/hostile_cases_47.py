"""Hostile-input audit, round 4 (issue 47): the readers added last wave, each case classified as
in `hostile_audit.py` plus

* hang    - ran past CASE_SECONDS or past the audit's address-space limit (MemoryError): a
            small file that demanded unbounded time or memory;
* valid_change - (template mmCIF) a corruption that is itself a valid value (a coordinate
            of -3, an occupancy of 1.5): accepted, the output follows the file.

Sections: template mmCIF fields and random field corruptions (reference: the untouched file's
chain A atoms), templates.npz / templates.json (predict's reader), multimer_model.pt files
(the fine-tuning reader and the prediction loader), family and complex stores whose headers
declare huge datasets or hold NaN / empty / inconsistent data (`data verify` and the training
read), and prediction options (seeds, recycles). Only APIs that main has too are called, so
the same script measures main (the "before" numbers) and this branch.
"""

from __future__ import annotations

import copy
import os
import random
import resource
import shutil
import signal
from collections import Counter
from pathlib import Path

import numpy as np

from protdp.errors import InputError, ProtdpError

CASE_SECONDS = 30
ADDRESS_LIMIT = 8 * 1024 ** 3            # the audit process: larger allocations are hangs


class _Timeout(Exception):
    pass


def limit_memory() -> None:
    """Cap the address space (a case that allocates past it is a hang, not a crash)."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))


def run_case(fn, named) -> tuple[str, object]:
    """(outcome, value): rejected | raw | hang | accepted, the value fn returned."""
    def alarm(*_):
        raise _Timeout
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(CASE_SECONDS)
    try:
        value = fn()
    except _Timeout:
        return "hang", None
    except MemoryError:
        return "hang", None
    except ProtdpError as exc:
        one_line = "\n" not in str(exc)
        return ("rejected" if one_line and str(named) in str(exc) else "raw"), None
    except Exception as exc:   # noqa: BLE001  (the audit counts every other exception)
        return ("hang" if "memory" in type(exc).__name__.lower() else "raw"), None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return "accepted", value


# ------------------------------------------------------------------------------ templates

def _edit_cif(src, dst, category, tag, value, row=0):
    import gemmi
    doc = gemmi.cif.read(str(src))
    block = doc.sole_block()
    table = block.find_mmcif_category(category)
    tags = [t.removeprefix(category) for t in table.tags]
    rows = [list(r) for r in table]
    if tag == "*model2":
        for r in rows:
            r[tags.index("pdbx_PDB_model_num")] = "2"
    else:
        rows[row][tags.index(tag)] = value
    block.set_mmcif_category(category, {t: [r[i] for r in rows] for i, t in enumerate(tags)},
                             raw=True)
    doc.write_file(str(dst))
    return dst


def audit_template_mmcif(tmp: Path, fixture: Path) -> Counter:
    """The eight field cases of the issue, model 2 without :CHAIN, and 40 random corruptions."""
    from protdp.templates.inputs import custom_template

    cif = fixture / "templates" / "raw_inputs" / "mmcif" / "4hhb.cif"
    query = "VLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHFDLSHGSAQVKGHGKKV"
    ref, _ = custom_template(query, f"{cif}:A")
    cases = [("_atom_site.", t, v) for t, v in (
        ("auth_seq_id", "?"), ("label_seq_id", "?"), ("Cartn_x", "?"), ("Cartn_y", "nan"),
        ("Cartn_z", "inf"), ("occupancy", "abc"))] + [("_entity_poly_seq.", "num", "abc"),
                                                     ("_atom_site.", "*model2", "")]
    rng = random.Random(47)
    import gemmi
    n_atoms = len(gemmi.cif.read(str(cif)).sole_block().find_mmcif_category("_atom_site."))
    for _ in range(40):
        cases.append(("_atom_site.", rng.choice(["auth_seq_id", "label_seq_id", "Cartn_x",
                                                 "occupancy", "pdbx_PDB_model_num"]),
                      (rng.choice(["?", ".", "abc", "nan", "-inf", "1e300", "1.5", "-3"]),
                       rng.randrange(n_atoms))))
    counts: Counter = Counter()
    for k, (category, tag, value) in enumerate(cases):
        value, row = value if isinstance(value, tuple) else (value, 0)
        path = _edit_cif(cif, tmp / f"t{k}.cif", category, tag, value, row)
        spec = str(path) if tag == "*model2" else f"{path}:A"
        outcome, got = run_case(lambda: custom_template(query, spec)[0], path)
        if outcome == "accepted":
            pos = got["template_all_atom_positions"]
            same = np.array_equal(pos, ref["template_all_atom_positions"])
            bad_value = not np.isfinite(pos).all() or value in ("nan", "-inf", "1e300", "inf")
            outcome = "intact" if same else ("silent" if bad_value else "valid_change")
        counts[outcome] += 1
    return counts


def _good_templates(L, T=2):
    rng = np.random.default_rng(0)
    f = {"template_aatype": np.zeros((T, L, 22), np.float32),
         "template_all_atom_positions": np.zeros((T, L, 37, 3), np.float32),
         "template_all_atom_masks": np.zeros((T, L, 37), np.float32),
         "template_domain_names": np.array([b"1abc_A"] * T, dtype=object).astype("S8")}
    f["template_aatype"][:, :, 0] = 1
    f["template_all_atom_masks"][:, :, :5] = 1
    f["template_all_atom_positions"][:, :, :5] = rng.normal(size=(T, L, 5, 3)) * 10
    return f


def audit_templates_npz(tmp: Path) -> Counter:
    """predict's templates.npz / templates.json reader on the issue's broken files."""
    from protdp.templates.inputs import TemplateProvider

    L = 30
    query = "A" * L
    good = _good_templates(L)
    npz_cases = {
        "missing key": {k: v for k, v in good.items() if k != "template_all_atom_masks"},
        "1-D aatype": {**good, "template_aatype": np.zeros(L, np.float32)},
        "too few residues": {k: (v[:, :10] if v.ndim > 1 else v) for k, v in good.items()},
        "NaN positions": {**good, "template_all_atom_positions": np.full((2, L, 37, 3), np.nan,
                                                                         np.float32)},
        "mask width 5": {**good, "template_all_atom_masks": good["template_all_atom_masks"][..., :5]},
        "0 templates": {k: v[:0] for k, v in good.items()},
        "aatype 1e9": {**good, "template_aatype": good["template_aatype"] * 1e9}}
    json_cases = {"JSON list": "[1, 2]", "non-list templates": '{"templates": {"id": "x"}}',
                  "template not an object": '{"templates": [3]}'}
    counts: Counter = Counter()
    for k, (name, feats) in enumerate(list(npz_cases.items()) + [(n, good) for n in json_cases]):
        folder = tmp / "msas" / f"t{k}"
        folder.mkdir(parents=True)
        np.savez(folder / "templates.npz", **feats)
        (folder / "templates.json").write_text(json_cases.get(name, '{"templates": []}'))
        outcome, got = run_case(lambda: TemplateProvider(4).for_target(query, tmp / "msas",
                                                                       f"t{k}"), folder)
        counts["silent" if outcome == "accepted" else outcome] += 1
    return counts


# ------------------------------------------------------------------------------ multimer

class _Payload:
    def __reduce__(self):
        return (os.system, ("true",))


def audit_multimer_checkpoints(tmp: Path, ckpt: Path) -> Counter:
    """The issue's 12 hostile multimer_model.pt kinds plus bound and weight cases, through the
    fine-tuning reader and the prediction loader."""
    import torch

    from protdp.train.complex import read_multimer_checkpoint
    from protdp.weights.multimer_checkpoint import load_multimer

    raw = (ckpt / "multimer_model.pt").read_bytes()
    blob = torch.load(ckpt / "multimer_model.pt", weights_only=True)
    first = next(iter(blob["state_dict"]))
    edits = {"code": lambda b: b.update(extra=_Payload()), "no kind": lambda b: b.pop("kind"),
             "no config": lambda b: b.pop("multimer_config"),
             "no state": lambda b: b.pop("state_dict"),
             "no trunk": lambda b: b["multimer_config"].pop("trunk"),
             "masking list": lambda b: b["multimer_config"].update(masking=[0.1]),
             "masking key": lambda b: b["multimer_config"].update(masking={"evil": 1}),
             "masking str": lambda b: b["multimer_config"]["masking"].update(uniform_prob="x"),
             "state list": lambda b: b.update(state_dict=[1, 2]),
             "1e30 weight": lambda b: b["state_dict"][first].fill_(1e30),
             "num_msa 1e9": lambda b: b["multimer_config"].update(num_msa=10 ** 9),
             "blocks 1e7": lambda b: b["multimer_config"]["trunk"].update(n_blocks=10 ** 7)}
    files = {"truncated": raw[: len(raw) // 2], "empty": b"", "random": os.urandom(4096)}
    for name, edit in edits.items():
        b = copy.deepcopy(blob)
        edit(b)
        torch.save(b, tmp / "x.pt")
        files[name] = (tmp / "x.pt").read_bytes()
    counts: Counter = Counter()
    for k, (name, data) in enumerate(files.items()):
        folder = tmp / f"mm{k}"
        folder.mkdir()
        (folder / "multimer_model.pt").write_bytes(data)
        for reader in (read_multimer_checkpoint, load_multimer):
            outcome, _ = run_case(lambda: reader(folder), folder)
            counts["silent" if outcome == "accepted" else outcome] += 1
    return counts


# ------------------------------------------------------------------------------ stores

def _declare(g, name, shape, dtype):
    del g[name]
    chunks = tuple(max(1, min(s, 64)) for s in shape) if all(shape) else None
    g.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks,
                     compression="gzip" if chunks else None)


def audit_family_store(tmp: Path, store: Path) -> Counter:
    """Declared-size inflation, empty and inconsistent families: `data verify` (verify_store)
    and the training read (FamilyStore.read), each case."""
    import h5py

    from protdp.data.store import FamilyStore, verify_store

    def positions(g, h5):
        _declare(g, "all_atom_positions", (45_000_000, 37, 3), np.float32)

    def msa_huge(g, h5):
        for n in ("msa", "deletion_matrix"):
            _declare(g, n, (2 ** 31 - 1, int(g.attrs["length"])), np.uint8)
        g.attrs["num_seq"] = 2 ** 31 - 1

    def zero_rows(g, h5):
        for n in ("msa", "deletion_matrix"):
            _declare(g, n, (0, int(g.attrs["length"])), np.uint8)
        g.attrs["num_seq"] = 0

    def index_short(g, h5):
        lengths = h5["index/length"][()]
        del h5["index/length"]
        h5["index/length"] = np.concatenate([lengths, lengths])

    def string_version(g, h5):
        h5.attrs["format_version"] = "2"

    def template_nan(g, h5):
        L = int(g.attrs["length"])
        t = g.create_group("templates")
        t["aatype"] = np.zeros((1, L), np.int8)
        t["all_atom_positions"] = np.full((1, L, 37, 3), np.nan, np.float32)
        t["all_atom_mask"] = np.ones((1, L, 37), np.uint8)
        t.create_dataset("domain_names", data=np.array(["x_A"], dtype=object),
                         dtype=h5py.string_dtype())

    counts: Counter = Counter()
    for k, damage in enumerate((positions, msa_huge, zero_rows, index_short, string_version,
                                template_nan)):
        path = tmp / f"s{k}.h5"
        shutil.copy(store, path)
        fid = FamilyStore(path).family_ids[0]
        with h5py.File(path, "r+") as h5:
            damage(h5["families"][fid], h5)
        outcome, report = run_case(lambda: verify_store(path), path)
        if outcome == "accepted":
            outcome = "rejected" if not report.ok else "silent"
        counts[outcome] += 1
        outcome, _ = run_case(lambda: FamilyStore(path).read(fid), path)
        counts["silent" if outcome == "accepted" and damage is not index_short
               else outcome if outcome != "accepted" else "intact"] += 1
    return counts


def audit_complex_store(tmp: Path, store: Path) -> Counter:
    """The same for a complex store, plus 12 random declared-size inflations and value flips:
    verify_complex_store and ComplexStore.read."""
    import h5py

    from protdp.complex.store import ComplexStore, verify_complex_store

    rng = random.Random(47)
    names = ["msa", "deletion_matrix", "residue_index", "all_atom_positions", "all_atom_mask"]
    ref = ComplexStore(store)
    reference = {c: ref.read(c) for c in ref.complex_ids}
    counts: Counter = Counter()
    for k in range(16):
        path = tmp / f"c{k}.h5"
        shutil.copy(store, path)
        with h5py.File(path, "r+") as h5:
            cid = sorted(h5["complexes"])[0] if k < 4 else rng.choice(sorted(h5["complexes"]))
            cg = h5["complexes"][cid]["0"]
            L = int(cg["msa"].shape[1])
            if k == 0:
                for n in ("msa", "deletion_matrix"):
                    _declare(cg, n, (2 ** 31 - 1, L), np.uint8)
            elif k == 1:
                _declare(cg, "all_atom_positions", (45_000_000, 37, 3), np.float32)
            elif k == 2:
                for n in ("msa", "deletion_matrix"):
                    _declare(cg, n, (0, L), np.uint8)
            elif k == 3:
                pos = cg["all_atom_positions"][()]
                pos[0, 1, 0] = np.nan
                cg["all_atom_positions"][...] = pos
            elif k % 2:
                name = rng.choice(names)
                shape = list(cg[name].shape)
                shape[rng.randrange(len(shape))] *= 10 ** rng.randint(3, 7)
                _declare(cg, name, tuple(shape), cg[name].dtype)
            else:
                name = rng.choice(names)
                a = cg[name][()]
                a.view(np.uint8).flat[rng.randrange(a.nbytes)] ^= 1 << rng.randrange(8)
                cg[name][...] = a
        outcome, problems = run_case(lambda: verify_complex_store(path), path)
        if outcome == "accepted":
            outcome = "rejected" if problems else "silent"
        counts[outcome] += 1
        outcome, got = run_case(lambda: ComplexStore(path).read(cid), path)
        if outcome == "accepted":
            same = all(np.array_equal(a[n], b[n]) for a, b in
                       zip(got["chains"], reference[cid]["chains"]) for n in names)
            outcome = "intact" if same else "silent"
        counts[outcome] += 1
    return counts


# ------------------------------------------------------------------------------ options

def audit_predict_options() -> Counter:
    """--random-seed -1 / 2^64 / 2^32 and --num-recycles 10^9: refused before any work, or
    accepted (silent: main predicts seed 0's structure for 2^64, or never ends). And
    --num-recycles 200 (the bound) with a deep MSA: intact when the predictor's features hold
    no more than with 1 recycle (main built 201 MSA samples up front: a hang)."""
    from protdp.inference.predictor import PredictConfig

    counts: Counter = Counter()
    for kw in ({"seed": -1}, {"seed": 2 ** 64}, {"seed": 2 ** 32}, {"num_recycles": 10 ** 9}):
        try:
            PredictConfig(**kw)
        except (ProtdpError, ValueError):
            counts["rejected"] += 1
            continue
        counts["silent"] += 1
    outcome, held = run_case(lambda: _features_bytes(200), "num_recycles")
    counts["intact" if outcome == "accepted" and held <= _features_bytes(1) else "hang"] += 1
    return counts


def _features_bytes(num_recycles: int, L: int = 200, rows: int = 3000) -> int:
    """Bytes the predictor's features of a target with a `rows`-deep synthetic MSA hold
    (tensors, and the arrays of any other value) at PredictConfig's defaults."""
    from types import SimpleNamespace

    from protdp.data.parse import Msa
    from protdp.inference.predictor import PredictConfig, Predictor
    rng = np.random.default_rng(47)
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY-"))
    tokens = rng.integers(0, 21, (rows, L))
    tokens[0] = tokens[0] % 20
    msa = Msa(["".join(letters[r]) for r in tokens], np.zeros((rows, L), np.uint8),
              [str(i) for i in range(rows)])
    pred = SimpleNamespace(config=PredictConfig(num_recycles=num_recycles), loaded=None)
    feats = Predictor.features(pred, msa.query, msa, "deep")
    return sum(v.nbytes if hasattr(v, "nbytes") else
               sum(a.nbytes for a in vars(v).values() if isinstance(a, np.ndarray))
               for v in feats.values() if not isinstance(v, str))


def sections(tmp: Path, fixture: Path, family_store: Path, complex_store: Path,
             multimer_ckpt: Path, only: str | None = None) -> dict:
    """Every round-4 section (or the one named `only`) -> its outcome counts."""
    out = {}
    for name, fn in (("template_mmcif", lambda: audit_template_mmcif(tmp, fixture)),
                     ("templates_npz_json", lambda: audit_templates_npz(tmp)),
                     ("multimer_checkpoints", lambda: audit_multimer_checkpoints(
                         tmp, multimer_ckpt)),
                     ("family_store_declared_sizes", lambda: audit_family_store(
                         tmp, family_store)),
                     ("complex_store", lambda: audit_complex_store(tmp, complex_store)),
                     ("predict_options", audit_predict_options)):
        if only is not None and name != only:
            continue
        sub = tmp / name
        sub.mkdir()
        tmp_saved, tmp = tmp, sub
        out[name] = dict(fn())
        tmp = tmp_saved
        print(name, out[name], flush=True)
    return out
