"""A monomer's MSA files are read once and parsed from the bytes read (`targets.load_msa`:
`Msa.file_sha256`), possibly in a prefetch worker before the predictor computes the target's
identity: the predictor checks that the bytes parsed are those hashed into the identity, so a
file changed in between is that target's one-line error, never a prediction recorded under
an MSA it was not made from (the sibling of the features.npz and template checks)."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from model_fixtures import tiny_predictor
from protdp.errors import InputError
from protdp.inference.predictor import check_msa_files, input_files
from protdp.inference.targets import Target, load_msa

QUERY = "MKTAYIAKQRQISFVKSHFSRQ"


def _a3m(path, rows: int):
    text = ">q\n" + QUERY + "\n" + "".join(f">h{i}\n{QUERY[:-1]}A\n" for i in range(rows))
    path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
    return path


def test_load_msa_records_the_digests_of_the_bytes_it_parsed(tmp_path):
    files = [_a3m(tmp_path / "a.a3m", 2), _a3m(tmp_path / "b.a3m.gz", 3)]
    msa = load_msa(files)
    assert msa.file_sha256 == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    hashed = input_files(Target(0, "t", "t", QUERY, 1, "t"), files)
    check_msa_files(hashed, files, msa)                    # unchanged: no error
    _a3m(files[1], 4)                                      # changed after it was parsed
    with pytest.raises(InputError, match="b.a3m.gz: changed since"):
        check_msa_files(input_files(Target(0, "t", "t", QUERY, 1, "t"), files), files, msa)
    with pytest.raises(InputError, match="changed since"):   # a file parsed but not hashed
        check_msa_files(hashed[:1], files, msa)


def test_an_msa_changed_between_parse_and_identity_is_a_rejected_row(tmp_path):
    pred = tiny_predictor(tmp_path)
    msas = tmp_path / "msas"
    msas.mkdir()
    path = _a3m(msas / "t.a3m", 2)
    parsed_early = load_msa([path])                        # as a prefetch worker would
    _a3m(path, 5)                                          # then the file changes
    pred.msa_loader = lambda paths: parsed_early
    try:
        row = pred.predict_target(Target(0, "t", "t", QUERY, 1, "t"),
                                  {"path": "x.fasta", "sha256": "0", "msa_dir": msas})
        assert row["status"] == "rejected" and "changed since" in row["detail"], row
        assert row["detail"].startswith(str(path))
        assert not (tmp_path / "out" / "targets" / "t").exists()
    finally:
        pred.close()
