"""Template search with pyhmmer: AlphaFold v2.3.2's hmmsearch route (`tools/hmmsearch.py`,
used by `run_alphafold.py` for the pdb_seqres database).

1. `hmmbuild --hand --amino` on the query's MSA (Stockholm; every `#=GC RF` column a match
   state): pyhmmer `Builder(architecture="hand")` with the default priors and weighting, the
   HMM passed through HMMER's text format as the binaries pass it (same rounding, same scores).
2. `hmmsearch --noali --cpu 8 --F1 0.1 --F2 0.1 --F3 0.1 --incE 100 -E 100 --domE 100
   --incdomE 100 -A pdb_hits.sto` against a pdb_seqres-style FASTA: a pyhmmer `Pipeline` with
   those thresholds (`HMMSEARCH_OPTIONS`), Z = number of database sequences as hmmsearch uses.
3. The `-A` alignment of every included domain with all consensus columns
   (`p7_tophits_Alignment(..., p7_ALL_CONSENSUS_COLS)`), written as Stockholm: the file
   AlphaFold writes as `pdb_hits.sto` and parses into hits (`protdp.templates.hits`).
"""

from __future__ import annotations

import io
from pathlib import Path

from protdp.errors import InputError

# AF2 tools/hmmsearch.py flags: --F1 0.1 --F2 0.1 --F3 0.1 --incE 100 -E 100 --domE 100 --incdomE 100
HMMSEARCH_OPTIONS = dict(F1=0.1, F2=0.1, F3=0.1, incE=100.0, E=100.0, domE=100.0, incdomE=100.0)


def read_database(path: str | Path):
    """The pdb_seqres-style FASTA as a pyhmmer digital sequence block (read once per run)."""
    from pyhmmer.easel import Alphabet, SequenceFile
    path = Path(path)
    if not path.is_file():
        raise InputError("template database not found", path=path)
    try:
        with SequenceFile(str(path), digital=True, alphabet=Alphabet.amino(), format="fasta") as f:
            return f.read_block()
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"not a readable FASTA database: {exc}", path=path) from None


def build_hmm(msa_sto: str | Path):
    """`hmmbuild --hand --amino` of a Stockholm MSA with an RF line."""
    from pyhmmer.easel import Alphabet, MSAFile
    from pyhmmer.plan7 import Background, Builder, HMMFile
    alphabet = Alphabet.amino()
    try:
        with MSAFile(str(msa_sto), digital=True, alphabet=alphabet, format="stockholm") as f:
            msa = f.read()
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"not a readable Stockholm MSA: {exc}", path=msa_sto) from None
    if msa is None:
        raise InputError("empty Stockholm MSA", path=msa_sto)
    msa.name = b"query"
    builder = Builder(alphabet, architecture="hand")
    try:
        hmm, _, _ = builder.build_msa(msa, Background(alphabet))
    except ValueError as exc:
        raise InputError(f"hmmbuild --hand failed (is there a '#=GC RF' line?): {exc}",
                         path=msa_sto) from None
    # through HMMER's text format, as hmmbuild writes it and hmmsearch reads it back: its
    # rounded probabilities give the binary's exact scores (near-tied hits keep its order)
    buffer = io.BytesIO()
    hmm.write(buffer)
    buffer.seek(0)
    with HMMFile(buffer) as f:
        return f.read()


def search_templates(msa_sto: str | Path, database) -> str:
    """The hmmsearch `-A` Stockholm text of the query MSA's HMM against `database` (a path or
    a block from `read_database`)."""
    from pyhmmer.easel import Alphabet
    from pyhmmer.plan7 import Background, Pipeline
    if isinstance(database, (str, Path)):
        database = read_database(database)
    alphabet = Alphabet.amino()
    hmm = build_hmm(msa_sto)
    pipeline = Pipeline(alphabet, Background(alphabet), **HMMSEARCH_OPTIONS)
    hits = pipeline.search_hmm(hmm, database)
    if not len(hits.included):
        return "# STOCKHOLM 1.0\n\n//\n"
    msa = hits.to_msa(alphabet, all_consensus_cols=True)
    msa.name = b"query"
    buffer = io.BytesIO()
    msa.write(buffer, "stockholm")
    return buffer.getvalue().decode()
