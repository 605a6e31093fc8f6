"""ModelCIF mmCIF of a prediction (python-modelcif): entity + sequence records, the model's
atoms with pLDDT as B-factor, the QA metrics Mol* and PDBe colour by (per-residue pLDDT in
`_ma_qa_metric_local`, global pLDDT and pTM in `_ma_qa_metric_global`, 0-100 / 0-1 scales as
AFDB), the software and the model's provenance (checkpoint digest, seed, recycles) in the
modelling protocol. Written atomically."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from protdp import __version__
from protdp.data.residue_constants import ATOM_TYPES
from protdp.fileio import atomic_write_bytes


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

    return LocalPLDDT, GlobalPLDDT, GlobalPTM, GlobalIpTM


def write_modelcif(path: Path, name: str, sequence: str, positions: np.ndarray, mask: np.ndarray,
                   plddt: np.ndarray, ptm: float | None, details: dict, *,
                   chains: list[tuple[str, str]] | None = None,
                   iptm: float | None = None) -> Path:
    """positions [L, 37, 3] Å, mask [L, 37], plddt [L] (0-100, already rounded). `chains`
    [(chain id, sequence)] in residue order (a complex: one entity per distinct sequence, one
    asym unit per chain, ipTM as a global metric); default one chain A."""
    import ihm
    import modelcif
    import modelcif.dumper
    import modelcif.model
    import modelcif.protocol

    LocalPLDDT, GlobalPLDDT, GlobalPTM, GlobalIpTM = _classes()
    alphabet = ihm.LPeptideAlphabet()
    chains = chains or [("A", sequence)]

    def comps(seq):
        return [alphabet[aa] if aa in alphabet._comps else alphabet["X"] if "X" in alphabet._comps
                else ihm.LPeptideChemComp("UNK", "X", "X") for aa in seq]
    system = modelcif.System(title=f"protdp prediction of {name}", id=name.upper()[:40])
    software = modelcif.Software("protdp", "model building",
                                 "AlphaFold2-style structure prediction with a confidence gate",
                                 "https://pypi.org/project/protdp/", version=__version__)
    system.software.append(software)
    entities: dict[str, object] = {}
    for cid, seq in chains:
        if seq not in entities:
            entities[seq] = modelcif.Entity(comps(seq), description=f"{name} (predicted)"
                                            if len(chains) == 1 else f"{name} entity "
                                            f"{len(entities) + 1} (predicted)")
    residues = []                                  # (asym unit, 1-based seq id) per residue
    asyms = []
    for cid, seq in chains:
        asym = modelcif.AsymUnit(entities[seq], details=f"{name} chain {cid}", id=cid)
        asyms.append(asym)
        residues += [(asym, k + 1) for k in range(len(seq))]
    assembly = modelcif.Assembly(asyms, name=f"{name} assembly")
    atoms = []
    for i, (asym, seq_id) in enumerate(residues):
        for a in np.nonzero(mask[i] > 0)[0]:
            x, y, z = (float(v) for v in positions[i, a])
            atoms.append(modelcif.model.Atom(asym_unit=asym, seq_id=seq_id,
                                             atom_id=ATOM_TYPES[a], type_symbol=ATOM_TYPES[a][0],
                                             x=x, y=y, z=z, biso=float(plddt[i]), occupancy=1.0))

    class _Model(modelcif.model.AbInitioModel):
        def get_atoms(self):
            return iter(atoms)

    model = _Model(assembly=assembly, name=f"{name} top-ranked model")
    model.qa_metrics.append(GlobalPLDDT(round(float(np.mean(plddt)), 2)))
    if ptm is not None:
        model.qa_metrics.append(GlobalPTM(round(float(ptm), 4)))
    if iptm is not None:
        model.qa_metrics.append(GlobalIpTM(round(float(iptm), 4)))
    for i, (asym, seq_id) in enumerate(residues):
        model.qa_metrics.append(LocalPLDDT(asym.residue(seq_id), round(float(plddt[i]), 2)))
    system.model_groups.append(modelcif.model.ModelGroup([model], name="ranked models"))
    protocol = modelcif.protocol.Protocol()
    protocol.steps.append(modelcif.protocol.ModelingStep(
        input_data=modelcif.data.DataGroup(list(entities.values())), output_data=model,
        software=software,
        name="prediction",
        details="; ".join(f"{k}={v}" for k, v in details.items())))
    system.protocols.append(protocol)
    text = io.StringIO()
    modelcif.dumper.write(text, [system])
    return atomic_write_bytes(path, text.getvalue().encode())
