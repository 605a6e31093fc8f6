"""FASTA headers from anyone in the ModelCIF file (issue 41 names entities and asym units after
them): unicode, terminal escapes, bidi overrides and both quote kinds still give an mmCIF that
gemmi and python-modelcif read, with the header's text recognisable (redteam's
unicode_header / control_characters_in_header cases broke the file before)."""

from __future__ import annotations

import gemmi
import modelcif.reader
import numpy as np
import pytest

from protdp.inference.modelcif_out import cif_text, write_modelcif

HEADERS = ["βλ-蛋白-é", "\x1b[2J\x1b[31mred\x07", 'it\'s a "quoted" \'x\' ;semi\n;x',
           "alice\u202egnp.exe", "C:\\temp\\x0a", "plain header"]


@pytest.mark.parametrize("header", HEADERS)
def test_hostile_header_gives_a_readable_modelcif(tmp_path, header):
    L = 4
    rng = np.random.default_rng(0)
    mask = np.zeros((L, 37))
    mask[:, :3] = 1
    path = write_modelcif(tmp_path / "t.cif", "tgt",
                          [{"label": "model_1_seed_000", "positions": rng.random((L, 37, 3)) * 10,
                            "atom_mask": mask, "plddt": np.full(L, 71.25), "ptm": 0.5,
                            "iptm": None, "pae": np.full((L, L), 3.5)}],
                          {"seed": 0}, chains=[("A", "MKVL")], records={"A": header})
    block = gemmi.cif.read(str(path)).sole_block()
    described = gemmi.cif.as_string(block.find_value("_entity.pdbx_description"))
    assert described == cif_text(header) and described.isascii()
    assert all(c.isprintable() for c in described)
    with open(path) as fh:
        system, = modelcif.reader.read(fh)
    assert system.entities[0].description == cif_text(header)
    assert len(system.asym_units) == 1
    if header == "plain header":
        assert described == header
