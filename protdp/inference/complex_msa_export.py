"""`protdp msa search --complexes --format colabfold`: each complex's searched MSAs written as
ColabFold's complex a3m (`protdp.complex.colabfold_a3m`), `<out>/<complex>.a3m`, so that MSAs
made here can be used by ColabFold (and read back by `protdp predict` / `protdp complex
features --msa-dir`, which prefer `<complex>.a3m` over the per-chain folders).

The rows are exactly those `protdp complex features` would use from the folders: every chain's
MSAs but the pairing database's, merged, as the unpaired rows; for a heteromer the species
pairing of the chains' `stockholm/<pairing db>.sto` (AlphaFold-Multimer's) as the paired block;
all restricted to the pair mode. A bad complex is one line; the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protdp.errors import ProtdpError
from protdp.inference.complexes import PAIRING_DB, chain_inputs
from protdp.inference.writers import safe_name
from protdp.complex.colabfold_a3m import complex_a3m_from_chains, write_complex_a3m
from protdp.complex.inputs import read_complexes
from protdp.complex.pair_modes import DEFAULT_PAIR_MODE


@dataclass
class Exported:
    complex_id: str
    path: Path | None                  # the written file, None on error
    error: str | None = None


def export_colabfold_a3m(fasta: str | Path, msa_dir: str | Path, *, max_length: int,
                         max_unknown_fraction: float, pairing_db: str = PAIRING_DB,
                         pair_mode: str = DEFAULT_PAIR_MODE) -> list[Exported]:
    """Every readable complex of `fasta` whose chains were searched into `msa_dir` -> its
    `<msa_dir>/<complex>.a3m` in ColabFold's layout (complexes the FASTA reader rejects are
    left out: the search reports them)."""
    out = []
    for t in read_complexes(fasta):
        if t.error:                     # the search has reported it already
            continue
        try:
            inputs, _ = chain_inputs(t, Path(msa_dir), pairing_db=pairing_db,
                                     max_length=max_length,
                                     max_unknown_fraction=max_unknown_fraction,
                                     pair_mode=pair_mode, user_msas=False)
            path = write_complex_a3m(Path(msa_dir) / f"{safe_name(t.complex_id)}.a3m",
                                     complex_a3m_from_chains(inputs))
            out.append(Exported(t.complex_id, path))
        except (ProtdpError, ValueError) as exc:
            out.append(Exported(t.complex_id, None, str(exc).replace("\n", " ")))
    return out
