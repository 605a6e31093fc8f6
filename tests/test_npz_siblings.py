"""Every reader of a user's .npz goes through the one header-checked reader
(`protdp.data.npz_headers`): a small file whose member header declares hundreds of megabytes
is refused in one line naming the file, before numpy allocates what the header declares
(tracemalloc sees numpy's allocations). Siblings of tests/test_npz_headers.py: the Boltz
pae / plddt npz of `protdp interface` / `protdp gate`, and `protdp templates add-to-store`'s
template_domain_names; the good file still reads the same arrays."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from contextlib import contextmanager

import numpy as np
import pytest

from protdp.errors import InputError
from test_npz_headers import L, _good, _members, _npy, _write

BIG = 11000                # 11000² float32 = 484 MB: under MAX_INPUT_BYTES, from 16 bytes


@contextmanager
def _traced_peak(out: list):
    """Appends the peak bytes traced (numpy's allocations included) while the block ran."""
    tracemalloc.start()
    try:
        yield
    finally:
        out.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def _cheap_one_line_refusal(call, path, *needles) -> str:
    peak: list = []
    with _traced_peak(peak), pytest.raises(InputError) as err:
        call()
    text = str(err.value)
    assert text.startswith(str(path)) and "\n" not in text, text
    assert all(n in text for n in needles), text
    assert peak[0] < 20 * 1024 ** 2, peak            # the header asks for hundreds of MB
    return text


def _zip_bytes(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for key, blob in members.items():
            zf.writestr(key + ".npy", blob)
    return buf.getvalue()


def test_boltz_pae_npz_declaring_more_than_it_holds(tmp_path):
    """The declared shape matches the structure's tokens, but the member holds 16 bytes."""
    from protdp.interface.readers import _npz_array

    path = tmp_path / "pae_x_model_0.npz"
    pae = np.arange(16, dtype=np.float32).reshape(4, 4)
    good = _zip_bytes({"pae": _npy(pae.shape, pae.dtype, pae.tobytes())})
    np.testing.assert_array_equal(_npz_array(good, path, "pae", (4, 4)), pae)
    liar = _zip_bytes({"pae": _npy((BIG, BIG), np.float32, b"\0" * 16)})
    _cheap_one_line_refusal(lambda: _npz_array(liar, path, "pae", (BIG, BIG)), path,
                            "field 'pae'", f"declares shape ({BIG}, {BIG})", "holds 16 bytes")
    with pytest.raises(InputError, match="not a readable .npz"):
        _npz_array(good[:40], path, "pae", (4, 4))                # a truncated archive
    with pytest.raises(InputError, match=r"no 'plddt' array \(has pae\)"):
        _npz_array(good, path, "plddt", (4,))


def test_templates_add_to_store_names_go_through_the_checked_reader(tmp_path):
    from protdp.templates.cli import _features

    good = _good()
    names = np.array([b"1abc_A", b"2xyz_B"])
    members = {**_members(good), "template_domain_names": _npy(names.shape, names.dtype,
                                                                names.tobytes())}
    feats = _features(_write(tmp_path / "ok.npz", members), L)
    np.testing.assert_array_equal(feats["template_domain_names"], names)
    np.testing.assert_array_equal(feats["template_all_atom_masks"],
                                  good["template_all_atom_masks"])
    members["template_domain_names"] = _npy((2,), "S1000", b"x" * 16)   # 2000 B over 16
    path = _write(tmp_path / "names.npz", members)
    _cheap_one_line_refusal(lambda: _features(path, L), path, "template_domain_names",
                            "holds 16 bytes")
    path = _write(tmp_path / "no_names.npz", _members(good))
    with pytest.raises(InputError, match="template_domain_names missing"):
        _features(path, L)
