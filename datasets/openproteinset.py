"""Precomputed MSAs from an archive laid out like OpenProteinSet (the OpenFold training MSAs on
the AWS Registry of Open Data, bucket `openfold`, https://registry.opendata.aws/openfold/):

    <base>/pdb/<pdb id>_<author chain id>/a3m/uniref90_hits.a3m
    <base>/pdb/<pdb id>_<author chain id>/a3m/mgnify_hits.a3m
    <base>/pdb/<pdb id>_<author chain id>/a3m/bfd_uniclust_hits.a3m

A chain without a file in the archive is recorded as missing (OpenProteinSet keeps one chain of
each set of identical chains); a file that does not parse as an MSA with protdp's reader is
refetched, then reported. Files are kept as `<out>/msas/<pdb>_<chain>/<file>`.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_BASE = "https://openfold.s3.amazonaws.com"
DEFAULT_FILES = ("uniref90_hits.a3m", "mgnify_hits.a3m", "bfd_uniclust_hits.a3m")
CHAIN_PATH = "pdb/{chain}/a3m/{file}"


def msa_path(chain: str, file: str) -> str:
    """Archive-relative path of one MSA of one chain ('1abc_A')."""
    return CHAIN_PATH.format(chain=chain, file=file)


def chain_name(pdb_id: str, chain_id: str) -> str:
    return f"{pdb_id.lower()}_{chain_id}"


def protein_chains(cif: Path) -> list[str]:
    """Author chain ids with amino-acid residues (first model), as `protdp data build` sees
    them (protdp.data.parse.list_chains)."""
    from protdp.data.parse import list_chains
    return list_chains(cif)


def check_msa(path: Path) -> None:
    """The file parses as an MSA with the store's reader (raises InputError otherwise)."""
    from protdp.data.parse import parse_msa
    suffix = Path(path.name.removesuffix(".part")).suffix
    parse_msa(path, fmt={".a3m": "a3m", ".sto": "stockholm"}.get(suffix, "a3m"))


def read_chain_list(text: str, source: str) -> list[str]:
    """'1abc_A' per line (or separated by spaces/commas); '#' comments."""
    out: dict[str, None] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        for word in line.split("#", 1)[0].replace(",", " ").split():
            pdb, sep, chain = word.partition("_")
            if not sep or len(pdb) != 4 or not chain or "/" in chain or chain.startswith("."):
                raise ValueError(f"{source}:{lineno}: '{word}' is not '<pdb id>_<chain id>'")
            out.setdefault(chain_name(pdb, chain), None)
    return list(out)
