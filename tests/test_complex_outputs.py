"""Complex outputs (protdp.complex.outputs) from DeepMind's JAX AlphaFold-Multimer outputs in
the fixture: one PDB and one mmCIF with both chains (read back with Biopython: chain ids,
residues, coordinates to the file precision, pLDDT B-factors), and the confidence JSON with
chain boundaries, pTM / ipTM equal to AlphaFold's and the chain-pair matrices."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from Bio.PDB import MMCIFParser, PDBParser

from protdp.data.residues import RESTYPES
from protdp.model.multimer.heads import complex_confidence
from protdp.complex.outputs import write_complex_structures, write_confidence_json
from test_complex_pairing import CASES, FIXTURE


@pytest.mark.parametrize("name", sorted(CASES))
def test_complex_files_from_alphafold_outputs(name, tmp_path):
    f = np.load(FIXTURE / f"features_{name}.npz")
    o = np.load(FIXTURE / f"outputs_{name}.npz")
    seq = "".join((RESTYPES + "X")[i] for i in f["aatype"])
    asym = f["asym_id"]
    chains = [("AB"[k], "".join(c for c, a in zip(seq, asym) if a == k + 1)) for k in range(2)]
    pos, mask = o["structure_module/final_atom_positions"], o["structure_module/final_atom_mask"]
    plddt = o["confidence/plddt"]
    files = write_complex_structures(tmp_path, name, chains, pos, plddt, mask)
    for kind, parser in (("pdb", PDBParser(QUIET=True)), ("cif", MMCIFParser(QUIET=True))):
        model = next(iter(parser.get_structure(name, str(files[kind]))))
        assert [c.id for c in model] == ["A", "B"]
        i = 0
        for (cid, s), chain in zip(chains, model):
            residues = list(chain)
            assert len(residues) == len(s) and residues[0].id[1] == 1
            for res in residues:
                ca = res["CA"]
                assert np.abs(ca.coord - pos[i, 1]).max() < 1e-3
                assert abs(ca.bfactor - round(float(plddt[i]), 2)) < 1e-6
                assert len(res) == int(mask[i].sum())
                i += 1
        assert i == len(seq)
    conf = complex_confidence(torch.from_numpy(o["predicted_aligned_error/logits"]),
                              torch.linspace(0.25, 31.75, 64), torch.from_numpy(asym))
    doc = json.loads(write_confidence_json(tmp_path / "scores.json", chains, plddt,
                                           conf).read_text())
    assert doc["chains"] == [{"chain_id": "A", "start": 0, "end": len(chains[0][1]),
                              "length": len(chains[0][1])},
                             {"chain_id": "B", "start": len(chains[0][1]), "end": len(seq),
                              "length": len(chains[1][1])}]
    assert abs(doc["iptm"] - float(o["confidence/iptm"])) < 1e-4
    assert abs(doc["ptm"] - float(o["confidence/ptm"])) < 1e-4
    assert doc["chain_pair_iptm"]["A"]["B"] == doc["chain_pair_iptm"]["B"]["A"] == doc["iptm"]
    pae = np.array(doc["pae"])
    assert pae.shape == (len(seq), len(seq))
    assert np.abs(pae - o["confidence/predicted_aligned_error"]).max() <= 0.005 + 1e-4
    a_end = len(chains[0][1])
    assert abs(doc["chain_pair_pae"]["A"]["B"] -
               o["confidence/predicted_aligned_error"][:a_end, a_end:].mean()) < 1e-2


def test_duplicate_chain_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        write_complex_structures(tmp_path, "x", [("A", "G"), ("A", "G")],
                                 np.zeros((2, 37, 3)), np.zeros(2))
