"""Hostile input round 3 (issue 28), data: an MSA cut inside its query line is rejected against
the structure's own sequence (main stored it as a short family), a header-less PDB cut inside a
record name is rejected (main lost the atom silently), and every training read of a family is
validated: shape, finite coordinates, token range (main featurized [L, 5, 3] positions, NaN
and out-of-range tokens; only `data verify` caught them)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from data_fixtures import build_pairs_store
from protdp.data.discover import FamilySpec
from protdp.data.families import process_family
from protdp.data.filters import FilterConfig
from protdp.data.parse import parse_structure
from protdp.data.store import FamilyStore
from protdp.errors import InputError


def test_msa_cut_inside_its_query_is_rejected_naming_it(tmp_path, data_dir):
    src = data_dir / "msa" / "2p90_A02.hhblits.a3m"
    pdb = str(data_dir / "structures" / "2p90_A02.pdb")
    text = src.read_bytes()
    full = process_family(FamilySpec("x", [str(src)], pdb, "A"), FilterConfig())["families"][0]
    start, end = text.index(b"\n") + 1, text.index(b"\n>", 1)
    for cut in (start + 5, (start + end) // 2, end - 1):
        path = tmp_path / "cut.a3m"
        path.write_bytes(text[:cut])
        out = process_family(FamilySpec("x", [str(path)], pdb, "A"), FilterConfig())
        assert not out["families"], cut
        assert out["rejects"][0]["file"] == str(path)
        assert "ends inside its query" in out["rejects"][0]["reason"]
    path.write_bytes(text[:end + 1])          # cut at the query's end: the whole query
    fam = process_family(FamilySpec("x", [str(path)], pdb, "A"), FilterConfig())["families"][0]
    assert fam["sequence"] == full["sequence"]


def test_headerless_pdb_cut_inside_a_record_name_is_rejected(tmp_path, data_dir):
    text = (data_dir / "structures" / "2p90_A02.pdb").read_bytes()
    line = text.index(b"\nATOM", len(text) // 2) + 1         # start of some ATOM line
    whole = tmp_path / "whole.pdb"
    whole.write_bytes(text[:line])
    n_atoms = int(parse_structure(whole, "A").all_atom_mask.sum())
    for k in range(1, 6):                                      # 'A' .. 'ATOM '
        path = tmp_path / "cut.pdb"
        path.write_bytes(text[:line + k])
        with pytest.raises(InputError, match=f"^{path}:\\d+: file is truncated"):
            parse_structure(path, "A")
    path.write_bytes(text[:line - 1])       # a whole last line without its newline is fine
    assert int(parse_structure(path, "A").all_atom_mask.sum()) == n_atoms


@pytest.fixture(scope="module")
def small_store(tmp_path_factory, data_dir):
    return build_pairs_store(data_dir, ["2q2k_A"], tmp_path_factory.mktemp("store"))


@pytest.mark.parametrize("damage,why", [
    ("backbone_only", r"all_atom_positions is float32 \(\d+, 5, 3\), expected float32 \(\d+, 37, 3\)"),
    ("nan", "non-finite"),
    ("token", "msa holds token ids above"),
])
def test_training_reads_are_validated_naming_the_family(small_store, tmp_path, damage, why):
    import shutil
    path = tmp_path / "d.h5"
    shutil.copy(small_store, path)
    fid = FamilyStore(path).family_ids[0]
    good = FamilyStore(path).read(fid)
    with h5py.File(path, "r+") as h5:
        g = h5["families"][fid]
        if damage == "backbone_only":
            pos = g["all_atom_positions"][()][:, :5]
            del g["all_atom_positions"]
            g["all_atom_positions"] = pos
        elif damage == "nan":
            g["all_atom_positions"][0, 1] = [np.nan, 0.0, 0.0]
        else:
            g["msa"][1, 0] = 77
    with pytest.raises(InputError, match=f"^{path}: family '{fid}': {why}.*protdp data verify"):
        FamilyStore(path).read(fid)
    assert good["all_atom_positions"].shape[1:] == (37, 3)
