"""AlphaFold's restrained Amber relaxation (AF2 supplement 1.8.6; `alphafold/relax/`), with
OpenMM + pdbfixer, bounded in time and never fatal.

Protocol (AlphaFold `amber_minimize.run_pipeline`, defaults of `run_alphafold.py`):
1. pdbfixer adds missing heavy atoms and hydrogens (pH 7);
2. Amber99SB force field, no cutoff, bonds to hydrogen constrained; every heavy atom held to
   its predicted position by a harmonic restraint 0.5 k |x - x0|^2, k = 10 kcal/mol/Å^2;
3. L-BFGS energy minimisation to tolerance 2.39 kcal/mol, unlimited iterations;
4. violation loop: while the minimised model has clashes or peptide-bond violations
   (`violations.structure_violations`), the violating residues lose their restraints and
   the minimisation is rerun, at most 3 outer iterations.

Safety: the run happens in a child process killed after `timeout_s` (OpenMM has no way to
interrupt a minimisation); the relaxed model is kept only if its heavy atoms stay within
`max_heavy_atom_rmsd` of the prediction and it has no more violations than before. Any
failure (OpenMM/pdbfixer missing, a force-field error, the timeout, the safety check) returns
a result with `relaxed=False` and the reason; the unrelaxed file is never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from protdp.relax.violations import heavy_atoms, structure_violations


# a minimisation that leaves at least this fraction of the violations did not relax the model
# (OpenMM's L-BFGS stalls on thousands of overlapping atoms: seen on AlphaFold's random-weight
# predictions, 625 -> 624 clashes with the heavy atoms moved 0.015 Å)
STALLED_FRACTION = 0.5


@dataclass
class RelaxConfig:
    """AlphaFold's relaxation settings (run_alphafold.py) plus the time bound."""

    stiffness: float = 10.0
    """Restraint spring constant on heavy atoms (kcal/mol/Å^2)."""
    tolerance: float = 2.39
    """Minimiser energy tolerance (kcal/mol)."""
    max_iterations: int = 0
    """Minimiser iterations per run (0: until converged)."""
    max_outer_iterations: int = 3
    """Violation loop: minimisations at most."""
    timeout_s: float = 300.0
    """The child process is killed after this (never fatal)."""
    max_heavy_atom_rmsd: float = 1.0
    """Safety check: heavy-atom RMSD (Å, no superposition) of relaxed vs predicted above this
    -> the relaxed model is discarded."""

    def __post_init__(self):
        for name in ("stiffness", "tolerance", "timeout_s", "max_heavy_atom_rmsd"):
            if not getattr(self, name) > 0:
                raise ValueError(f"relax {name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class RelaxResult:
    relaxed: bool
    reason: str | None = None
    heavy_atom_rmsd: float | None = None
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    outer_iterations: int = 0
    energy_kcal: dict = field(default_factory=dict)
    seconds: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _minimize(pdb_text: str, cfg: RelaxConfig, exclude: set[int]):
    """One restrained minimisation -> (PDB text with hydrogens, energy before, after)."""
    import io

    import openmm
    from openmm import app, unit

    pdb = app.PDBFile(io.StringIO(pdb_text))
    ff = app.ForceField("amber99sb.xml")
    system = ff.createSystem(pdb.topology, constraints=app.HBonds)
    k = cfg.stiffness * unit.kilocalories_per_mole / unit.angstroms ** 2
    force = openmm.CustomExternalForce("0.5 * k * ((x - x0)^2 + (y - y0)^2 + (z - z0)^2)")
    force.addGlobalParameter("k", k)
    for p in ("x0", "y0", "z0"):
        force.addPerParticleParameter(p)
    for i, atom in enumerate(pdb.topology.atoms()):
        if atom.element.name != "hydrogen" and atom.residue.index not in exclude:
            force.addParticle(i, pdb.positions[i])
    system.addForce(force)
    integrator = openmm.LangevinIntegrator(0, 0.01, 0.0)
    platform = openmm.Platform.getPlatformByName("CPU")
    sim = app.Simulation(pdb.topology, system, integrator, platform, {"Threads": "1"})
    sim.context.setPositions(pdb.positions)
    e0 = sim.context.getState(getEnergy=True).getPotentialEnergy()
    # AlphaFold's 2.39 kcal/mol is OpenMM 7's default 10 kJ/mol; OpenMM 8 measures the
    # tolerance as a force (its default: 10 kJ/mol/nm), so the same number per nm is used
    tol = cfg.tolerance * unit.kilocalories_per_mole / unit.nanometer
    sim.minimizeEnergy(maxIterations=cfg.max_iterations, tolerance=tol)
    state = sim.context.getState(getEnergy=True, getPositions=True)
    out = io.StringIO()
    app.PDBFile.writeFile(sim.topology, state.getPositions(), out, keepIds=True)
    kcal = unit.kilocalories_per_mole
    return out.getvalue(), e0.value_in_unit(kcal), state.getPotentialEnergy().value_in_unit(kcal)


def _clean(pdb_path: Path) -> str:
    """pdbfixer: missing heavy atoms and hydrogens (AlphaFold `cleanup.fix_pdb`)."""
    import io

    import pdbfixer
    from openmm import app
    fixer = pdbfixer.PDBFixer(filename=str(pdb_path))
    fixer.findMissingResidues()
    fixer.missingResidues = {}
    fixer.findMissingAtoms()
    fixer.addMissingAtoms()
    fixer.addMissingHydrogens(7.0)
    out = io.StringIO()
    app.PDBFile.writeFile(fixer.topology, fixer.positions, out, keepIds=True)
    return out.getvalue()


def run_protocol(src: Path, dst: Path, cfg: RelaxConfig) -> dict:
    """The protocol in this process (the child of `relax_pdb`): writes dst, returns stats."""
    text = _clean(src)
    exclude: set[int] = set()
    energies = {}
    tmp = dst.with_name(dst.name + ".tmp.pdb")
    for it in range(1, cfg.max_outer_iterations + 1):
        text, e0, e1 = _minimize(text, cfg, exclude)
        energies.setdefault("initial", round(e0, 2))
        energies["final"] = round(e1, 2)
        tmp.write_text(text)
        v = structure_violations(tmp)
        if not v["violating_residues"] or set(v["violating_residues"]) <= exclude:
            break
        exclude |= set(v["violating_residues"])
    os.replace(tmp, dst)
    return {"outer_iterations": it, "energy_kcal": energies}


def heavy_atom_rmsd(a: Path, b: Path, exclude: tuple[int, ...] = ()) -> float:
    """Heavy-atom RMSD (Å) between two models of one chain or complex, atoms matched by
    (residue, name) with residues numbered over every chain (`heavy_atoms`), residues
    `exclude` (0-based) left out."""
    xa, _, ra, na = heavy_atoms(a)
    xb, _, rb, nb = heavy_atoms(b)
    ib = {(int(r), n): i for i, (r, n) in enumerate(zip(rb, nb))}
    pairs = [(i, ib[(int(r), n)]) for i, (r, n) in enumerate(zip(ra, na))
             if (int(r), n) in ib and int(r) not in exclude]
    d = xa[[p[0] for p in pairs]] - xb[[p[1] for p in pairs]]
    return float(np.sqrt((d ** 2).sum(-1).mean()))


def _copy_bfactors(src: Path, dst: Path) -> None:
    """The relaxed file keeps the prediction's per-residue pLDDT as B-factor (AlphaFold), on
    every chain of a complex."""
    import gemmi
    a, b = gemmi.read_structure(str(src)), gemmi.read_structure(str(dst))
    per_res = [r[0].b_iso for chain in a[0] for r in chain]        # every chain, file order
    relaxed = [r for chain in b[0] for r in chain]
    for i, r in enumerate(relaxed):
        for atom in r:
            atom.b_iso = per_res[i] if i < len(per_res) else 0.0
    tmp = dst.with_name(dst.name + ".tmp.pdb")
    b.write_pdb(str(tmp))
    os.replace(tmp, dst)


def safety_problem(res: RelaxResult, cfg: RelaxConfig) -> str | None:
    """Why a finished minimisation must not be kept, or None: heavy atoms moved past
    `max_heavy_atom_rmsd` (AlphaFold's check), more clashes + peptide-bond violations than
    before or most of them left (`STALLED_FRACTION`), or an energy that is not finite or higher than where the minimiser started (removing
    restraints in the violation loop only lowers the energy, so a working minimiser always ends
    below its start; OpenMM's L-BFGS gives up silently on overlapping atoms)."""
    if res.heavy_atom_rmsd > cfg.max_heavy_atom_rmsd:
        return (f"safety check: heavy-atom RMSD {res.heavy_atom_rmsd:.2f} Å (max "
                f"{cfg.max_heavy_atom_rmsd:g})")
    count = lambda v: v["clashes"] + v["bond_violations"]    # noqa: E731
    if count(res.after) > count(res.before):
        return "safety check: more violations after relaxation"
    if count(res.after) > 0 and count(res.after) >= STALLED_FRACTION * count(res.before):
        return (f"safety check: minimisation stalled ({count(res.after)} of "
                f"{count(res.before)} clashes and peptide-bond violations remain)")
    e0, e1 = res.energy_kcal.get("initial"), res.energy_kcal.get("final")
    if e0 is None or e1 is None or not np.isfinite(e1) or e1 > e0:
        return (f"safety check: minimisation did not lower the energy ({e0:.4g} -> {e1:.4g} "
                f"kcal/mol)" if e0 is not None and e1 is not None else
                "safety check: no energy reported")
    return None


def relax_pdb(src: str | Path, dst: str | Path, cfg: RelaxConfig | None = None) -> RelaxResult:
    """Relax `src` (a predicted PDB) into `dst`; never raises for a failed relaxation."""
    import time
    cfg = cfg or RelaxConfig()
    src, dst = Path(src), Path(dst)
    t0 = time.perf_counter()
    try:
        before = structure_violations(src)
    except Exception as exc:   # noqa: BLE001
        return RelaxResult(False, f"cannot read the prediction: {exc}")
    cmd = [sys.executable, "-m", "protdp.relax.amber", str(src), str(dst), json.dumps(asdict(cfg))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        dst.unlink(missing_ok=True)
        return RelaxResult(False, f"timed out after {cfg.timeout_s:g} s", before=before,
                           seconds=round(time.perf_counter() - t0, 2))
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1][:300]
        dst.unlink(missing_ok=True)
        return RelaxResult(False, f"minimisation failed: {last}", before=before,
                           seconds=round(time.perf_counter() - t0, 2))
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    after = structure_violations(dst)
    rmsd = heavy_atom_rmsd(src, dst)
    res = RelaxResult(True, None, round(rmsd, 3), before, after, stats["outer_iterations"],
                      stats["energy_kcal"], round(time.perf_counter() - t0, 2))
    reason = safety_problem(res, cfg)
    if reason is not None:
        dst.unlink(missing_ok=True)
        res.relaxed, res.reason = False, reason
        return res
    _copy_bfactors(src, dst)
    return res


if __name__ == "__main__":   # the child process of relax_pdb
    stats = run_protocol(Path(sys.argv[1]), Path(sys.argv[2]), RelaxConfig(**json.loads(sys.argv[3])))
    print(json.dumps(stats))
