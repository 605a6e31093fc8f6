"""An `.npz` whose member headers declare more than the file holds is refused from the headers,
before np.load allocates (issue 47, "bounded by the bytes"): templates.npz (predict's and
`templates add-to-store`'s reader) and AlphaFold parameter files share one header reader,
`protdp.data.npz_headers`. Each case must cost well under what the header declares
(tracemalloc sees numpy's allocations), and the good file still loads."""

from __future__ import annotations

import io
import tracemalloc
import zipfile

import numpy as np
import pytest

from protdp.data.npz_headers import declared_problem, read_npz_headers
from protdp.errors import InputError
from protdp.templates.validate import read_features

L = 30


def _good(T=2):
    f = {"template_aatype": np.zeros((T, L, 22), np.float32),
         "template_all_atom_positions": np.zeros((T, L, 37, 3), np.float32),
         "template_all_atom_masks": np.zeros((T, L, 37), np.float32)}
    f["template_aatype"][:, :, 0] = 1
    f["template_all_atom_masks"][:, :, :5] = 1
    return f


def _npy(shape, dtype, data: bytes) -> bytes:
    """One .npy member: numpy's own header for `shape`, then whatever bytes are given."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(
        np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue() + data


def _write(path, members: dict, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compress) as zf:
        for key, blob in members.items():
            zf.writestr(key + ".npy", blob)
    return path


def _members(feats: dict) -> dict:
    return {k: _npy(v.shape, v.dtype, v.tobytes()) for k, v in feats.items()}


def _refused_cheaply(path, *needles):
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as err:
            read_features(path, L)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(err.value)
    assert text.startswith(str(path)) and "\n" not in text, text
    assert all(n in text for n in needles), text
    assert peak < 20 * 1024 ** 2, peak          # the headers ask for gigabytes
    return text


def test_declared_shapes_are_checked_before_loading(tmp_path):
    good = _good()
    assert set(read_features(_write(tmp_path / "ok.npz", _members(good)), L)) == set(good)
    # 10^6 templates (13 GB) declared over the bytes of 2
    members = _members(good)
    members["template_all_atom_positions"] = _npy(
        (10 ** 6, L, 37, 3), np.float32, good["template_all_atom_positions"].tobytes())
    _refused_cheaply(_write(tmp_path / "huge_T.npz", members), "template_all_atom_positions",
                     "declares shape (1000000, 30, 37, 3)")
    # the right number of bytes for a wrong shape: still refused from the header
    members = _members(good)
    members["template_aatype"] = _npy((65, L, 22), np.float32, b"\0" * (65 * L * 22 * 4))
    _refused_cheaply(_write(tmp_path / "many.npz", members),
                     "template_aatype has 65 templates (expected 1 to 64")
    # a 10^9-byte domain-name dtype (what `templates add-to-store` reads beside the features)
    members = _members(good)
    members["template_domain_names"] = _npy((2,), "S1000000000", b"x" * 20)
    _refused_cheaply(_write(tmp_path / "names.npz", members), "template_domain_names")


def test_a_zip_entry_that_claims_more_than_deflate_can_give():
    """A zip entry's own uncompressed size may lie too: declared bytes beyond the stored bytes x
    MAX_COMPRESSION_RATIO (a real deflate stream tops out at ~1032:1) are refused."""
    from protdp.data.bounds import MAX_COMPRESSION_RATIO
    from protdp.data.npz_headers import NpyHeader

    shape, dtype = (64, L, 37, 3), np.dtype(np.float32)
    need = 64 * L * 37 * 3 * 4
    ok = NpyHeader(shape, dtype, need, need // MAX_COMPRESSION_RATIO + 1)
    assert declared_problem("x", ok) is None
    bomb = NpyHeader(shape, dtype, need, need // MAX_COMPRESSION_RATIO - 1)
    assert "stored bytes" in declared_problem("x", bomb)
    assert "objects" in declared_problem("x", NpyHeader((2,), np.dtype(object), 16, 16))


def test_parameter_files_share_the_reader(tmp_path):
    from protdp.weights.validate import npz_headers

    path = _write(tmp_path / "p.npz", {"w": _npy((2 ** 20, 1024), np.float32, b"\0" * 64)})
    with pytest.raises(InputError, match="p.npz: field 'w': header declares shape"):
        npz_headers(path)


def _refused_from_the_header(read, path, match: str) -> None:
    """`read(path)` is one InputError matching `match`, and numpy allocated nothing like what
    the header declares (tracemalloc sees numpy's allocations)."""
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=match):
            read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 ** 2, peak


@pytest.mark.parametrize("reader", ["complex features.npz", "weights compare npz"])
def test_every_whole_npz_reader_checks_the_headers_first(tmp_path, reader):
    """The readers that load every array of a user's .npz (`protdp predict` on a `complex
    features` folder, `weights compare`'s features / reference files) share
    `protdp.data.npz_headers.read_npz`: a 4 GB declaration over 16 bytes costs nothing."""
    if reader.startswith("complex"):
        from protdp.inference.complex_features_input import _read as read
    else:
        from protdp.weights.store import read_npz as read
    rest = {k: _npy((4,), np.int32, b"\0" * 16) for k in ("asym_id", "msa")}
    good = _write(tmp_path / "good.npz", {"aatype": _npy((4,), np.int32, b"\0" * 16), **rest})
    assert read(good)["aatype"].shape == (4,)
    path = _write(tmp_path / "f.npz", {"aatype": _npy((10 ** 9,), np.int32, b"\0" * 16),
                                       **rest})
    _refused_from_the_header(read, path, "f.npz: field 'aatype': header declares shape")


@pytest.mark.parametrize("form", ["bytes", "file object"])
def test_the_bytes_and_file_object_forms_check_the_headers_first(tmp_path, form):
    """read_npz of a file's bytes (what a caller that hashed them loads) or of an open binary
    file: a 4 GB declaration over 16 bytes is refused from the header (nothing allocated), the
    error names the `path` given, and a good archive loads the same arrays as from its path."""
    from protdp.data.npz_headers import read_npz

    rest = {k: _npy((4,), np.int32, np.arange(4, dtype=np.int32).tobytes()) for k in ("b", "c")}
    good = _write(tmp_path / "good.npz", {"a": _npy((4,), np.int32, b"\0" * 16), **rest})
    bomb = _write(tmp_path / "f.npz", {"a": _npy((10 ** 9,), np.int32, b"\0" * 16), **rest})

    def read(path, **kw):
        if form == "bytes":
            return read_npz(path.read_bytes(), path=path, **kw)
        with open(path, "rb") as fh:
            fh.seek(5)                               # read from the start wherever it stands
            return read_npz(fh, path=path, **kw)

    loaded, ref = read(good), read_npz(good)
    assert set(loaded) == set(ref) == {"a", "b", "c"}
    assert all(np.array_equal(loaded[k], ref[k]) for k in ref)
    assert list(read(good, keys=("c",))) == ["c"]
    _refused_from_the_header(read, bomb, "f.npz: field 'a': header declares shape")
    (tmp_path / "x.npz").write_bytes(b"not a zip archive")
    with pytest.raises(InputError) as err:
        read(tmp_path / "x.npz")
    assert str(err.value).startswith(str(tmp_path / "x.npz")) and "not an .npz" in str(err.value)
