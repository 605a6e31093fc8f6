"""Hostile-input audit, rounds 3 (issue 28) and 4 (issue 47, `--round4`): corrupt variants of
real files fed end to end, each outcome classified as

* rejected  - one clean line (or reject record) naming the file,
* raw       - a Python / library message or an exception that is not protdp's InputError,
* silent    - accepted but wrong (residues lost, a short family, a replaced device node),
* intact    - accepted and equal to the original (a cut at a record boundary, say).

Cases: 300 random cut points of a real a3m (family built against its structure), 300 of a
header-less PDB, every one-key removal of an OpenFold export plus the bad tensor / npz kinds,
hostile YAML, hostile sequence databases for `msa search`, and a device node given to every
output writer (as root). Writes benchmarks/results/hostile_audit.json; exit 1 when any raw or
silent outcome remains.

Round 4 (issue 47, `--round4 LABEL`): template mmCIF / templates.npz / multimer_model.pt /
family and complex stores / predict options (benchmarks/hostile_cases_47.py), with a `hang`
outcome for a case past 30 s or 8 GiB; written under `round4_LABEL` (after, main_d2865ec;
the weight loaders: main_c7d6e3f).

    .venv/bin/python benchmarks/hostile_audit.py
    .venv/bin/python benchmarks/hostile_audit.py --round4 after
    .venv/bin/python benchmarks/hostile_audit.py --round4 after --only weight_magnitude

`--only SECTION` runs one round-4 section (a name of `hostile_cases_47.sections`, or
`weight_magnitude`: every weight loader given 1e30 / NaN / Inf / 1.5e4 weights and one at the
bound, `hostile_weights_47.py`) and merges it into the label's earlier results.
"""

from __future__ import annotations

import json
import os
import random
import stat
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from protdp.errors import InputError, ProtdpError
from protdp.paths import REPO_ROOT, data_root

RESULTS = REPO_ROOT / "benchmarks" / "results" / "hostile_audit.json"
# the same sections run against main at b5ac604 (this script's functions, the fixes stashed),
# the peer the results are compared with
MAIN_B5AC604 = {"msa_cut_in_query": {"silent": 239, "raw": 56, "rejected": 5},
                "pdb_headerless_cuts": {"rejected": 269, "intact": 13, "silent": 18},
                "weights_import (the 263 key removals only)": {"raw": 259, "rejected": 4}}
CUTS = 300
SEED = 28


def _classify(fn, named: str) -> str:
    try:
        fn()
    except ProtdpError as exc:
        return "rejected" if str(exc).startswith(str(named)) or str(named) in str(exc) else "raw"
    except Exception:   # noqa: BLE001  (any other exception is what the audit counts)
        return "raw"
    return "accepted"


def audit_msa_cuts(tmp: Path, rng: random.Random) -> Counter:
    """Cut the a3m anywhere inside its query record; build the family against its structure."""
    from protdp.data.discover import FamilySpec
    from protdp.data.families import process_family
    from protdp.data.filters import FilterConfig

    data = data_root()
    a3m = (data / "msa" / "2p90_A02.hhblits.a3m").read_bytes()
    pdb = str(data / "structures" / "2p90_A02.pdb")
    cfg = FilterConfig()
    full = process_family(FamilySpec("x", [str(data / "msa" / "2p90_A02.hhblits.a3m")], pdb, "A"),
                          cfg)["families"][0]
    query_end = a3m.index(b"\n>", 1)                  # end of the query record
    counts: Counter = Counter()
    for _ in range(CUTS):
        cut = rng.randrange(a3m.index(b"\n") + 1, query_end)
        path = tmp / "cut.a3m"
        path.write_bytes(a3m[:cut])
        out = process_family(FamilySpec("x", [str(path)], pdb, "A"), cfg)
        if out["families"]:
            fam = out["families"][0]
            counts["intact" if fam["sequence"] == full["sequence"] else "silent"] += 1
        else:
            rej = out["rejects"][0]
            counts["rejected" if rej.get("file") == str(path) else "raw"] += 1
    return counts


def audit_pdb_cuts(tmp: Path, rng: random.Random) -> Counter:
    """Cut a header-less PDB at random bytes: a cut inside a line must be rejected (accepted,
    the atom of the cut line is lost unseen: silent); a cut at a line boundary must read the
    same chain as those whole lines."""
    from protdp.data.parse import parse_structure

    text = (data_root() / "structures" / "2p90_A02.pdb").read_bytes()
    counts: Counter = Counter()
    for _ in range(CUTS):
        cut = rng.randrange(len(text) // 2, len(text) - 1)
        path = tmp / "cut.pdb"
        path.write_bytes(text[:cut])
        whole = tmp / "whole.pdb"        # the complete lines before the cut (a cut just
        complete = text[cut:cut + 1] == b"\n"  # before a newline keeps a whole last line)
        whole.write_bytes(text[:cut + 1] if complete else text[:text.rfind(b"\n", 0, cut) + 1])
        try:
            got = parse_structure(path, "A")
        except InputError as exc:
            counts["rejected" if str(exc).startswith(str(path)) else "raw"] += 1
            continue
        except Exception:   # noqa: BLE001
            counts["raw"] += 1
            continue
        want = parse_structure(whole, "A")
        same = (got.sequence == want.sequence and
                np.array_equal(got.all_atom_mask, want.all_atom_mask) and
                np.array_equal(got.all_atom_positions, want.all_atom_positions))
        at_boundary = complete or text[cut - 1:cut] == b"\n"
        counts["intact" if same and at_boundary else "silent"] += 1   # a cut line went unseen
    return counts


def audit_weights(tmp: Path) -> Counter:
    import torch

    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from model_fixtures import tiny_config
    from protdp.model import build_model
    from protdp.weights.convert import export_openfold, import_params

    torch.manual_seed(0)
    cfg = tiny_config()
    state = export_openfold(build_model(cfg, verbose=False))
    pt = tmp / "of.pt"
    counts: Counter = Counter()
    for key in state:
        torch.save({k: v for k, v in state.items() if k != key}, pt)
        r = _classify(lambda: import_params(pt, "openfold", sm_layers=cfg.sm_layers), pt)
        counts["silent" if r == "accepted" else r] += 1
    victim = sorted(state)[3]
    for value in (torch.empty(state[victim].shape, device="meta"), state[victim].to_sparse(),
                  state[victim].long(), state[victim].to(torch.complex64)):
        torch.save(dict(state, **{victim: value}), pt)
        r = _classify(lambda: import_params(pt, "openfold", sm_layers=cfg.sm_layers), pt)
        counts["silent" if r == "accepted" else r] += 1
    return counts


def audit_yaml(tmp: Path) -> Counter:
    from protdp.config import read_yaml

    counts: Counter = Counter()
    for text in ("a: 1\na: 2\n", "a: " + "[" * 50_000 + "]" * 50_000 + "\n",
                 "".join("  " * i + f"k{i}:\n" for i in range(2000))):
        path = tmp / "c.yaml"
        path.write_text(text)
        r = _classify(lambda: read_yaml(path), path)
        counts["silent" if r == "accepted" else r] += 1
    return counts


def audit_msa_databases(tmp: Path) -> Counter:
    from protdp.msa import SearchSettings, search_targets
    from protdp.msa.search import Query

    seq = "MVLSEGEWQLVLHVWAKVEADVAGHGQDILIRLFKSHPETLEKFDRFKHLKTEAEMKASED"
    cases = {"dna.fasta": b">a\nACGTACGT\n", "headers.fasta": b">a\n>b\n",
             "empty.fasta": b"", "long.fasta": b">l\n" + b"A" * 100_001 + b"\n"}
    counts: Counter = Counter()
    for name, data in cases.items():
        db = tmp / name
        db.write_bytes(data)
        r = _classify(lambda: search_targets([Query("q", "q", seq)], [db], tmp / "o",
                                             settings=SearchSettings(iterations=1),
                                             progress=False), db.resolve())
        counts["silent" if r == "accepted" else r] += 1
    for special in (tmp, Path("/dev/zero")):
        r = _classify(lambda: search_targets([Query("q", "q", seq)], [special], tmp / "o",
                                             progress=False), special)
        counts["silent" if r == "accepted" else r] += 1
    return counts


def audit_device_outputs(tmp: Path) -> Counter:
    """A character device node (/dev/null's numbers) as every writer's output (root only)."""
    from protdp.data.safeio import atomic_write_text, writable_output
    from protdp.msa.writers import atomic_write
    from protdp.weights.store import write_npz

    dev = tmp / "null"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    writers = [lambda: writable_output(dev, "rejects", "jsonl"),
               lambda: atomic_write_text(dev, "x"), lambda: atomic_write(dev, b"x"),
               lambda: write_npz(dev, {"a": np.zeros(2, np.float32)})]
    counts: Counter = Counter()
    for w in writers:
        r = _classify(w, dev)
        ok = stat.S_ISCHR(os.stat(dev).st_mode)
        counts[r if ok and r != "accepted" else "silent"] += 1
    return counts


def _round4_setup(tmp: Path, fixture: Path, stores: bool) -> tuple:
    """(family store, complex store, multimer checkpoint folder) the round-4 sections read; the
    stores only when `stores` (the weights section alone needs the checkpoint)."""
    from complex_fixtures import GOOD_ROWS, write_manifest
    from data_fixtures import build_pairs_store

    from protdp.complex.store import build_complex_store
    from protdp.weights import cli as weights_cli

    family = None
    if stores:
        (tmp / "fam").mkdir()
        family = build_pairs_store(data_root(), ["2q2k_A"], tmp / "fam")
        build_complex_store(write_manifest(tmp / "m.tsv", GOOD_ROWS[4:]), tmp / "c.h5",
                            log=lambda _: 0)
    mm = tmp / "mm"
    weights_cli.main(["import", "--format", "alphafold", str(
        fixture / "multimer" / "params" / "params_model_1_multimer_v3_small.npz"), "--out",
        str(mm), "--alphafold-config", str(
            fixture / "multimer" / "config_model_1_multimer_v3_small.json")])
    return family, tmp / "c.h5", mm


def round4(label: str, only: str | None = None) -> int:
    """Issue 47's sections (benchmarks/hostile_cases_47.py, hostile_weights_47.py) into the
    JSON under `round4_<label>` (label "after": this tree; "main_<commit>": the same script run
    against main, the before numbers); `only`: that one section, merged into the label's
    earlier results. The earlier rounds' results are kept as they are."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from hostile_cases_47 import limit_memory, sections
    from hostile_weights_47 import audit_weight_magnitudes

    fixture = data_root().parent / "af2_reference"
    t0 = time.time()
    results, by_loader = {}, None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        family, complex_store, mm = _round4_setup(tmp, fixture, only != "weight_magnitude")
        (tmp / "cases").mkdir()
        limit_memory()
        if only != "weight_magnitude":
            results = sections(tmp / "cases", fixture, family, complex_store, mm, only)
        if only in (None, "weight_magnitude"):
            (tmp / "cases" / "weights").mkdir()
            print("weight_magnitude", flush=True)
            by_loader = audit_weight_magnitudes(tmp / "cases" / "weights", fixture, mm)
            results["weight_magnitude"] = dict(sum((Counter(c) for c in by_loader.values()),
                                                   Counter()))
    doc = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    entry = doc.get(f"round4_{label}", {}) if only else {}
    entry.setdefault("cases", {}).update(results)
    if by_loader is not None:
        entry["weight_magnitude_by_loader"] = by_loader
    if only:
        entry.setdefault("section_seconds", {})[only] = round(time.time() - t0, 1)
    else:
        entry["seconds"] = round(time.time() - t0, 1)
    totals = Counter()
    for c in entry["cases"].values():
        totals.update(c)
    entry["totals"] = dict(totals)
    doc[f"round4_{label}"] = entry
    RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(json.dumps(dict(totals)))
    bad = ("raw", "silent", "hang", "refused_valid")
    return 1 if any(sum(Counter(c)[k] for k in bad) for c in results.values()) else 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--round4":
        only = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--only" else None
        return round4(sys.argv[2], only)
    rng = random.Random(SEED)
    t0 = time.time()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, fn in (("msa_cut_in_query", lambda: audit_msa_cuts(tmp, rng)),
                         ("pdb_headerless_cuts", lambda: audit_pdb_cuts(tmp, rng)),
                         ("weights_import", lambda: audit_weights(tmp)),
                         ("yaml", lambda: audit_yaml(tmp)),
                         ("msa_databases", lambda: audit_msa_databases(tmp)),
                         ("device_node_outputs", lambda: audit_device_outputs(tmp))):
            results[name] = dict(fn())
            print(name, results[name], flush=True)
    totals = Counter()
    for c in results.values():
        totals.update(c)
    doc = {"cases": results, "totals": dict(totals), "main_b5ac604": MAIN_B5AC604,
           "seed": SEED, "cuts": CUTS,
           "seconds": round(time.time() - t0, 1), "as_root": os.geteuid() == 0}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(json.dumps(doc["totals"]))
    return 1 if totals["raw"] or totals["silent"] else 0


if __name__ == "__main__":
    sys.exit(main())
