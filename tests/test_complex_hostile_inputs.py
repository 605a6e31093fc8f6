"""Hostile and real-world inputs of the complex paths (issue 32 audit): each bad complex is
one line naming the file and line, the batch goes on, nothing good is lost.

- `protdp complex store` on real-world mmCIF variants of 4hhb made with gemmi: author chain
  ids only (no label_asym_id), label ids that differ from the author ids, MET as HETATM MSE
  (SD -> SE), insertion codes (residues 20-22 of α renumbered 19A-19C) and an altloc pair
  (the 0.6 one kept). Reference: the untouched 4hhb.cif through the same store, array for
  array. Manifest rows that are short, not UTF-8, without a complex id, or a second
  structure file for one complex id reject only their own complex (or row).
- complex `protdp predict`: `A:B:` (an empty third chain), a duplicate complex name, a
  complex longer than --max-length in all, non-UTF-8 bytes in a header and in a sequence;
  the good complexes are predicted.
"""

from __future__ import annotations

import gemmi
import numpy as np
import pytest

from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.inference.writers import read_summary
from protdp.complex.store import CHAIN_ARRAYS, ComplexStore, build_complex_store
from protdp.paths import data_root
from test_complex_predict import COMMON, RAW, ckpt  # noqa: F401  (fixture)


def _variant(src, dst, edit):
    """dst: src with its _atom_site loop rewritten by edit(tags, rows) -> (tags, rows)."""
    doc = gemmi.cif.read(str(src))
    block = doc.sole_block()
    table = block.find_mmcif_category("_atom_site.")
    tags = [t.removeprefix("_atom_site.") for t in table.tags]
    tags, rows = edit(tags, [list(r) for r in table])
    block.set_mmcif_category("_atom_site.", {t: [r[i] for r in rows] for i, t in enumerate(tags)},
                             raw=True)
    doc.write_file(str(dst))
    return dst


def _author_only(tags, rows):
    i = tags.index("label_asym_id")
    return tags[:i] + tags[i + 1:], [r[:i] + r[i + 1:] for r in rows]


def _other_labels(tags, rows):
    i = tags.index("label_asym_id")
    for r in rows:
        r[i] = {"A": "P", "B": "Q", "C": "R", "D": "S"}.get(r[i], "Z")
    return tags, rows


def _mse(tags, rows):
    g, c, a, t = (tags.index(k) for k in ("group_PDB", "label_comp_id", "label_atom_id",
                                          "type_symbol"))
    ac = tags.index("auth_comp_id")
    for r in rows:
        if r[c] == "MET":
            r[g], r[c], r[ac] = "HETATM", "MSE", "MSE"
            if r[a] == "SD":
                r[a], r[t] = "SE", "SE"
    return tags, rows


def _icodes_and_altlocs(tags, rows):
    ch, ins, alt, aseq, x, occ, aid = (tags.index(k) for k in (
        "auth_asym_id", "pdbx_PDB_ins_code", "label_alt_id", "auth_seq_id", "Cartn_x",
        "occupancy", "id"))
    out, n = [], 10 ** 6
    for r in rows:
        if r[ch] == "A" and r[aseq] in ("20", "21", "22"):
            r[ins], r[aseq] = "ABC"[int(r[aseq]) - 20], "19"
        out.append(r)
        if r[ch] == "B" and r[aseq] == "30":          # a second, less occupied conformer
            r[alt], r[occ] = "A", "0.60"
            other = list(r)
            other[alt], other[occ], other[x] = "B", "0.40", f"{float(r[x]) + 1.5:.3f}"
            n += 1
            other[aid] = str(n)
            out.append(other)
    return tags, out


def write_rows(path, rows):
    path.write_text("complex_id\tstructure_file\tchain\tmsa_file\n"
                    + "".join(f"{c}\t{f}\t{ch}\t{m}\n" for c, f, ch, m in rows))
    return path


def test_real_world_mmcif_variants_and_bad_manifest_rows(tmp_path):
    src = data_root() / "structures" / "4hhb.cif"
    variants = {name: _variant(src, tmp_path / f"{name}.cif", edit) for name, edit in (
        ("author_only", _author_only), ("other_labels", _other_labels), ("mse", _mse),
        ("icodes_altlocs", _icodes_and_altlocs))}
    msa_a = data_root() / "msa" / "1a00_A.bfd_uniclust.a3m"
    rows = [("ref", src, "A", msa_a), ("ref", src, "B", "-")]
    rows += [(n, f, c, m) for n, f in variants.items() for c, m in (("A", msa_a), ("B", "-"))]
    text = "complex_id\tstructure_file\tchain\tmsa_file\n"
    text += "".join(f"{c}\t{f}\t{ch}\t{m}\n" for c, f, ch, m in rows)
    text += (f"short\t{src}\tA\n"                                    # line 12: 3 fields
             f"short\t{src}\tB\t-\n"
             f"two\t{src}\tA\t-\n"
             f"two\t{data_root() / 'structures' / '2q2k.cif'}\tB\t-\n"      # line 15
             f"\t{src}\tC\t-\n"                                      # line 16: no complex id
             f"ref\t{src}\tC\t-\n")                       # line 17: 'ref' again, after others
    data = text.encode() + f"lat\xe9\t{src}\tA\t-\n".encode("latin-1") + \
        f"utf\t{src}\tA\t-\n".encode() + f"utf\t{src}\tB\tm\xe9.a3m\n".encode("latin-1")
    manifest = tmp_path / "complexes.tsv"
    manifest.write_bytes(data)
    lines: list[str] = []
    report = build_complex_store(manifest, tmp_path / "c.h5", log=lines.append)
    assert sorted(report.built) == sorted(variants), lines
    assert sorted(lines) == sorted([
        f"rejected short (manifest line 12): {manifest}:12: expected 4 non-empty tab-separated "
        f"fields, got ['short', '{src}', 'A']",
        f"rejected two (manifest line 14): {manifest}:15: complex two names a second structure "
        f"file '{data_root() / 'structures' / '2q2k.cif'}' (first: {src}, line 14); two "
        f"complexes with one id?",
        f"rejected row (manifest line 16): {manifest}:16: expected 4 non-empty tab-separated "
        f"fields, got ['', '{src}', 'C', '-']",
        f"rejected ref (manifest line 2): {manifest}:17: complex ref again after other "
        "complexes (first at line 2); a complex's rows are consecutive: two complexes with one "
        "id?",
        f"rejected row (manifest line 18): {manifest}:18: not UTF-8: byte 0xE9 at column 4",
        f"rejected utf (manifest line 19): {manifest}:20: not UTF-8: byte 0xE9 at column "
        f"{len(f'utf{chr(9)}{src}{chr(9)}B{chr(9)}m') + 1}"])
    # reference: the untouched file, stored alone
    build_complex_store(write_rows(tmp_path / "ref.tsv", rows[:2]), tmp_path / "ref.h5",
                        log=lines.append)
    ref = ComplexStore(tmp_path / "ref.h5").read("ref")
    store = ComplexStore(tmp_path / "c.h5")
    for name in variants:
        got = store.read(name)
        for a, b in zip(ref["chains"], got["chains"]):
            assert (a["chain_id"], a["sequence"]) == (b["chain_id"], b["sequence"]), name
            for arr in CHAIN_ARRAYS:
                np.testing.assert_array_equal(a[arr], b[arr], err_msg=f"{name} {arr}")


def test_binary_or_cr_manifest_is_one_clear_line(tmp_path, capsys):
    """A binary file given as the manifest is one error line naming it (it was a _csv.Error
    traceback); old-Mac CR line endings read as lines, so a bad row is named by its line."""
    binary = tmp_path / "binary.tsv"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\r\x00\n\x00")
    assert protdp_main(["complex", "store", "--manifest", str(binary),
                        "--out", str(tmp_path / "b.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"protdp complex: error: {binary}:1: not a text file: NUL byte at offset 7 "
                   "(binary data)"], err
    assert not (tmp_path / "b.h5").exists()
    src = data_root() / "structures" / "4hhb.cif"
    cr = tmp_path / "cr.tsv"
    cr.write_bytes(f"complex_id\tstructure_file\tchain\tmsa_file\rshort\t{src}\tA\r".encode())
    lines: list[str] = []
    report = build_complex_store(cr, tmp_path / "cr.h5", log=lines.append)
    assert report.built == [] and lines == [
        f"rejected short (manifest line 2): {cr}:2: expected 4 non-empty tab-separated "
        f"fields, got ['short', '{src}', 'A']"], lines


def test_complex_predict_bad_features_dir_and_files(tmp_path, ckpt, capsys):  # noqa: F811
    """`complex predict --features-dir`: a missing folder, a file, or a folder without any
    <complex>/features.npz was '0 complexes: 0 ok' with exit 0; a binary features.npz printed
    numpy's advice to unpickle it, a folder named features.npz an IsADirectoryError."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for bad, why in (("nope", "not a folder"), ("file", "not a folder"),
                     ("empty", "no <complex>/features.npz in this folder")):
        rc = protdp_main(["complex", "predict", "--features-dir", str(tmp_path / bad),
                          "--checkpoint", str(ckpt), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err == [f"protdp complex: error: {tmp_path / bad}: {why}"
                                   + err[0].split(why, 1)[1]], err
    feats = tmp_path / "feats"
    (feats / "bin").mkdir(parents=True)
    (feats / "bin" / "features.npz").write_bytes(b"\x7fELF\x02\x01\x01\x00" * 8)
    (feats / "dir" / "features.npz").mkdir(parents=True)
    rc = protdp_main(["complex", "predict", "--features-dir", str(feats), "--checkpoint",
                      str(ckpt), "--out", str(tmp_path / "o"), *COMMON])
    cap = capsys.readouterr()
    out = cap.out + cap.err
    assert rc == 0 and "pickle" not in out, out
    assert "2 targets: 0 accepted, 0 need review, 2 rejected" in out, out
    from protdp.inference.writers import read_summary
    detail = {r["target"]: r["detail"] for r in read_summary(tmp_path / "o" / "summary.tsv")}
    assert "pickle" not in "".join(detail.values())
    assert f"{feats / 'bin' / 'features.npz'}: not an .npz features file" in detail["bin"]
    assert f"{feats / 'dir' / 'features.npz'}: a directory, not a regular file" \
        in detail["dir"]

@pytest.fixture
def hostile_fasta(tmp_path):
    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    records = [f">trail\n{qa}:{qb}:\n", f">dup\n{qa}:{qb}\n", f">dup\n{qb}:{qa}\n",
               f">long\n{qa}{qa}:{qb}{qb}\n"]
    data = "".join(records).encode() + b">bad\xff\xfename\n" + f"{qa}:{qb}\n".encode() + \
        b">badseq\n" + qa.encode() + b"\xe9:" + qb.encode() + b"\n" + f">okay\n{qa}:{qb}\n".encode()
    fasta = tmp_path / "hostile.fasta"
    fasta.write_bytes(data)
    return fasta, len(qa)


def test_hostile_complex_records_are_one_line_each(tmp_path, ckpt, hostile_fasta, capsys):  # noqa: F811
    fasta, la = hostile_fasta
    out = tmp_path / "out"
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                        str(out), "--max-length", "100", *COMMON]) == 0
    assert "7 targets: 0 accepted, 2 need review, 5 rejected" in capsys.readouterr().out
    rows = read_summary(out / "summary.tsv")
    assert [r["status"] for r in rows] == ["rejected", "predicted", "rejected", "rejected",
                                           "rejected", "rejected", "predicted"]
    assert rows[0]["detail"] == \
        f"{fasta}:1: chain 3 (C) of complex 'trail' is empty (a chain of length 0)"
    assert rows[2]["detail"] == f"{fasta}:5: duplicate complex id 'dup' (first at line 3)"
    assert rows[3]["detail"] == \
        f"{fasta}:7: complex 'long': 152 residues in all exceeds the configured limit 100 " \
        "(--max-length)"
    assert rows[4]["detail"] == f"{fasta}:9: not UTF-8: byte 0xFF at column 5 (save the file " \
        "as UTF-8 or ASCII)"
    assert rows[5]["detail"] == f"{fasta}:12: not UTF-8: byte 0xE9 at column {la + 1} (save " \
        "the file as UTF-8 or ASCII)"
    assert (out / "targets" / "okay" / "CURRENT").is_file()
    assert (out / "targets" / "dup" / "CURRENT").is_file()
