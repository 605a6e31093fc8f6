"""Test and benchmark helper: sequence databases made of real sequences plus shuffled decoys.

Family members are the rows of real MSAs in ../shared/data (gaps removed, insertions kept,
read with Biopython), named `fam|<family>|<row>`; decoys are the same sequences shuffled with a
fixed seed (same composition and length, no homology), named `decoy|<family>|<row>`; background
is the 2,100-protein bacterial proteome shipped in pyhmmer's test data, named `bg|<id>`.
Also runs HMMER's own `jackhmmer` binary (Debian package `hmmer`) as the reference.
"""

from __future__ import annotations

import gzip
import os
import random
import subprocess
from pathlib import Path

# (family name, MSA file relative to the data folder): small real families of several kinds
FAMILIES = {
    "2p90_A02": "msa/2p90_A02.hhblits.a3m",          # 45 aa, 829 rows
    "102m_A": "msa/102m_A.colabfold.a3m",            # myoglobin, 98 rows
    "1a00_A": "msa/1a00_A.mgnify.a3m",               # hemoglobin alpha (a globin too)
    "T1055": "msa/T1055.hhblits.a3m",                # CASP14 target, 28 rows
    "2qke_E": "msa/2qke_E.cluster00.a3m",            # 118 rows
    "5zyh_A": "msa/5zyh_A.colabfold.a3m",            # 323 rows
    "T1001": "msa_only/T1001.a3m",                   # 193 rows
}
GLOBINS = {"102m_A", "1a00_A"}   # homologous families: hits across them are true homologs


def proteome_path() -> Path:
    import pyhmmer
    return Path(os.path.dirname(pyhmmer.__file__)) / "tests/data/seqs/938293.PRJEB85.HG003687.faa"


def msa_sequences(path: Path, min_length: int = 30) -> list[str]:
    """Unaligned, unique sequences of an a3m (query first): gaps dropped, insertions kept."""
    from Bio import SeqIO

    seen, out = set(), []
    for rec in SeqIO.parse(str(path), "fasta-pearson"):   # a3m may start with a #comment
        if rec.id in ("ss_pred", "ss_conf"):
            continue
        seq = str(rec.seq).replace("-", "").replace(".", "").upper()
        if len(seq) >= min_length and seq not in seen:
            seen.add(seq)
            out.append(seq)
    return out


def proteome() -> list[tuple[str, str]]:
    from Bio import SeqIO
    return [(rec.id, str(rec.seq).rstrip("*")) for rec in SeqIO.parse(str(proteome_path()), "fasta")]


def family_records(data_dir: Path, families=FAMILIES, decoys: bool = True, seed: int = 0,
                   background: bool = True) -> list[tuple[str, str]]:
    """(name, sequence) records: family rows, their shuffled decoys, the background proteome."""
    rng = random.Random(seed)
    records = []
    for fam, rel in families.items():
        for i, seq in enumerate(msa_sequences(data_dir / rel)):
            records.append((f"fam|{fam}|{i}", seq))
            if decoys:
                letters = list(seq)
                rng.shuffle(letters)
                records.append((f"decoy|{fam}|{i}", "".join(letters)))
    if background:
        records += [(f"bg|{name}", seq) for name, seq in proteome()]
    return records


def write_fasta(path: Path, records: list[tuple[str, str]], width: int = 60) -> Path:
    """FASTA (gzip when the name ends in .gz), sequences wrapped at `width`."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as fh:
        for name, seq in records:
            fh.write(f">{name}\n")
            for i in range(0, len(seq), width):
                fh.write(seq[i:i + width] + "\n")
    return path


def stockholm_names(path: Path) -> list[str]:
    """Row names of a Stockholm file in order of first appearance."""
    names: dict[str, None] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith(("#", "//")):
            names.setdefault(line.split()[0], None)
    return list(names)


def run_jackhmmer(query: tuple[str, str], db: Path, settings, workdir: Path, cpus: int = 1
                  ) -> Path:
    """HMMER's jackhmmer with `settings` (AF2's flags); returns the -A Stockholm path."""
    workdir.mkdir(parents=True, exist_ok=True)
    qfile = write_fasta(workdir / "query.fasta", [query])
    sto = workdir / "jackhmmer.sto"
    cmd = ["jackhmmer", "-o", "/dev/null", "-A", str(sto), "--noali",
           *settings.jackhmmer_args(cpus), str(qfile), str(db)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return sto
