"""Hostile multimer_model.pt files and weight imports (issue 47 D1/D2/D3/D5/D6): truncated,
empty, random bytes, a code-carrying pickle, missing keys, a bad `masking` dict, sizes beyond
`protdp.data.bounds` (10^7 blocks, 10^9 MSA rows) and 1e30 / NaN weights are each one line
naming the file, from the fine-tuning reader and the prediction loader alike, in well under a
second and without allocating what the config declares. `weights import` refuses
--num-recycles beyond the bound, weights beyond MAX_WEIGHT_MAGNITUDE, and a second kind of
checkpoint in one folder. Reference for "accepted": the untouched checkpoint's config and
weights."""

from __future__ import annotations

import copy
import os
import random
import resource
import time

import numpy as np
import pytest
import torch

from protdp.cli import main as protdp_main
from protdp.data.bounds import MAX_WEIGHT_MAGNITUDE
from protdp.errors import InputError
from protdp.inference.multimer_loading import load_multimer_checkpoint
from protdp.train.complex import MULTIMER_MODEL_FILE, read_multimer_checkpoint
from protdp.weights.multimer_checkpoint import load_multimer
from test_complex_predict import CONFIG, PARAMS, ckpt  # noqa: F401  (fixture)
from test_complex_pairing import FIXTURE

READERS = (read_multimer_checkpoint, load_multimer, load_multimer_checkpoint)


class Payload:
    """A pickled object: torch.load(weights_only=True) refuses it (it could run code)."""


def _blob(ckpt):  # noqa: F811
    return torch.load(ckpt / MULTIMER_MODEL_FILE, weights_only=True)


def _hostile_files(ckpt, tmp):  # noqa: F811
    raw = (ckpt / MULTIMER_MODEL_FILE).read_bytes()
    yield "truncated", raw[: len(raw) // 2]
    yield "empty", b""
    yield "random", os.urandom(4096)
    blob = _blob(ckpt)

    def edited(edit):
        b = copy.deepcopy(blob)
        edit(b)
        path = tmp / "x.pt"
        torch.save(b, path)
        return path.read_bytes()

    yield "code", edited(lambda b: b.update(extra=Payload()))
    yield "no kind", edited(lambda b: b.pop("kind"))
    yield "no config", edited(lambda b: b.pop("multimer_config"))
    yield "no state", edited(lambda b: b.pop("state_dict"))
    yield "no trunk", edited(lambda b: b["multimer_config"].pop("trunk"))
    yield "masking list", edited(lambda b: b["multimer_config"].update(masking=[0.1]))
    yield "masking key", edited(lambda b: b["multimer_config"].update(masking={"evil": 1}))
    yield "masking str", edited(lambda b: b["multimer_config"]["masking"].update(
        uniform_prob="x"))
    yield "blocks 1e7", edited(lambda b: b["multimer_config"]["trunk"].update(n_blocks=10 ** 7))
    yield "num_msa 1e9", edited(lambda b: b["multimer_config"].update(num_msa=10 ** 9))
    yield "template_blocks 1e7", edited(lambda b: b["multimer_config"].update(
        template_blocks=10 ** 7))
    yield "recycles 1e9", edited(lambda b: b["multimer_config"]["trunk"].update(
        num_recycles=10 ** 9))
    first = next(iter(blob["state_dict"]))
    yield "1e30 weight", edited(lambda b: b["state_dict"][first].fill_(1e30))
    yield "nan weight", edited(lambda b: b["state_dict"][first].fill_(float("nan")))
    yield "state list", edited(lambda b: b.update(state_dict=[1, 2]))


def test_hostile_multimer_checkpoints_are_one_line(ckpt, tmp_path):  # noqa: F811
    for name, data in _hostile_files(ckpt, tmp_path):
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        (folder / MULTIMER_MODEL_FILE).write_bytes(data)
        for reader in READERS:
            t0 = time.perf_counter()
            with pytest.raises(InputError) as exc:
                reader(folder)
            msg = str(exc.value)
            assert "\n" not in msg and str(folder) in msg, (name, reader.__name__, msg)
            assert time.perf_counter() - t0 < 5, name
        if name == "code":
            assert "pickled Python objects" in msg
        if name in ("blocks 1e7", "num_msa 1e9"):
            assert "bound" in msg


def test_predict_with_a_hostile_multimer_checkpoint_is_one_line(ckpt, tmp_path, capsys):  # noqa: F811
    folder = tmp_path / "bad"
    folder.mkdir()
    blob = _blob(ckpt)
    blob["multimer_config"]["trunk"]["n_blocks"] = 10 ** 7
    torch.save(blob, folder / MULTIMER_MODEL_FILE)
    fasta = tmp_path / "c.fasta"
    fasta.write_text(">c1\nMKVLAAGIVG:GSHMKVLAAG\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc = protdp_main(["predict", "--checkpoint", str(folder), "--fasta", str(fasta), "--out",
                      str(tmp_path / "o"), "--no-progress", "--no-plots", "--allow-unreleased"])
    err = capsys.readouterr().err
    assert rc == 2 and "n_blocks 10000000 is above the bound" in err, err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20      # KiB


def test_fuzz_multimer_checkpoint(ckpt, tmp_path):  # noqa: F811
    """Random config values (declared-size inflation, wrong types) and byte flips of a valid
    multimer_model.pt: each accepted with the reference's config and weights or refused with
    one line; every case under 5 s and 1 GiB extra peak memory."""
    rng = random.Random(47)
    blob = _blob(ckpt)
    ref_cfg, ref_state = read_multimer_checkpoint(ckpt)
    raw = (ckpt / MULTIMER_MODEL_FILE).read_bytes()
    values = [0, -1, 10 ** 9, 2 ** 63, 1.5, float("nan"), "x", None, [], True]
    outcomes = {"same": 0, "refused": 0}
    for k in range(30):
        path = tmp_path / f"f{k}" / MULTIMER_MODEL_FILE
        path.parent.mkdir()
        if k % 3 == 0:
            data = bytearray(raw)
            for _ in range(8):
                data[rng.randrange(len(data))] = rng.randrange(256)
            path.write_bytes(bytes(data))
        else:
            b = copy.deepcopy(blob)
            section = rng.choice([b["multimer_config"], b["multimer_config"]["trunk"]])
            section[rng.choice(sorted(section))] = rng.choice(values)
            torch.save(b, path)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        try:
            cfg, state = read_multimer_checkpoint(path.parent)
        except InputError as exc:
            assert "\n" not in str(exc) and str(path.parent) in str(exc)
            outcomes["refused"] += 1
        else:
            assert cfg == ref_cfg or k % 3, k     # a flipped byte is caught or harmless
            if cfg == ref_cfg and all(torch.equal(state[n], ref_state[n]) for n in ref_state):
                outcomes["same"] += 1
            else:                 # a valid, different config: it loads or is one line
                try:
                    load_multimer(path.parent)
                except InputError as exc:
                    assert "\n" not in str(exc) and str(path.parent) in str(exc)
                    outcomes["refused"] += 1
        assert time.perf_counter() - t0 < 5
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20
    assert outcomes["refused"] > 0


def test_weights_import_bounds_recycles(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        protdp_main(["weights", "import", "--format", "alphafold", str(PARAMS), "--out",
                     str(tmp_path / "o"), "--num-recycles", "1000000000"])
    assert exc.value.code == 2 and "must be <= 200" in capsys.readouterr().err


def test_weights_import_refuses_huge_values_and_a_second_kind(tmp_path, capsys):
    mono = FIXTURE.parent / "params" / "params_model_3_ptm_small.npz"
    with np.load(mono) as f:
        arrays = {k: f[k] for k in f.files}
    name = sorted(arrays)[5]
    arrays[name] = np.full_like(arrays[name], 1e30)
    hostile = tmp_path / "params_model_3_ptm_huge.npz"
    np.savez(hostile, **arrays)
    out = tmp_path / "ckpt"
    rc = protdp_main(["weights", "import", "--format", "alphafold", str(hostile), "--out",
                      str(out), "--sm-layers", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and f"> {MAX_WEIGHT_MAGNITUDE:g}" in err and not out.exists(), err
    assert protdp_main(["weights", "import", "--format", "alphafold", str(mono), "--out",
                        str(out), "--sm-layers", "2"]) == 0
    capsys.readouterr()
    rc = protdp_main(["weights", "import", "--format", "alphafold", str(PARAMS), "--out",
                      str(out), "--alphafold-config", str(CONFIG)])
    err = capsys.readouterr().err
    assert rc == 2 and "already holds a monomer checkpoint" in err, err
    assert not (out / MULTIMER_MODEL_FILE).exists() and (out / "model.pt").is_file()
