"""Prediction files in other tools' layouts, built deterministically for checking protdp's
interface scores against ipsae.py (benchmarks/interface_vs_ipsae.py and
tests/test_interface_vs_ipsae.py share them):

* ColabFold layout (`*_scores_rank_001_*.json` + `*_unrelaxed_rank_001_*.pdb`) of the
  AlphaFold-Multimer fixture's own predictions (af2_reference/multimer outputs: AlphaFold's
  PAE, pLDDT, ipTM and predicted atoms) and of real 4HHB α2β2 with a synthetic PAE;
* AlphaFold 3 layout (`*_full_data_0.json`, `*_summary_confidences_0.json`, `*_model_0.cif`)
  of real 4HHB with its four haems as ligand chains (every ligand atom a token) and one
  threonine written as phosphothreonine TPO (every atom a token), and of 2Q2K (two protein
  chains + a DNA chain: the nucleic-acid d0 rule);
* Boltz layout (`pae_*.npz`, `plddt_*.npz` in [0, 1], `confidence_*.json`, `*.cif`) of 2Q2K.

Synthetic PAE: 0.5 + 0.35 × token distance + N(0, 1.5²) noise, clipped to [0.3, 31.5], plus
4 Å between one chain pair, so interfaces exist and pairs differ; rounded to 2 decimals as
the tools write it. Seeded numpy RNG: the same files every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CF_STEM = "{name}_{kind}_rank_001_alphafold2_multimer_v3_model_1_seed_000"
AF3_COLUMNS = ("group_PDB", "id", "type_symbol", "label_atom_id", "label_alt_id",
               "label_comp_id", "label_asym_id", "label_entity_id", "label_seq_id",
               "pdbx_PDB_ins_code", "Cartn_x", "Cartn_y", "Cartn_z", "occupancy",
               "B_iso_or_equiv", "auth_seq_id", "auth_asym_id", "pdbx_PDB_model_num")
STANDARD = {"ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE", "LEU", "LYS",
            "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL", "DA", "DC", "DG", "DT"}


def _atoms(structure_path: Path, ligands: bool) -> list[dict]:
    """Atoms of model 1 in file order (first altloc, no hydrogens/waters): polymer residues
    with standard names, plus ligands (label_seq '.') when asked; auth numbering kept."""
    import gemmi

    st = gemmi.read_structure(str(structure_path))
    st.remove_hydrogens()
    st.remove_alternative_conformations()
    st.remove_waters()
    out, ligand_chain = [], {}
    for chain in st[0]:
        for res in chain:
            polymer = res.name in STANDARD and res.het_flag == "A"
            if not polymer and not (ligands and res.het_flag == "H"):
                continue
            cid = chain.name
            if not polymer:                     # AF3: each ligand is a chain of its own
                key = (chain.name, res.seqid.num)
                ligand_chain.setdefault(key, None)
                cid = None
            for atom in res:
                out.append({"chain": cid, "lig_key": None if polymer else (chain.name,
                            res.seqid.num), "resname": res.name, "resnum": res.seqid.num,
                            "atom": atom.name, "element": atom.element.name,
                            "xyz": np.array(atom.pos.tolist())})
    polymer_chains = sorted({a["chain"] for a in out if a["chain"]})
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in polymer_chains]
    names = {key: spare[k] for k, key in enumerate(ligand_chain)}
    for a in out:
        if a["chain"] is None:
            a["chain"] = names[a["lig_key"]]
    # polymers first, then ligand chains (AlphaFold 3 order)
    return [a for a in out if a["lig_key"] is None] + [a for a in out if a["lig_key"]]


def _tokens(atoms: list[dict]) -> list[list[int]]:
    """AF3 tokens: one per standard residue, one per atom of ligands / modified residues."""
    tokens, seen = [], {}
    for k, a in enumerate(atoms):
        if a["lig_key"] is not None or a["resname"] not in STANDARD:
            tokens.append([k])
            continue
        key = (a["chain"], a["resnum"])
        if key not in seen:
            seen[key] = len(tokens)
            tokens.append([])
        tokens[seen[key]].append(k)
    return tokens


def synthetic_pae(xyz: np.ndarray, chains: list[str], rng, offset_pair=None) -> np.ndarray:
    """[T, 3] token positions -> [T, T] PAE (see the module docstring)."""
    d = np.sqrt(((xyz[:, None] - xyz[None]) ** 2).sum(-1))
    pae = 0.5 + 0.35 * d + rng.normal(0.0, 1.5, d.shape)
    if offset_pair:
        c = np.array(chains)
        a, b = offset_pair
        pae[np.ix_(c == a, c == b)] += 4.0
    return np.round(np.clip(pae, 0.3, 31.5), 2)


def _token_xyz(atoms, tokens):
    def centre(tok):
        for k in tok:
            if atoms[k]["atom"] in ("CA", "C1'"):
                return atoms[k]["xyz"]
        return atoms[tok[0]]["xyz"]
    return np.array([centre(t) for t in tokens])


def write_af3_cif(path: Path, atoms: list[dict], bfactors: np.ndarray) -> None:
    entity = {c: k + 1 for k, c in enumerate(dict.fromkeys(a["chain"] for a in atoms))}
    lines = ["data_model", "#", "loop_", *[f"_atom_site.{c}" for c in AF3_COLUMNS]]
    seq_ids: dict = {}
    for k, a in enumerate(atoms):
        ligand = a["lig_key"] is not None
        if not ligand:
            seq_ids.setdefault((a["chain"], a["resnum"]),
                               1 + sum(1 for key in seq_ids if key[0] == a["chain"]))
        seq = "." if ligand else str(seq_ids[(a["chain"], a["resnum"])])
        group = "HETATM" if ligand or a["resname"] not in STANDARD else "ATOM"
        x, y, z = a["xyz"]
        lines.append(f"{group} {k + 1} {a['element']} {a['atom']} . {a['resname']} {a['chain']} "
                     f"{entity[a['chain']]} {seq} ? {x:.3f} {y:.3f} {z:.3f} 1.00 "
                     f"{bfactors[k]:.2f} {seq if seq != '.' else 1} {a['chain']} 1")
    path.write_text("\n".join(lines) + "\n#\n")


def write_pdb(path: Path, atoms: list[dict], bfactors: np.ndarray) -> None:
    lines, serial, prev = [], 0, None
    for k, a in enumerate(atoms):
        if prev is not None and a["chain"] != prev:
            lines.append("TER")
        prev = a["chain"]
        serial += 1
        name = a["atom"] if len(a["atom"]) == 4 else f" {a['atom']:<3}"
        x, y, z = a["xyz"]
        lines.append(f"ATOM  {serial:5d} {name} {a['resname']:>3} {a['chain']}{a['resnum']:4d}"
                     f"    {x:8.3f}{y:8.3f}{z:8.3f}{1.0:6.2f}{bfactors[k]:6.2f}"
                     f"          {a['element']:>2}")
    path.write_text("\n".join(lines + ["TER", "END"]) + "\n")


def _pair_iptm(chains: list[str], rng) -> list[list[float]]:
    m = np.round(rng.uniform(0.2, 0.9, (len(chains), len(chains))), 2)
    return ((m + m.T) / 2).round(2).tolist()


def colabfold_from_fixture(out: Path, fixture: Path, case: str) -> tuple[Path, Path]:
    """ColabFold files of the fixture's own prediction of `case` (its outputs npz)."""
    from protdp.data.residue_constants import ATOM_TYPES, RESTYPE_3

    z = np.load(fixture / f"outputs_{case}.npz", allow_pickle=False)
    f = np.load(fixture / f"features_{case}.npz", allow_pickle=False)
    pos, mask = z["structure_module/final_atom_positions"], z["structure_module/final_atom_mask"]
    plddt, asym = np.round(z["confidence/plddt"], 2), f["asym_id"]
    atoms, bf, numbers = [], [], {}
    for i, aa in enumerate(f["aatype"]):
        chain = "ABCDEFGH"[int(asym[i]) - 1]
        numbers[chain] = numbers.get(chain, 0) + 1
        for a in np.nonzero(mask[i])[0]:
            atoms.append({"chain": chain, "lig_key": None, "resname": RESTYPE_3[int(aa)],
                          "resnum": numbers[chain], "atom": ATOM_TYPES[a],
                          "element": ATOM_TYPES[a][0], "xyz": pos[i, a]})
            bf.append(plddt[i])
    name = f"fixture_{case}"
    pdb = out / (CF_STEM.format(name=name, kind="unrelaxed") + ".pdb")
    write_pdb(pdb, atoms, np.array(bf))
    scores = {"plddt": plddt.tolist(),
              "max_pae": float(z["confidence/max_predicted_aligned_error"]),
              "pae": np.round(z["confidence/predicted_aligned_error"], 2).tolist(),
              "ptm": round(float(z["confidence/ptm"]), 2),
              "iptm": round(float(z["confidence/iptm"]), 2)}
    js = out / (CF_STEM.format(name=name, kind="scores") + ".json")
    js.write_text(json.dumps(scores))
    return js, pdb


def _plddt_per_atom(atoms, rng) -> np.ndarray:
    per_res = {}
    for a in atoms:
        per_res.setdefault((a["chain"], a["resnum"], a["lig_key"]), rng.uniform(40, 95))
    return np.array([round(per_res[(a["chain"], a["resnum"], a["lig_key"])]
                           + rng.normal(0, 2), 2) for a in atoms])


def colabfold_real(out: Path, structure: Path, name: str, seed: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    atoms = _atoms(structure, ligands=False)
    tokens = _tokens(atoms)
    chains = [atoms[t[0]]["chain"] for t in tokens]
    per_res = np.round(rng.uniform(40, 95, len(tokens)), 2)
    bf = np.concatenate([[per_res[k]] * len(t) for k, t in enumerate(tokens)])
    pdb = out / (CF_STEM.format(name=name, kind="unrelaxed") + ".pdb")
    write_pdb(pdb, atoms, bf)
    pae = synthetic_pae(_token_xyz(atoms, tokens), chains, rng, ("A", "B"))
    js = out / (CF_STEM.format(name=name, kind="scores") + ".json")
    js.write_text(json.dumps({"plddt": per_res.tolist(), "pae": pae.tolist(),
                              "ptm": 0.71, "iptm": 0.64}))
    return js, pdb


def af3_real(out: Path, structure: Path, name: str, seed: int, modified: tuple | None
             ) -> tuple[Path, Path]:
    """AlphaFold 3 server files; `modified` = (chain, auth residue number) written as TPO."""
    rng = np.random.default_rng(seed)
    atoms = _atoms(structure, ligands=True)
    if modified:
        for a in atoms:
            if (a["chain"], a["resnum"]) == modified:
                a["resname"] = "TPO"
    tokens = _tokens(atoms)
    chains = [atoms[t[0]]["chain"] for t in tokens]
    atom_plddt = _plddt_per_atom(atoms, rng)
    cif = out / f"fold_{name}_model_0.cif"
    write_af3_cif(cif, atoms, atom_plddt)
    pae = synthetic_pae(_token_xyz(atoms, tokens), chains, rng, ("A", "B"))
    full = {"atom_chain_ids": [a["chain"] for a in atoms], "atom_plddts": atom_plddt.tolist(),
            "pae": pae.tolist(), "token_chain_ids": chains,
            "token_res_ids": [atoms[t[0]]["resnum"] for t in tokens]}
    js = out / f"fold_{name}_full_data_0.json"
    js.write_text(json.dumps(full))
    uniq = list(dict.fromkeys(chains))
    (out / f"fold_{name}_summary_confidences_0.json").write_text(json.dumps(
        {"chain_pair_iptm": _pair_iptm(uniq, rng), "iptm": 0.62, "ptm": 0.7}))
    return js, cif


def boltz_real(out: Path, structure: Path, name: str, seed: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    atoms = _atoms(structure, ligands=True)
    tokens = _tokens(atoms)
    chains = [atoms[t[0]]["chain"] for t in tokens]
    atom_plddt = _plddt_per_atom(atoms, rng)
    cif = out / f"{name}_model_0.cif"
    write_af3_cif(cif, atoms, atom_plddt)
    pae = synthetic_pae(_token_xyz(atoms, tokens), chains, rng, ("A", "B")).astype(np.float32)
    np.savez(out / f"pae_{name}_model_0.npz", pae=pae)
    np.savez(out / f"plddt_{name}_model_0.npz",
             plddt=rng.uniform(0.4, 0.95, len(tokens)).astype(np.float32))
    uniq = list(dict.fromkeys(chains))
    m = _pair_iptm(uniq, rng)
    (out / f"confidence_{name}_model_0.json").write_text(json.dumps(
        {"pair_chains_iptm": {str(i): {str(j): m[i][j] for j in range(len(uniq))}
                              for i in range(len(uniq))}}))
    return out / f"pae_{name}_model_0.npz", cif


def build_cases(out: Path, fixture: Path, data: Path) -> dict[str, tuple[Path, Path]]:
    """Every case: name -> (PAE file, structure file), written under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return {
        "colabfold_fixture_4hhb": colabfold_from_fixture(out, fixture, "4hhb_hbA1-36_hbB1-40"),
        "colabfold_fixture_2p90x2": colabfold_from_fixture(out, fixture, "2p90_A02_x2"),
        "colabfold_4hhb": colabfold_real(out, data / "structures" / "4hhb.cif", "hb4", 11),
        "af3_4hhb_haem_tpo": af3_real(out, data / "structures" / "4hhb.cif", "hb4", 12,
                                      ("A", 38)),
        "af3_2q2k_dna": af3_real(out, data / "structures" / "2q2k.cif", "dna2q2k", 13, None),
        "boltz_2q2k_dna": boltz_real(out, data / "structures" / "2q2k.cif", "dna2q2k", 14),
    }
