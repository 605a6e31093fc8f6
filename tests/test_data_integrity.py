"""Data integrity (issue 17): residues placed by numbering (the 2XHE-like and 7CFN-like real
cases), chain breaks kept, mmCIF preferred by deduplication, pairing refuses unrelated MSAs,
atom37 coordinates equal gemmi's for every atom of every corpus file, store format versions,
content hashes, `protdp data verify`, and kill -9 at random moments of a real build."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import gemmi
import h5py
import numpy as np
import pytest

from protdp.data.cli import main as data_main
from protdp.data.parse import pair_msa_structure, parse_msa, parse_structure
from protdp.data.placement import CHAIN_BREAK_CA_DISTANCE, align_map
from protdp.data.residue_constants import ATOM_ORDER, RESTYPE_ATOM14_NAMES
from protdp.data.residues import MODIFIED_TO_PARENT, THREE_TO_ONE
from protdp.data.store import FamilyStore, build_store, verify_store
from protdp.errors import InputError
from protdp.paths import REPO_ROOT

CA = ATOM_ORDER["CA"]


def _structure_files(data_dir):
    return sorted(p for d in ("structures", "structures_only", "edge_cases/structures")
                  for p in (data_dir / d).iterdir())


# ------------------------------------------------------------------- atom37 against gemmi

def _gemmi_atoms(st, chain_id):
    """Independent reference: {(number, icode): {atom37 name: xyz}} read by gemmi. First model;
    per atom name the highest-occupancy altloc (first on ties); a point mutation keeps the
    residue name with the highest mean occupancy; atoms of the residue type (modified residues:
    of the parent, MSE's SE as SD) plus OXT; unknown ATOM residues with a CA: backbone + CB."""
    out = {}
    for ch in st[0]:
        if ch.name.strip() != chain_id.strip():
            continue
        groups, het = {}, {}
        for res in ch:
            key = (res.seqid.num, res.seqid.icode.strip())
            groups.setdefault(key, {}).setdefault(res.name, []).extend(list(res))
            het[(key, res.name)] = res.het_flag
        for key, names in groups.items():
            name, atoms = max(names.items(), key=lambda kv: np.mean([a.occ for a in kv[1]]))
            parent = MODIFIED_TO_PARENT.get(name.upper(), name.upper())
            if name in ("HOH", "WAT") or (parent not in THREE_TO_ONE and not (
                    het[(key, name)] == "A" and any(a.name == "CA" for a in atoms))):
                continue
            allowed = set(RESTYPE_ATOM14_NAMES.get(parent) or ("N", "CA", "C", "O", "CB"))
            best, xyz = {}, {}
            for a in atoms:
                nm = "SD" if (name == "MSE" and a.name == "SE") else a.name
                if nm in allowed | {"OXT"} and (nm not in best or a.occ > best[nm]):
                    best[nm], xyz[nm] = a.occ, np.array(a.pos.tolist())
            out[key] = xyz
    return out


def test_atom37_equals_gemmi_for_every_atom_of_every_corpus_file(data_dir):
    from protdp.data.atoms import read_structure
    from protdp.data.parse import list_chains
    compared, chains = 0, 0
    for path in _structure_files(data_dir):
        try:
            data = read_structure(path)
            ids = list_chains(path, data)
        except InputError:
            continue                          # header-only / ions-only: covered elsewhere
        st = gemmi.read_structure(str(path))
        for cid in ids:
            chain = parse_structure(path, cid, data=data)
            ref = _gemmi_atoms(st, cid)
            where = {a: i for i, a in enumerate(chain.author_ids) if a}
            assert set(where) == {f"{n}{ic}" for n, ic in ref}, (path.name, cid)
            for (num, ic), atoms in ref.items():
                i = where[f"{num}{ic}"]
                ours = {n for n, k in ATOM_ORDER.items() if chain.all_atom_mask[i, k]}
                assert ours == set(atoms), (path.name, cid, num, ours ^ set(atoms))
                for name, xyz in atoms.items():
                    np.testing.assert_allclose(chain.all_atom_positions[i, ATOM_ORDER[name]],
                                               xyz, atol=1e-3)
                    compared += 1
            missing = ~chain.all_atom_mask
            assert (chain.all_atom_positions[missing] == 0).all()
            chains += 1
    print(f"atom37 vs gemmi: {compared} atoms in {chains} chains, all within 1e-3 Å")
    assert compared > 50_000 and chains > 60


def test_backbone_view_is_derived_from_atom37(data_dir):
    chain = parse_structure(data_dir / "edge_cases/structures/1a8o_mse.pdb", "A")
    k = chain.sequence.index("M")
    assert chain.all_atom_mask[k, ATOM_ORDER["SD"]]              # MSE's SE stored as SD
    for j, name in enumerate(("N", "CA", "C", "O", "CB")):
        sel = chain.all_atom_mask[:, ATOM_ORDER[name]]
        np.testing.assert_array_equal(chain.positions[sel, j],
                                      chain.all_atom_positions[sel, ATOM_ORDER[name]])
    gly = np.array(list(chain.sequence)) == "G"
    assert chain.mask[gly & chain.mask[:, :3].all(1), 4].all()  # virtual CB for glycine


# --------------------------------------------------------------------- residue placement

def _without_residues(src, dst, chain, numbers):
    """Copy a PDB file leaving out the ATOM/HETATM lines of residues `numbers` of `chain`."""
    keep = [l for l in src.read_text().splitlines(keepends=True)
            if not (l.startswith(("ATOM", "HETATM", "ANISOU")) and l[21] == chain
                    and int(l[22:26]) in numbers)]
    dst.write_text("".join(keep))
    return dst


def test_numbering_places_an_isolated_residue_where_alignment_misplaces_it(tmp_path,
                                                                           data_dir):
    """2XHE-like: real 1DMG (SEQRES, residues 43-95 unobserved) with two short loops also
    unobserved, so Asn102 stands alone. Aligning by sequence only puts it 59 positions away
    (across the real gap, 20+ Å from its stored neighbours); numbering puts it right."""
    full = parse_structure(data_dir / "edge_cases/structures/1dmg_missing.pdb", "A")
    cut = _without_residues(data_dir / "edge_cases/structures/1dmg_missing.pdb",
                            tmp_path / "1dmg_loops.pdb", "A",
                            set(range(97, 102)) | set(range(103, 108)))
    chain = parse_structure(cut, "A")
    assert chain.placement == "numbering" and chain.sequence == full.sequence
    k = chain.author_ids.index("102")
    assert k == full.author_ids.index("102") == 100
    obs = chain.observed
    np.testing.assert_array_equal(chain.all_atom_positions[obs], full.all_atom_positions[obs])
    # the old alignment-only placement of the same residues misplaces Asn102
    observed = "".join(chain.sequence[i] for i in np.nonzero(obs)[0])
    m = align_map(observed, chain.sequence)
    assert m[list(np.nonzero(obs)[0]).index(k)] == 41
    # stored neighbours are bonded (this old entry has 4.2-4.3 Å CA-CA in places)
    ca = chain.all_atom_positions[:, CA]
    both = obs[1:] & obs[:-1]
    assert np.linalg.norm(ca[1:] - ca[:-1], axis=-1)[both].max() < 4.3


def test_inconsistent_label_seq_id_falls_back_to_numbering_and_is_recorded(tmp_path,
                                                                         data_dir):
    src = (data_dir / "structures/2q2k.cif").read_text()
    doc = gemmi.cif.read_string(src)
    block = doc.sole_block()
    table = block.find("_atom_site.", ["label_seq_id"])
    for row in table:
        if row[0] not in (".", "?"):
            row[0] = str(int(row[0]) + 3)                   # every label number off by 3
    bad = tmp_path / "2q2k_shifted.cif"
    doc.write_file(str(bad))
    good = parse_structure(data_dir / "structures/2q2k.cif", "A")
    chain = parse_structure(bad, "A")
    assert good.placement == "label_seq_id" and chain.placement == "numbering"
    assert any("label_seq_id does not fit" in w for w in chain.warnings)
    np.testing.assert_array_equal(chain.observed, good.observed)


def test_inconsistent_numbering_uses_alignment_with_a_warning(data_dir):
    chain = parse_structure(data_dir / "structures_only/5ptp.pdb", "A")   # chymotrypsin numbers
    assert chain.placement == "alignment"
    assert any("numbering inconsistent" in w for w in chain.warnings)


@pytest.mark.parametrize("name,before,after,gap", [("structures/1k0n_A.pdb", "152", "163", 10),
                                                  ("structures/T1042-D1.pdb", "253", "254", 5)])
def test_chain_breaks_without_reference_are_kept(data_dir, name, before, after, gap):
    """7CFN-like: no SEQRES; 1K0N jumps 152 -> 163 (12.6 Å), T1042's domain file goes 253 ->
    254 with the CA atoms 19.8 Å apart. Both are breaks: residue_index jumps, flag set."""
    path = data_dir / name
    chain = parse_structure(path, "A" if "1k0n" in name else "")
    assert not chain.has_seqres and chain.placement == "observed"
    i, j = chain.author_ids.index(before), chain.author_ids.index(after)
    assert j == i + 1 and chain.between_segment[j] and chain.between_segment.sum() == 1
    assert chain.residue_index[j] - chain.residue_index[i] == gap + 1
    ca = chain.all_atom_positions[:, CA]
    d = np.linalg.norm(ca[1:] - ca[:-1], axis=-1)
    assert d[i] > CHAIN_BREAK_CA_DISTANCE
    assert d[~chain.between_segment[1:]].max() <= CHAIN_BREAK_CA_DISTANCE


def test_stored_neighbours_are_bonded_in_every_built_family(data_dir, tmp_path):
    """No misplacement anywhere: in every family of the corpus store, residues adjacent in
    residue_index and both observed are <= 4.3 Å apart unless flagged as a chain break."""
    out = tmp_path / "s.h5"
    build_store(out, pairs=data_dir / "PAIRS.tsv", workers=2, progress=False)
    store = FamilyStore(out)
    for fid in store.family_ids:
        fam = store.read(fid)
        ca, m = fam["all_atom_positions"][:, CA], fam["all_atom_mask"][:, CA].astype(bool)
        adj = (np.diff(fam["residue_index"]) == 1) & m[1:] & m[:-1] & \
            ~fam["between_segment_residues"][1:].astype(bool)
        d = np.linalg.norm(ca[1:] - ca[:-1], axis=-1)
        assert not adj.any() or d[adj].max() < 4.3, fid
        assert json.loads(fam["pairing"])["identity"] == 1.0 or fid == "2hzr_A00"


# ------------------------------------------------------------------ pairing and dedup

def test_unrelated_msa_is_refused_with_figures(data_dir):
    chain = parse_structure(data_dir / "structures/102m.cif", "A")
    for msa in ("msa/2q2k_A.bfd_uniclust.a3m", "msa/5awl_A.single_seq.a3m",
                "msa/2p90_A02.hhblits.a3m"):
        query = parse_msa(data_dir / msa).query
        with pytest.raises(InputError, match=r"coverage|identity|no observed structure "
                                             r"residue aligns") as err:
            pair_msa_structure(query, chain, msa, "102m.cif")
        assert "102m.cif" in str(err.value) and msa in str(err.value)


def test_dedup_prefers_mmcif_over_pdb(tmp_path, data_dir):
    msa = data_dir / "msa/1a00_A.mgnify.a3m"
    pairs = tmp_path / "p.tsv"
    pairs.write_text("pair_id\tmsa_file\tstructure_file\tchain\n"
                     f"0first_A\t{msa}\t{data_dir}/structures/4hhb.pdb\tA\n"
                     f"4hhb_A\t{msa}\t{data_dir}/structures/4hhb.cif\tA\n")
    report = build_store(tmp_path / "d.h5", pairs=pairs, progress=False)
    assert FamilyStore(tmp_path / "d.h5").family_ids == ["4hhb_A"]
    rej = [json.loads(l) for l in open(tmp_path / "rejects.jsonl")]
    dup = next(r for r in rej if r["rule"] == "duplicate_chain")
    assert dup["family_id"] == "0first_A" and "mmCIF preferred" in dup["reason"]
    assert report.balanced
    # discovery of one entry in two formats keeps the mmCIF file, the other is a skip record
    both = tmp_path / "both"
    both.mkdir()
    for name in ("4hhb.pdb", "4hhb.cif"):
        shutil.copy(data_dir / "structures" / name, both / name)
    report = build_store(tmp_path / "e.h5", structure_dir=both, progress=False,
                         config={"allow_single_sequence": True})
    assert report.skipped_files == 1 and report.balanced
    fam = FamilyStore(tmp_path / "e.h5").read("4hhb_A")
    assert fam["source_files"] == ["4hhb.cif"] and fam["placement"] == "label_seq_id"


# ----------------------------------------------------------------------- format version

def _small_store(tmp_path, data_dir, ids=("5awl_A", "7a4d_E", "2p90_A02")):
    rows = [r for r in csv.DictReader(open(data_dir / "PAIRS.tsv"), delimiter="\t")
            if r["pair_id"] in ids]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("pair_id\tmsa_file\tstructure_file\tchain\n" + "".join(
        f"{r['pair_id']}\t{data_dir / r['msa_file']}\t{data_dir / r['structure_file']}\t"
        f"{r['chain']}\n" for r in rows))
    out = tmp_path / "data.h5"
    build_store(out, pairs=pairs, progress=False)
    return out, pairs


def test_format_version_checked_on_every_open(tmp_path, data_dir):
    out, pairs = _small_store(tmp_path, data_dir)
    assert FamilyStore(out).format_version == 2
    for version, message in [(1, "older .* rebuild it: protdp data build"),
                             (3, "newer than this protdp"), ("2-beta", "unknown store format"),
                             (2.5, "unknown store format")]:
        with h5py.File(out, "r+") as h5:
            h5.attrs["format_version"] = version
        with pytest.raises(InputError, match=message):
            FamilyStore(out)
        with pytest.raises(InputError, match=message):
            verify_store(out)
        if version != 1:                      # a newer/unknown store is never replaced
            with pytest.raises(InputError, match="refusing to replace"):
                build_store(out, pairs=pairs, progress=False)
    with h5py.File(out, "r+") as h5:
        h5.attrs["format_version"] = 1
    report = build_store(out, pairs=pairs, progress=False)      # the rebuild it names
    assert report.upgraded_from_version == 1 and report.written == 3
    assert FamilyStore(out).format_version == 2


# -------------------------------------------------------------- hashes, verify, rebuild

def test_damaged_family_is_found_by_verify_and_rebuilt(tmp_path, data_dir, capsys):
    out, pairs = _small_store(tmp_path, data_dir)
    before = FamilyStore(out).read("7a4d_E")
    assert data_main(["verify", str(out)]) == 0
    with h5py.File(out, "r+") as h5:                      # silent damage: data, not attrs
        h5["families/7a4d_E/all_atom_positions"][3, 1] = [1.0, 2.0, 3.0]
    assert data_main(["verify", str(out)]) == 1
    assert "7a4d_E: content hash differs" in capsys.readouterr().out
    report = build_store(out, pairs=pairs, progress=False)
    assert (report.rebuilt_damaged, report.unchanged, report.written) == (1, 2, 0)
    after = FamilyStore(out).read("7a4d_E")
    np.testing.assert_array_equal(after["all_atom_positions"], before["all_atom_positions"])
    assert verify_store(out).ok


def test_garbled_bytes_never_give_a_traceback(tmp_path, data_dir):
    """Random byte damage anywhere past the superblock: verify reports it or says the store is
    damaged (one line); a plain build rebuilds what it must or refuses; --force replaces it."""
    out, pairs = _small_store(tmp_path, data_dir)
    good = out.read_bytes()
    for seed in range(6):
        raw = bytearray(good)
        rng = np.random.default_rng(seed)
        for off in rng.integers(512, len(raw), 40):
            raw[off] ^= 0xFF
        out.write_bytes(bytes(raw))
        try:
            assert not verify_store(out).ok
        except InputError as exc:
            assert "damaged" in str(exc) or "cannot open the store" in str(exc), str(exc)
        try:
            report = build_store(out, pairs=pairs, progress=False)
            assert report.balanced and verify_store(out).ok
        except InputError as exc:
            assert "refusing to replace" in str(exc) or "cannot open" in str(exc), str(exc)
        if out.read_bytes()[:8] == good[:8]:          # still HDF5: --force rebuilds it
            build_store(out, pairs=pairs, progress=False, force=True)
            assert verify_store(out).ok and len(FamilyStore(out)) == 3


# -------------------------------------------------------------------------- kill -9

def _kill_inputs(tmp_path, data_dir):
    ids = {"5awl_A", "7a4d_E", "2p90_A02", "2q2k_A", "102m_A", "4hhb_A", "1a3a_A"}
    inp = tmp_path / "in"
    inp.mkdir()
    lines = ["pair_id\tmsa_file\tstructure_file\tchain"]
    for r in csv.DictReader(open(data_dir / "PAIRS.tsv"), delimiter="\t"):
        if r["pair_id"] in ids:
            for key in ("msa_file", "structure_file"):
                dst = inp / os.path.basename(r[key])
                if not dst.exists():
                    shutil.copy(data_dir / r[key], dst)
            lines.append(f"{r['pair_id']}\tin/{os.path.basename(r['msa_file'])}\t"
                         f"in/{os.path.basename(r['structure_file'])}\t{r['chain']}")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\n".join(lines) + "\n")
    return pairs, inp


def _content(path):
    with h5py.File(path, "r") as h5:
        return {k: str(g.attrs["content_sha256"]) for k, g in h5["families"].items()}


def test_kill_9_at_random_moments_leaves_old_or_new_store(tmp_path, data_dir):
    """A forced rebuild (new input in one family) killed with SIGKILL (whole process group,
    workers included) at random moments: the store is always exactly the old one or the new
    one, opens, and verifies; a plain build afterwards finishes the job."""
    pairs, inp = _kill_inputs(tmp_path, data_dir)
    out = tmp_path / "data.h5"
    build_store(out, pairs=pairs, progress=False)
    old = _content(out)
    saved = tmp_path / "old_store.h5"
    shutil.copy(out, saved)
    msa = inp / "7a4d_E.colabfold.a3m"                    # the new input
    query = msa.read_text().splitlines()[1]
    msa.write_text(msa.read_text() + ">extra\n" + "A" + query[1:] + "\n")
    cmd = [sys.executable, "-m", "protdp.cli", "data", "build", "--pairs", str(pairs),
           "--force", "--workers", "2", "--no-progress", "--out"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    t0 = time.time()
    subprocess.run(cmd + [str(tmp_path / "ref" / "data.h5")], env=env, check=True,
                   capture_output=True)
    duration = time.time() - t0
    new = _content(tmp_path / "ref" / "data.h5")
    assert new != old and set(new) == set(old)
    rng = random.Random(17)
    outcomes = []
    for trial in range(8):
        proc = subprocess.Popen(cmd + [str(out)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0.0, duration * 1.1))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        got = _content(out)                       # opens: never a mixture or a broken file
        assert got in (old, new), trial
        assert verify_store(out).ok and len(FamilyStore(out)) == len(old)
        outcomes.append("new" if got == new else "old")
        shutil.copy(saved, out)                   # the old store again for the next kill
    print(f"kill -9 at 8 random moments of a {duration:.1f}s build: {outcomes}")
    report = build_store(out, pairs=pairs, progress=False)       # a plain build afterwards
    assert _content(out) == new and report.balanced and report.written == 1


def test_disk_full_during_a_build_is_one_line_and_keeps_the_old_store(tmp_path, data_dir):
    """RLIMIT_FSIZE makes every write past 400 kB fail (EFBIG), like a full disk."""
    pairs, inp = _kill_inputs(tmp_path, data_dir)
    out = tmp_path / "data.h5"
    build_store(out, pairs=pairs, progress=False)
    before = out.read_bytes()
    assert len(before) > 400_000
    script = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000)); "
              "from protdp.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, "data", "build", "--pairs",
                           str(pairs), "--out", str(out), "--force", "--no-progress"],
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the new store (disk full" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert out.read_bytes() == before and not (tmp_path / ".data.h5.building").exists()
