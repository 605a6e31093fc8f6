"""Shared by the complex fine-tuning tests: a small complex store built from the real corpus
(4hhb α2β2 with haemoglobin MSAs, the 2q2k homodimer) and the AlphaFold-Multimer fixture's
random-weight model_1_multimer_v3 imported as `protdp weights import` writes it."""

from __future__ import annotations

from pathlib import Path

from protdp.paths import data_root
from test_complex_pairing import FIXTURE

PARAMS = FIXTURE / "params" / "params_model_1_multimer_v3_small.npz"
AF_CONFIG = FIXTURE / "config_model_1_multimer_v3_small.json"
GOOD_ROWS = [("4hhb", "structures/4hhb.cif", "A", "msa/1a00_A.bfd_uniclust.a3m"),
             ("4hhb", "structures/4hhb.cif", "B", "-"),
             ("4hhb", "structures/4hhb.cif", "C", "msa/1a00_A.bfd_uniclust.a3m"),
             ("4hhb", "structures/4hhb.cif", "D", "-"),
             ("2q2k", "structures/2q2k.cif", "A", "msa/2q2k_A.bfd_uniclust.a3m"),
             ("2q2k", "structures/2q2k.cif", "B", "msa/2q2k_A.bfd_uniclust.a3m")]


def write_manifest(path: Path, rows) -> Path:
    """Rows with paths relative to the corpus, written with absolute paths."""
    root = data_root()
    lines = ["complex_id\tstructure_file\tchain\tmsa_file"]
    for cid, struct, chain, msa in rows:
        m = msa if msa == "-" else ",".join(str(root / f) for f in msa.split(","))
        lines.append(f"{cid}\t{root / struct}\t{chain}\t{m}")
    path.write_text("\n".join(lines) + "\n")
    return path


def import_fixture_model(out: Path) -> Path:
    from protdp.weights.multimer_checkpoint import import_multimer, multimer_settings, save_multimer

    model, prov = import_multimer(PARAMS, **multimer_settings(AF_CONFIG))
    return save_multimer(model, prov, out)
