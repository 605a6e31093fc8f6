"""protdp.interface (issue 43): the d0 rules, actifpTM against ColabFold's formula on the
AlphaFold-Multimer fixture's logits, and `protdp interface` on good and bad files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from protdp.cli import main as protdp_main
from protdp.interface.scores import Residues, d0_of_length, d0_per_residue, interface_scores
from protdp.model.multimer.heads import chain_pair_actifptm, contact_probability
from test_complex_pairing import FIXTURE


def test_d0_rules_follow_ipsae_py():
    assert d0_of_length(27) == 1.0                                   # L <= 27: 1
    assert d0_of_length(28) == pytest.approx(1.24 * 13 ** (1 / 3) - 1.8)
    assert d0_of_length(20, nucleic=True) == 2.0                     # nucleic-acid floor
    assert d0_per_residue(np.array([0, 27]))[1] == pytest.approx(1.24 * 12 ** (1 / 3) - 1.8)
    assert d0_per_residue(np.array([0]))[0] == 1.0                   # clipped to 26 -> 0.96 -> 1


def colabfold_actifptm(logits, breaks, dgram_logits, dgram_edges, asym, a, b):
    """ColabFold extra_ptm.get_actifptm_probs + predicted_tm_score_modified, in numpy, for
    chains a, b (positions contiguous as in ColabFold's chain start/end indices)."""
    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    bins = np.append(0, dgram_edges)
    cmap = (softmax(dgram_logits) * (bins < 8.0)).sum(-1)
    L = len(asym)
    ia, ib = np.nonzero(asym == a)[0], np.nonzero(asym == b)[0]
    w = np.zeros((L, L))
    w[ia[0]:ia[-1] + 1, ib[0]:ib[-1] + 1] = cmap[ia[0]:ia[-1] + 1, ib[0]:ib[-1] + 1]
    w[ib[0]:ib[-1] + 1, ia[0]:ia[-1] + 1] = cmap[ib[0]:ib[-1] + 1, ia[0]:ia[-1] + 1]
    seq_mask = np.zeros(L)
    seq_mask[np.concatenate([ia, ib])] = 1
    step = breaks[1] - breaks[0]
    centres = np.append(breaks + step / 2, breaks[-1] + step / 2 + step)
    d0 = 1.24 * (max(L, 19) - 15) ** (1 / 3) - 1.8
    term = (softmax(logits) * (1 / (1 + centres ** 2 / d0 ** 2))).sum(-1)
    term *= asym[:, None] != asym[None, :]
    normed = w / (1e-8 + w.sum(-1, keepdims=True))
    return float(((term * normed).sum(-1) * seq_mask).max())


@pytest.mark.parametrize("case", ["4hhb_hbA1-36_hbB1-40", "2p90_A02_x2"])
def test_actifptm_matches_colabfold_formula_on_fixture_logits(case):
    z = np.load(FIXTURE / f"outputs_{case}.npz", allow_pickle=False)
    logits = z["predicted_aligned_error/logits"].astype(np.float64)
    breaks = z["predicted_aligned_error/breaks"].astype(np.float64)
    dgram, edges = z["distogram/logits"].astype(np.float64), z["distogram/bin_edges"]
    asym = z["predicted_aligned_error/asym_id"]
    want = colabfold_actifptm(logits, breaks, dgram, edges.astype(np.float64), asym, 1, 2)
    step = breaks[1] - breaks[0]
    centres = torch.tensor(np.append(breaks + step / 2, breaks[-1] + step / 2 + step))
    contact = contact_probability(torch.tensor(dgram), torch.tensor(edges, dtype=torch.float64))
    matrix, chains = chain_pair_actifptm(torch.tensor(logits), centres, contact,
                                         torch.tensor(asym))
    assert chains.tolist() == [1, 2]
    assert float(matrix[0, 1]) == pytest.approx(want, abs=1e-9)
    assert float(matrix[1, 0]) == float(matrix[0, 1]) and math.isnan(float(matrix[0, 0]))
    # contact weighting matters: uniform weights (plain pair ipTM with d0 of L) differ
    uniform = colabfold_actifptm(logits, breaks, np.zeros_like(dgram), edges, asym, 1, 2)
    assert abs(uniform - want) > 1e-4


def _toy_files(tmp_path, n_a=30, n_b=30, pae_value=None):
    """Two straight chains side by side (ColabFold layout): PDB + scores JSON."""
    lines, serial = [], 0
    for chain, n, x0 in (("A", n_a, 0.0), ("B", n_b, 6.0)):
        for i in range(n):
            for name, dx in (("CA", 0.0), ("CB", 1.0)):
                serial += 1
                lines.append(f"ATOM  {serial:5d}  {name:<3} ALA {chain}{i + 1:4d}    "
                             f"{x0 + dx:8.3f}{3.8 * i:8.3f}{0.0:8.3f}  1.00 80.00           C")
        lines.append("TER")
    (tmp_path / "m.pdb").write_text("\n".join(lines) + "\nEND\n")
    n = n_a + n_b
    rng = np.random.default_rng(0)
    pae = np.round(rng.uniform(1, 20, (n, n)), 2).tolist() if pae_value is None else pae_value
    (tmp_path / "s.json").write_text(json.dumps({"plddt": [80.0] * n, "pae": pae,
                                                 "iptm": 0.5}))
    return tmp_path / "s.json", tmp_path / "m.pdb"


def test_cli_prints_table_and_writes_json(tmp_path, capsys):
    pae, pdb = _toy_files(tmp_path)
    assert protdp_main(["interface", str(pae), str(pdb), "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert "ipSAE_d0chn" in out and out.count(" asym ") == 2 and out.count(" max ") == 1
    doc = json.loads((tmp_path / "o.json").read_text())
    rows = doc["interface_scores"]
    assert doc["format"] == "alphafold2" and [r["type"] for r in rows] == ["asym", "asym", "max"]
    assert rows[2]["ipsae"] == max(rows[0]["ipsae"], rows[1]["ipsae"])
    assert rows[0]["n0chn"] == 60 and rows[0]["pae_cutoff"] == 10.0


@pytest.mark.parametrize("problem, needle", [
    ("size", "PAE is 59x59 but the structure has 60 residues"),
    ("nan", "non-finite"),
    ("format", "unknown PAE file format"),
    ("one_chain", "interface scores need two or more"),
    ("empty_chain", "chain C has no residues"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, problem, needle):
    pae, pdb = _toy_files(tmp_path)
    doc = json.loads(pae.read_text())
    if problem == "size":
        doc["pae"] = [row[:59] for row in doc["pae"][:59]]
    elif problem == "nan":
        doc["pae"][3][4] = None
    elif problem == "format":
        doc = {"something": 1}
    elif problem == "one_chain":
        pdb.write_text("".join(ln for ln in pdb.read_text().splitlines(True) if " B " not in ln))
        doc["pae"], doc["plddt"] = [row[:30] for row in doc["pae"][:30]], doc["plddt"][:30]
    elif problem == "empty_chain":                  # a chain of waters only: no PAE rows
        pdb.write_text(pdb.read_text().replace("END\n", "HETATM 9999  O   HOH C   1       "
                                               "0.000   0.000   9.000  1.00  0.00           O\n"
                                               "END\n"))
    pae.write_text(json.dumps(doc))
    assert protdp_main(["interface", str(pae), str(pdb)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("protdp interface: error:")
    assert str(pae.name) in err[0] or str(pdb.name) in err[0]


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04broken", b"not an npz at all"])
def test_cli_bad_boltz_npz_is_one_line(tmp_path, capsys, content):
    _, pdb = _toy_files(tmp_path)
    bad = tmp_path / "pae_x_model_0.npz"
    bad.write_bytes(content)
    assert protdp_main(["interface", str(bad), str(pdb)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a readable .npz" in err[0] and bad.name in err[0]


def test_scores_respond_to_the_pae_cutoff():
    """A PAE block below the cutoff in one direction only: ipSAE(A->B) > 0, ipSAE(B->A) = 0."""
    n = 30
    chains = np.array(["A"] * n + ["B"] * n)
    res = Residues(chains, np.array(["ALA"] * 2 * n), np.tile(np.arange(1, n + 1), 2),
                   np.stack([np.r_[np.zeros(n), np.full(n, 6.0)], np.r_[np.arange(n),
                             np.arange(n)] * 3.8, np.zeros(2 * n)], 1))
    pae = np.full((2 * n, 2 * n), 25.0)
    pae[:n, n:] = 3.0
    rows = interface_scores(pae, np.full(2 * n, 90.0), res)
    ab, ba, mx = rows
    d0 = 1.24 * (n - 15) ** (1 / 3) - 1.8                             # d0res of n0res = 30
    assert ab["ipsae"] == pytest.approx(1 / (1 + (3.0 / d0) ** 2))
    assert ba["ipsae"] == 0.0 and mx["ipsae"] == ab["ipsae"]
    assert ab["n0res"] == n and ab["n0dom"] == 2 * n and ba["lis"] == 0.0


def test_diverged_prediction_rows_are_json_without_nan():
    """A diverged model's NaN PAE / pLDDT: the stored rows hold null, never NaN (scores.json is
    written with allow_nan=False), and no best pair is made up from them."""
    from protdp.interface.complex import best_interface, complex_interface_rows

    chains = [("A", "G" * 30), ("B", "A" * 30)]
    positions = np.zeros((60, 37, 3))
    positions[:, 1, 1] = np.arange(60) * 3.8                      # Cα (glycine's Cβ)
    positions[:, 3, 1] = np.arange(60) * 3.8 + 1.0                # Cβ
    pae = np.full((60, 60), np.nan)
    rows = complex_interface_rows(chains, positions, np.full(60, np.nan), pae)
    json.dumps(rows, allow_nan=False)
    assert rows[2]["ipsae"] == 0.0                    # no PAE below the cutoff
    assert rows[0]["pdockq"] is None and rows[0]["pdockq2"] is None   # contacts, NaN pLDDT
    finite = complex_interface_rows(chains, positions, np.full(60, 80.0), np.full((60, 60), 2.0))
    assert best_interface(finite)["ipsae"] == finite[2]["ipsae"] > 0
    assert best_interface([{**r, "ipsae": None} for r in finite]) is None


def test_chain_ids_with_a_dash_keep_their_pairs():
    """mmCIF chain ids may contain "-" (AF3 / Boltz "A-2"): the pairs are the chains' own, with
    the numbers of the same complex under plain ids, in ipsae.py's "A-B" text order."""
    rng = np.random.default_rng(5)
    n = 36
    plain = np.repeat(np.array(["A", "B", "C"]), 12)
    cb = np.cumsum(rng.normal(0, 2.0, (n, 3)), axis=0)
    pae = rng.uniform(1, 25, (n, n))
    plddt = rng.uniform(40, 95, n)

    def rows(ids):
        res = Residues(ids, np.array(["ALA"] * n), np.tile(np.arange(1, 13), 3), cb)
        return interface_scores(pae, plddt, res)
    want = rows(plain)
    rename = {"A": "A-1", "B": "B", "C": "B-2"}           # "A-1-B" splits as ("A", "1-B")
    got = rows(np.array([rename[c] for c in plain]))
    assert [(r["chain_1"], r["chain_2"], r["type"]) for r in got] == [
        ("A-1", "B", "asym"), ("B", "A-1", "asym"), ("A-1", "B", "max"),
        ("A-1", "B-2", "asym"), ("B-2", "A-1", "asym"), ("A-1", "B-2", "max"),
        ("B", "B-2", "asym"), ("B-2", "B", "asym"), ("B", "B-2", "max")]
    back = {v: k for k, v in rename.items()}
    for g, w in zip(got, want):
        assert {**g, "chain_1": back[g["chain_1"]], "chain_2": back[g["chain_2"]]} == w
    assert [(r["chain_1"], r["chain_2"]) for r in want][::3] == [("A", "B"), ("A", "C"),
                                                                   ("B", "C")]
