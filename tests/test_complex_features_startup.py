"""Start-up on a `protdp complex features` folder (`complex_features_input`): each
features.npz is read once (`read_features_bytes`; the recorded digest is the sha256 of the
bytes its chains are parsed from) and only its chain arrays are
decompressed, never the MSA or the templates; the one .npz reader (`protdp.data.npz_headers.read_npz`)
serves the weights' `read_npz` with the same one-line errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from protdp.errors import InputError
from protdp.data.npz_headers import read_npz
from protdp.fileio import sha256_file
from protdp.inference import complex_features_input as cfi
from protdp.weights.store import read_npz as weights_read_npz


def _features_folder(root: Path, n: int) -> dict[str, np.ndarray]:
    """`n` complexes `c0..` of two chains with a large MSA and template array each; returns
    the arrays of c0."""
    rng = np.random.default_rng(0)
    first = {}
    for k in range(n):
        lengths = (7 + k, 5)
        asym = np.repeat(np.arange(1, 3), lengths).astype(np.int32)                # [L]
        L = int(sum(lengths))
        arrays = {"aatype": rng.integers(0, 20, L).astype(np.int32), "asym_id": asym,
                  "msa": rng.integers(0, 22, (512, L)).astype(np.int32),            # [S, L]
                  "template_all_atom_positions": rng.random((4, L, 37, 3)).astype(np.float32),
                  "num_alignments": np.int32(512)}
        (root / f"c{k}").mkdir()
        np.savez_compressed(root / f"c{k}" / cfi.FEATURES_FILE, **arrays)
        first = first or arrays
    return first


def test_start_up_hashes_once_and_reads_only_the_chain_arrays(tmp_path, monkeypatch):
    n = 4
    arrays = _features_folder(tmp_path, n)
    (tmp_path / "bad").mkdir()
    np.savez(tmp_path / "bad" / cfi.FEATURES_FILE, aatype=np.zeros(3, np.int32))
    read_keys, read = [], []
    original_getitem = np.lib.npyio.NpzFile.__getitem__

    def recording_getitem(self, key):
        read_keys.append(key)
        return original_getitem(self, key)

    def counting_read(path, bound):
        read.append(Path(path))
        return original_read(path, bound)
    original_read = cfi.read_raw
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", recording_getitem)
    monkeypatch.setattr(cfi, "read_raw", counting_read)
    monkeypatch.setattr(cfi, "sha256_file", lambda p: pytest.fail("hashed apart from its load"),
                        raising=False)

    targets, digest = cfi.read_features_targets(tmp_path)

    assert set(read_keys) == set(cfi.CHAIN_KEYS) and len(read_keys) == 2 * n
    files = sorted(tmp_path.glob(f"c*/{cfi.FEATURES_FILE}"))
    assert sorted(read) == sorted(files + [tmp_path / "bad" / cfi.FEATURES_FILE])  # once each
    good = [t for t in targets if t.error is None]
    assert [t.target_id for t in good] == [f"c{k}" for k in range(n)]
    for t, f in zip(good, files):
        assert t.extra["features_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    expected = hashlib.sha256(b"".join(f"{f.parent.name}\0{sha256_file(f)}\n".encode()
                                       for f in files)).hexdigest()
    assert digest == expected
    bad = [t for t in targets if t.error is not None]
    assert len(bad) == 1 and "no asym_id, msa" in bad[0].error
    assert "features_sha256" not in bad[0].extra                # not in the run's digest
    # the chains read from two small members are those of the whole file
    monkeypatch.undo()
    whole = cfi._read(files[0])
    assert set(whole) == set(arrays)
    assert good[0].raw_sequence == ":".join(s for _, s in cfi.chains_of(whole))


@pytest.mark.parametrize("reader, what", [(read_npz, "file"),
                                          (weights_read_npz, "parameter file")])
def test_one_npz_reader_for_every_layer(tmp_path, reader, what):
    np.savez(tmp_path / "a.npz", x=np.arange(3), y=np.ones((2, 2)))
    got = reader(tmp_path / "a.npz")
    assert set(got) == {"x", "y"} and np.array_equal(got["x"], np.arange(3))
    np.save(tmp_path / "plain.npy", np.arange(3))
    (tmp_path / "d.npz").mkdir()
    for path, text in ((tmp_path / "plain.npy", f"not an .npz {what}"),
                       (tmp_path / "d.npz", f"a directory, not an .npz {what}"),
                       (tmp_path / "gone.npz", f"{what} not found")):
        with pytest.raises(InputError, match=text):
            reader(path)
    data = bytearray((tmp_path / "a.npz").read_bytes())
    data[len(data) // 4] ^= 0xFF                        # inside x's bytes: its CRC fails
    (tmp_path / "flipped.npz").write_bytes(bytes(data))
    with pytest.raises(InputError, match=f"not a readable .npz {what}"):
        reader(tmp_path / "flipped.npz")
    assert set(read_npz(tmp_path / "a.npz", keys=("y", "z"))) == {"y"}
