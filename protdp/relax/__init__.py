"""Optional Amber relaxation of predicted structures (AlphaFold's restrained protocol) with
OpenMM + pdbfixer (`pip install protdp[relax]`); never fatal, bounded in time."""

from protdp.relax.amber import RelaxConfig, RelaxResult, relax_pdb
from protdp.relax.violations import structure_violations

__all__ = ["RelaxConfig", "RelaxResult", "relax_pdb", "structure_violations"]
