"""Newcomer friction (issue 28): output piped into `head` ends quietly (main: BrokenPipeError
traceback); `weights import` says the structure-module depth and recycles are not in the
arrays, and `weights compare` suggests them when the fixture fails by tens of Å with AF2's
defaults (main: no hint)."""

from __future__ import annotations

import json
import subprocess
import sys

from model_fixtures import af2_reference  # noqa: F401
from protdp.paths import REPO_ROOT
from protdp.weights import cli as weights_cli


def test_a_closed_pipe_ends_quietly():
    """stdout is a pipe whose reader has gone (as `protdp --help | head -0`)."""
    code = ("import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
            "from protdp.cli import main; sys.exit(main(sys.argv[1:]))")
    for argv in (["--help"], ["review", "--help"]):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, cwd=REPO_ROOT, timeout=120)
        assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
        assert out.returncode in (0, 141)


def test_import_and_compare_name_the_values_not_in_the_arrays(af2_reference, tmp_path,  # noqa: F811
                                                              capsys):
    out = tmp_path / "ck"
    assert weights_cli.main(["import", "--format", "alphafold", str(
        af2_reference / "params/params_model_3_ptm_small.npz"), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "NOT in the arrays (AF2 defaults)" in said and "--sm-layers" in said
    rc = weights_cli.main(["compare", "--checkpoint", str(out), "--features",
                           str(af2_reference / "features_2p90_A02.npz"), "--reference",
                           str(af2_reference / "outputs_2p90_A02.npz")])
    result = json.loads(capsys.readouterr().out)
    assert rc == 1 and not result["within_tolerance"]
    assert "--sm-layers" in result["hint"] and "(8)" in result["hint"]


def test_misleading_messages_now_say_what_is_wrong(tmp_path, data_dir):
    """UTF-16 FASTA (main: 'sequence before the first header'), PDB content named .cif (main:
    blamed on quotes), two alignments in one Stockholm file (main: blamed on a row)."""
    import pytest

    from protdp.data.parse import parse_msa, parse_structure
    from protdp.errors import InputError
    from protdp.inference.targets import read_targets

    u16 = tmp_path / "t.fasta"
    u16.write_bytes(">q\nMKVLAAGIVGL\n".encode("utf-16"))
    with pytest.raises(InputError, match=f"^{u16}: .*UTF-16"):
        read_targets(u16)
    cif = tmp_path / "x.cif"
    cif.write_bytes((data_dir / "structures" / "2p90_A02.pdb").read_bytes())
    with pytest.raises(InputError, match=f"^{cif}: holds PDB-format records.*rename it to .pdb"):
        parse_structure(cif, "A")
    sto = tmp_path / "two.sto"
    one = (data_dir / "msa" / "2q2k_A.mgnify.sto").read_text()
    sto.write_text(one + one)
    with pytest.raises(InputError, match=f"^{sto}:\\d+: holds 2 alignments"):
        parse_msa(sto)
    assert parse_msa(data_dir / "msa" / "2q2k_A.mgnify.sto").depth > 1


def test_plan_takes_the_train_flag_names(capsys):
    """`plan --crop-size / --max-msa-rows` as train and preflight spell them (main: only
    --crop / --msa-rows) give the same plan as the old spellings."""
    from protdp.planning import cli as plan_cli

    base = ["--model-config", str(REPO_ROOT / "configs/model/tiny.yaml"), "--gpu-mem", "80GiB",
            "--dp", "2"]
    outs = []
    for flags in (["--crop", "64", "--msa-rows", "32"], ["--crop-size", "64", "--max-msa-rows", "32"]):
        assert plan_cli.main(base + flags) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0]


def test_msa_search_into_a_read_only_folder_is_one_line(tmp_path, capsys):
    """main: a PermissionError traceback from the checksum cache after the search started."""
    import os

    from data_fixtures import permissions_enforced
    from protdp.cli import main

    seq = "MVLSEGEWQLVLHVWAKVEADVAGHGQDILIRLFKSHPETLEKFDRFKHLKTEAEMKASED"
    (tmp_path / "q.fasta").write_text(f">q\n{seq}\n")
    (tmp_path / "db.fasta").write_text(f">a\n{seq}\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    with permissions_enforced():
        rc = main(["msa", "search", "--fasta", str(tmp_path / "q.fasta"), "--db",
                   str(tmp_path / "db.fasta"), "--out", str(ro), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{ro}: cannot write the MSA output folder" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
