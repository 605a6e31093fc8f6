"""Template search + featurization for one target, files written beside its MSAs:

    <target>/pdb_hits.sto       hmmsearch -A alignment (AlphaFold's file of the same name)
    <target>/templates.npz      AlphaFold's template feature dict (`protdp.templates.featurize`)
    <target>/templates.json     templates used (id, chain, release date, aligned residues,
                                identity), AlphaFold's warnings and errors

The search MSA is AlphaFold's (`pipeline.DataPipeline.process`): the query's MSA without
insertions, every query column a match column (`#=GC RF`), duplicate rows removed
(`parsers.deduplicate_stockholm_msa`); AlphaFold uses its UniRef90 MSA, protdp the first of
the target's MSAs (the one its first `--db` produced).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from protdp.errors import InputError
from protdp.fileio import atomic_write_bytes
from protdp.templates.featurize import Featurizer, TemplateResult
from protdp.templates.hits import parse_hits
from protdp.templates.search import search_templates

HITS_FILE, FEATURES_FILE, RECORD_FILE = "pdb_hits.sto", "templates.npz", "templates.json"


def a3m_to_search_stockholm(a3m: str, source: str | Path = "<a3m>") -> str:
    """a3m (query first) -> AlphaFold's search MSA in Stockholm (see the module docstring)."""
    names, rows = [], []
    for line in a3m.splitlines():
        if line.startswith(">"):
            names.append(line[1:].split()[0] if line[1:].split() else f"seq{len(names)}")
            rows.append([])
        elif line.strip() and not line.startswith("#") and rows:
            rows[-1].append(line.strip())
    seqs = ["".join(c for c in "".join(r) if not c.islower() and c != ".") for r in rows]
    if not seqs or not seqs[0]:
        raise InputError("no query row in the MSA", path=source)
    seen, out = set(), []
    for i, (name, seq) in enumerate(zip(names, seqs)):
        if len(seq) != len(seqs[0]):
            raise InputError(f"row {i + 1} has {len(seq)} match columns, the query "
                             f"{len(seqs[0])}", path=source)
        if seq in seen:
            continue
        seen.add(seq)
        out.append((f"{i}_{name}"[:60], seq))
    width = max(len("#=GC RF"), *(len(n) for n, _ in out)) + 1
    lines = ["# STOCKHOLM 1.0", ""] + [f"{n:<{width}}{s}" for n, s in out]
    lines += [f"{'#=GC RF':<{width}}{'x' * len(seqs[0])}", "//"]
    return "\n".join(lines) + "\n"


def template_record(result: TemplateResult) -> dict:
    return {"templates": result.used, "warnings": result.warnings, "errors": result.errors}


def search_target(query: str, a3m_path: Path, database, featurizer: Featurizer,
                  out_dir: Path) -> TemplateResult:
    """Search, featurize and write the three files (atomically) for one target."""
    sto = a3m_to_search_stockholm(Path(a3m_path).read_text(), a3m_path)
    msa_path = out_dir / "template_search_msa.sto"
    atomic_write_bytes(msa_path, sto.encode())
    try:
        hits_text = search_templates(msa_path, database)
    finally:
        msa_path.unlink(missing_ok=True)
    atomic_write_bytes(out_dir / HITS_FILE, hits_text.encode())
    result = featurizer.get_templates(query, parse_hits(hits_text, query, out_dir / HITS_FILE))
    tmp = out_dir / (FEATURES_FILE + ".tmp.npz")
    feats = {k: (v.astype("S") if v.dtype == object else v) for k, v in result.features.items()}
    np.savez(tmp, **feats)
    os.replace(tmp, out_dir / FEATURES_FILE)
    atomic_write_bytes(out_dir / RECORD_FILE, json.dumps(template_record(result), indent=1).encode())
    return result
