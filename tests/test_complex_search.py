"""`protdp msa search --complexes`: every distinct chain of a complex is searched, and the
UniProt Stockholm it writes is what the species pairing reads. The database holds the real
(and, for chain B, species-relabelled) UniProt rows of the AlphaFold-Multimer fixture's
pairing alignments plus shuffled decoys; the pairing of protdp's own search must pair only
rows of one species and find the species the fixture's alignments share."""

from __future__ import annotations

import json
import random

import numpy as np

from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.complex.pairing import UniprotChainMsa, pair_rows, species_of
from test_complex_pairing import RAW


def _records(chain: str) -> list[tuple[str, str]]:
    """(name without /start-end, ungapped sequence) of the fixture's UniProt rows."""
    text = (RAW / f"{chain}.uniprot_hits.sto").read_text()
    rows: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(("tr|", "sp|")):
            name, seq = line.split()
            rows[name.partition("/")[0]] = rows.get(name.partition("/")[0], "") + seq
    return [(n, s.replace("-", "").replace(".", "").upper()) for n, s in rows.items()]


def test_complex_search_feeds_the_pairing(tmp_path, capsys):
    rng = random.Random(0)
    records = _records("hbA_1-36") + _records("hbB_1-40")
    decoys = [(f"decoy{i}", "".join(rng.sample(s, len(s)))) for i, (_, s) in enumerate(records)]
    db = tmp_path / "uniprot.fasta"
    db.write_text("".join(f">{n}\n{s}\n" for n, s in records + decoys))
    uniref = tmp_path / "uniref90.fasta"                  # the unpaired MSAs' database
    uniref.write_text(db.read_text())
    qa = parse_msa(RAW / "hbA_1-36.a3m").query
    qb = parse_msa(RAW / "hbB_1-40.a3m").query
    fasta = tmp_path / "complexes.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n>homo\n{qa}:{qa}\n>bad\n{qa}::{qb}\n")
    out = tmp_path / "msas"
    rc = protdp_main(["msa", "search", "--complexes", "--fasta", str(fasta), "--db", str(db),
                      "--db", str(uniref),
                      "--out", str(out), "--iterations", "1", "--max-sequences", "50000",
                      "--no-progress", "--search-workers", "1"])
    cap = capsys.readouterr()
    # 3 distinct chains x 2 databases; the bad complex is one rejected row per database
    assert rc == 0 and "6 searched, 0 already done, 2 rejected" in cap.out, cap.out
    assert "complex 'bad' is empty" in cap.err or "chain 2 (B) of complex 'bad'" in cap.err
    # identical chains share one search: homo_A only
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["hb_A", "hb_B", "homo_A"]
    chains = [UniprotChainMsa.from_msa(parse_msa(out / c / "stockholm" / "uniprot.sto"))
              for c in ("hb_A", "hb_B")]
    assert not any(n.startswith("decoy") for c in chains for n in c.names[1:])
    pairing = pair_rows(chains)
    # the fixture's chain-A rows are short fragments (residues 1-36): jackhmmer finds a few
    assert pairing.rows[0].tolist() == [0, 0] and len(pairing.rows) >= 3
    for (i, j), sp in zip(pairing.rows[1:], pairing.species[1:]):
        assert species_of(chains[0].names[i]) == species_of(chains[1].names[j]) == sp != ""
    # every species both fixture alignments share (and both searches found) is paired
    shared = ({s for s in chains[0].species[1:] if s} & {s for s in chains[1].species[1:] if s})
    assert set(pairing.species[1:]) == shared
    assert np.all(pairing.rows >= 0)
    # ... and each of them is a species AlphaFold paired from the fixture's own alignments
    fixture = pair_rows([UniprotChainMsa.from_msa(parse_msa(RAW / f"{c}.uniprot_hits.sto"))
                         for c in ("hbA_1-36", "hbB_1-40")])
    assert set(pairing.species[1:]) <= set(fixture.species[1:])

    # protdp complex features: the model input and pairing.json per complex, batch goes on
    feats = tmp_path / "features"
    rc = protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir", str(out),
                      "--out", str(feats)])
    cap = capsys.readouterr()
    assert rc == 0 and "3 complexes: 2 ok, 1 rejected" in cap.out, cap.out + cap.err
    rows = [ln.split("\t") for ln in (feats / "complex_features.tsv").read_text().splitlines()]
    assert [(r[1], r[6]) for r in rows[1:]] == [("hb", "ok"), ("homo", "ok"), ("bad", "error")]
    doc = json.loads((feats / "hb" / "pairing.json").read_text())
    assert len(doc["paired_rows"]) == len(pairing.rows) == int(rows[1][4])
    assert [r["species"] for r in doc["paired_rows"]] == [None] + pairing.species[1:]
    f = np.load(feats / "hb" / "features.npz")
    assert f["msa"].shape[1] == len(qa) + len(qb) and f["asym_id"].max() == 2
    homo = json.loads((feats / "homo" / "pairing.json").read_text())
    assert homo["paired"] is False and [c["entity_id"] for c in homo["chains"]] == [1, 1]
