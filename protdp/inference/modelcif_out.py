"""ModelCIF mmCIF of a prediction (python-modelcif): every ranked model (best first, one model
group), entities named after the FASTA records of their chains and one asym unit per chain
naming its record (chain -> entity -> FASTA record), each model's atoms with pLDDT as B-factor
and its QA metrics (per-residue pLDDT in `_ma_qa_metric_local`; global pLDDT, pTM, ipTM in
`_ma_qa_metric_global`, 0-100 / 0-1 scales as AFDB; the PAE matrix in
`_ma_qa_metric_local_pairwise`, as ModelArchive's AlphaFold entries), the software and the
provenance (checkpoint digest, seed, recycles) in the modelling protocol. Written atomically."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from protdp import __version__
from protdp.data.residue_constants import ATOM_TYPES
from protdp.fileio import atomic_write_bytes


def cif_text(text) -> str:
    """A FASTA header as mmCIF text: printable ASCII kept, a double quote as a single one, every
    other character (controls, bidi, non-ASCII, the backslash) as <U+XXXX>. mmCIF 1.1 is ASCII
    and has no escapes: a value holding both quote kinds cannot be quoted, and python-ihm
    writes backslashes that gemmi, rightly, reads literally. The exact header stays in
    msas/chain_id_map.json."""
    s = "" if text is None else str(text)
    return "".join("'" if c == '"' else c if " " <= c <= "~" and c != "\\" else f"<U+{ord(c):04X}>"
                   for c in s)


def _classes():
    import modelcif.qa_metric as qa

    class LocalPLDDT(qa.Local, qa.PLDDT):
        """Predicted lDDT-Ca per residue (0-100)."""
        name = "pLDDT"
        software = None

    class GlobalPLDDT(qa.Global, qa.PLDDT):
        """Mean pLDDT of the chain (0-100)."""
        name = "pLDDT"
        software = None

    class GlobalPTM(qa.Global, qa.PTM):
        """Predicted TM-score (0-1)."""
        name = "pTM"
        software = None

    class GlobalIpTM(qa.Global, qa.IpTM):
        """Interface predicted TM-score of the complex (0-1, AlphaFold-Multimer)."""
        name = "ipTM"
        software = None

    class LocalPAE(qa.LocalPairwise, qa.PAE):
        """Predicted aligned error (Å) of residue2 when aligned on residue1."""
        name = "PAE"
        software = None

    return LocalPLDDT, GlobalPLDDT, GlobalPTM, GlobalIpTM, LocalPAE


def _model_class():
    import modelcif.model

    class _Model(modelcif.model.AbInitioModel):
        """A ranked model; `atoms` set per instance."""
        def get_atoms(self):
            return iter(self.atoms)
    return _Model


def _atoms(residues, positions, mask, plddt) -> list:
    """ModelCIF atoms of one model: positions [L, 37, 3] Å, mask [L, 37], plddt [L] (B)."""
    import modelcif.model
    atoms = []
    for i, (asym, seq_id) in enumerate(residues):
        for a in np.nonzero(mask[i] > 0)[0]:
            x, y, z = (float(v) for v in positions[i, a])
            atoms.append(modelcif.model.Atom(asym_unit=asym, seq_id=seq_id,
                                             atom_id=ATOM_TYPES[a], type_symbol=ATOM_TYPES[a][0],
                                             x=x, y=y, z=z, biso=float(plddt[i]), occupancy=1.0))
    return atoms


def _qa_metrics(model, residues, pred: dict, classes) -> None:
    """Global pLDDT / pTM / ipTM, per-residue pLDDT and the pairwise PAE [L, L] (Å, 2
    decimals; `_ma_qa_metric_local_pairwise`, residue1 = the aligned residue i, residue2 = the
    scored residue j, as AlphaFold's PAE[i, j])."""
    LocalPLDDT, GlobalPLDDT, GlobalPTM, GlobalIpTM, LocalPAE = classes
    plddt = pred["plddt"]
    model.qa_metrics.append(GlobalPLDDT(round(float(np.mean(plddt)), 2)))
    if pred.get("ptm") is not None:
        model.qa_metrics.append(GlobalPTM(round(float(pred["ptm"]), 4)))
    if pred.get("iptm") is not None:
        model.qa_metrics.append(GlobalIpTM(round(float(pred["iptm"]), 4)))
    res = [asym.residue(seq_id) for asym, seq_id in residues]
    for i, r in enumerate(res):
        model.qa_metrics.append(LocalPLDDT(r, round(float(plddt[i]), 2)))
    if pred.get("pae") is not None:
        pae = np.round(np.asarray(pred["pae"], np.float64), 2).tolist()          # [L, L]
        model.qa_metrics.extend(LocalPAE(ri, rj, pae[i][j]) for i, ri in enumerate(res)
                                for j, rj in enumerate(res))


def write_modelcif(path: Path, name: str, models: list[dict], details: dict, *,
                   chains: list[tuple[str, str]],
                   records: dict[str, str] | None = None) -> Path:
    """Every ranked model, best first, in one ModelCIF file. `models`: [{"label",
    "positions" [L, 37, 3] Å, "atom_mask" [L, 37], "plddt" [L] (0-100, already rounded),
    "ptm", "iptm", "pae" [L, L] or None}]. `chains` [(chain id, sequence)] in residue order
    (one entity per distinct sequence, one asym unit per chain). `records` {chain id: FASTA
    record description}: each entity names the records of its chains, each asym unit its
    record (chain -> entity -> FASTA record)."""
    import ihm
    import modelcif
    import modelcif.dumper
    import modelcif.model
    import modelcif.protocol

    classes = _classes()
    alphabet = ihm.LPeptideAlphabet()
    records = {cid: cif_text(d) for cid, d in (records or {cid: name for cid, _ in chains}).items()}

    def comps(seq):
        return [alphabet[aa] if aa in alphabet._comps else alphabet["X"] if "X" in alphabet._comps
                else ihm.LPeptideChemComp("UNK", "X", "X") for aa in seq]
    system = modelcif.System(title=f"protdp prediction of {name}", id=name.upper()[:40])
    software = modelcif.Software("protdp", "model building",
                                 "AlphaFold2-style structure prediction with a confidence gate",
                                 "https://pypi.org/project/protdp/", version=__version__)
    system.software.append(software)
    entities: dict[str, object] = {}
    for seq in dict.fromkeys(s for _, s in chains):
        described = "; ".join(dict.fromkeys(records[c] for c, s in chains if s == seq))
        entities[seq] = modelcif.Entity(comps(seq), description=described)
    residues, asyms = [], []                  # (asym unit, 1-based seq id) per residue
    for cid, seq in chains:
        asym = modelcif.AsymUnit(entities[seq], details=f"chain {cid}: FASTA record "
                                 f"'{records[cid]}'", id=cid)
        asyms.append(asym)
        residues += [(asym, k + 1) for k in range(len(seq))]
    assembly = modelcif.Assembly(asyms, name=f"{name} assembly")
    Model = _model_class()
    built = []
    for pred in models:
        model = Model(assembly=assembly, name=pred["label"])
        model.atoms = _atoms(residues, pred["positions"], pred["atom_mask"], pred["plddt"])
        _qa_metrics(model, residues, pred, classes)
        built.append(model)
    system.model_groups.append(modelcif.model.ModelGroup(built, name="ranked models"))
    protocol = modelcif.protocol.Protocol()
    protocol.steps.append(modelcif.protocol.ModelingStep(
        input_data=modelcif.data.DataGroup(list(entities.values())),
        output_data=modelcif.model.ModelGroup(built) if len(built) > 1 else built[0],
        software=software, name="prediction",
        details="; ".join(f"{k}={v}" for k, v in details.items())))
    system.protocols.append(protocol)
    text = io.StringIO()
    modelcif.dumper.write(text, [system])
    return atomic_write_bytes(path, text.getvalue().encode())
