"""`protdp templates`: put template hits into a training store (issue 31 D5).

    protdp templates store-fasta --store store.h5 --out families.fasta
    protdp msa search --fasta families.fasta --db uniref90.fasta.gz --out msas/ \\
        --templates-db pdb_seqres.txt --mmcif-dir mmcif/ --max-template-date 2021-09-30
    protdp templates add-to-store --store store.h5 --msa-dir msas/

`store-fasta` writes every family's full sequence under its family id, so the search's
per-target folders (`msas/<family_id>/templates.npz`) name the store's families.
`add-to-store` writes each family's `templates.npz` into `/families/<id>/templates`
(docs/store_format.md) on a copy of the store that replaces it only when complete (a crash
leaves the old store). A family whose features do not cover its sequence, or whose file cannot
be read, is named and skipped; families without a `templates.npz` keep none.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.fileio import atomic_write_bytes, check_output, replace_file
from protdp.templates.run import FEATURES_FILE
from protdp.templates.training import write_family_templates
from protdp.templates.validate import read_domain_names, read_features, real_templates

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protdp templates", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("store-fasta", help="every family's sequence, named by family id")
    f.add_argument("--store", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--force", action="store_true", help="replace a file of another kind")
    a = sub.add_parser("add-to-store", help="template hits of `msa search --templates-db` "
                                            "into the store, per family")
    a.add_argument("--store", required=True)
    a.add_argument("--msa-dir", required=True, help="folder of <family_id>/templates.npz")
    return p


def store_fasta(store: Path, out: Path, force: bool) -> int:
    check_output(out, "text", "--out", force=force, inputs=(store,))
    with FamilyStore(store) as s:
        text = "".join(f">{fid}\n{s.read(fid)['sequence']}\n" for fid in s.family_ids)
        n = len(s)
    atomic_write_bytes(out, text.encode())
    print(f"protdp templates: {n} families -> {out}")
    return 0


def _features(path: Path, length: int) -> dict:
    """The four stored keys of one templates.npz, checked against the family's length."""
    feats = read_features(path, length, "family")        # shapes, finiteness, masks (issue 47)
    feats["template_domain_names"] = read_domain_names(path)   # header-checked (npz_headers)
    names = feats["template_domain_names"]
    if names.ndim != 1 or len(names) != len(feats["template_aatype"]):
        raise InputError(f"template_domain_names has shape {names.shape}, expected "
                         f"[{len(feats['template_aatype'])}]", path=path)
    return feats


def add_to_store(store: Path, msa_dir: Path) -> int:
    import h5py

    if not msa_dir.is_dir():
        raise InputError("not a folder (give the --out folder of `protdp msa search "
                         "--templates-db`)", path=msa_dir)
    with FamilyStore(store) as s:
        lengths = {fid: s.length(fid) for fid in s.family_ids}
    found = {fid: msa_dir / fid / FEATURES_FILE for fid in lengths
             if (msa_dir / fid / FEATURES_FILE).is_file()}
    feats, bad = {}, []
    for fid, path in found.items():
        try:
            feats[fid] = _features(path, lengths[fid])
        except InputError as exc:
            bad.append(str(exc))
    for line in bad:
        print(f"protdp templates: skipped: {line}", file=sys.stderr)
    if not feats:
        print(f"protdp templates: no usable {FEATURES_FILE} under {msa_dir} for the "
              f"{len(lengths)} families of {store}; nothing written", file=sys.stderr)
        return 1
    store = store.resolve()          # a link to the store: the store itself is replaced
    tmp = store.with_name(f".{store.name}.{os.getpid()}.templates.tmp")
    try:
        shutil.copyfile(store, tmp)
        with h5py.File(tmp, "a") as h5:
            for fid, f in feats.items():
                write_family_templates(h5, fid, f)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        replace_file(tmp, store)
    except OSError as exc:
        raise InputError(f"cannot write the store with its templates: {exc.strerror or exc}",
                         path=store) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    n_templates = sum(real_templates(f) for f in feats.values())   # not the placeholder row
    print(f"protdp templates: {len(feats)} families got {n_templates} template hits in {store}; "
          f"{len(lengths) - len(found)} have no {FEATURES_FILE}; {len(bad)} skipped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "store-fasta":
        return store_fasta(Path(args.store), Path(args.out), args.force)
    return add_to_store(Path(args.store), Path(args.msa_dir))


if __name__ == "__main__":
    sys.exit(main())
