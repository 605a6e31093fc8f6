"""Hostile input round 3 (issue 28), outputs and reads: one output guard for every writer
(`protdp.fileio`): a device node is never replaced (run as root, `--rejects /dev/null` used to
turn /dev/null into a regular file), a file of another kind (a queue database, a training
store, an input of the job) only with --force; input reads are bounded without reserving the
bound (a test under `ulimit -v 2 GiB` for `data build`, `predict` and `msa search`)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from data_fixtures import assert_clean_message
from protdp.data.safeio import atomic_write_text, read_bytes, writable_output
from protdp.errors import InputError
from protdp.fileio import atomic_write_bytes, check_output
from protdp.paths import REPO_ROOT

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _char_device(path):
    """A character device node equal to /dev/null (major 1, minor 3) under `path` (tests run as
    root in CI, as the issue's reproduction did)."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def test_device_node_is_never_replaced_even_with_force(tmp_path):
    dev = _char_device(tmp_path / "null")
    for force in (False, True):
        with pytest.raises(InputError) as exc:
            writable_output(dev, "rejects report", "jsonl", force=force)
        assert_clean_message(str(exc.value), dev)
        assert "character device" in str(exc.value)
    with pytest.raises(InputError):      # the final rename checks again (the path changed)
        atomic_write_text(dev, "x\n")
    with pytest.raises(InputError):
        atomic_write_bytes(dev, b"x")
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    assert not [p for p in os.listdir(tmp_path) if p != "null"], "temporary file left behind"


def test_data_build_rejects_to_device_is_one_line_and_node_survives(tmp_path, data_dir):
    from protdp.cli import main
    dev = _char_device(tmp_path / "null")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("pair_id\tmsa_file\tstructure_file\tchain\n"
                     f"2q2k_A\t{data_dir}/msa/2q2k_A.bfd_uniclust.a3m\t"
                     f"{data_dir}/structures/2q2k.cif\tA\n")
    for flag in ("--rejects", "--report-json"):
        rc = main(["data", "build", "--pairs", str(pairs), "--out", str(tmp_path / "d.h5"),
                   flag, str(dev), "--no-progress"])
        assert rc != 0
        assert stat.S_ISCHR(os.stat(dev).st_mode), flag


@pytest.mark.parametrize("existing,kind,why", [
    (b"SQLite format 3\x00" + b"\0" * 100, "jsonl", "SQLite database"),
    (HDF5_MAGIC + b"\0" * 100, "csv", "HDF5"),
    (b">query\nMKV\n", "json", "a3m/FASTA"),
    (b"data_1ABC\n#\n", "text", "mmCIF"),
    (HDF5_MAGIC + b"\0" * 100, "hdf5", "HDF5"),         # an export never replaces a store
])
def test_file_of_another_kind_needs_force(tmp_path, existing, kind, why):
    target = tmp_path / "target"
    target.write_bytes(existing)
    with pytest.raises(InputError) as exc:
        check_output(target, kind, "export", replace_same_kind=False)
    assert why in str(exc.value) and "--force" in str(exc.value)
    assert_clean_message(str(exc.value), target)
    check_output(target, kind, "export", force=True, replace_same_kind=False)
    assert target.read_bytes() == existing


def test_previous_output_of_the_same_kind_and_inputs(tmp_path):
    prev = tmp_path / "report.json"
    prev.write_text('{"old": 1}\n')
    check_output(prev, "json", "report")                           # re-running replaces it
    check_output(tmp_path / "new.json", "json", "report")
    with pytest.raises(InputError, match="input of this same job"):
        check_output(prev, "json", "report", inputs=(str(prev),))


def test_review_export_never_replaces_the_queue_or_an_input(tmp_path, data_dir):
    from protdp.review.cli import main
    from protdp.review.store import ReviewStore

    queue = tmp_path / "queue.sqlite"
    ReviewStore(str(queue)).close()
    before = queue.read_bytes()
    msa = tmp_path / "x.a3m"
    shutil.copy(data_dir / "msa" / "2q2k_A.bfd_uniclust.a3m", msa)
    store = tmp_path / "train.h5"
    store.write_bytes(HDF5_MAGIC + b"\0" * 64)
    for out, fmt in ((queue, "jsonl"), (queue, "store"), (msa, "csv"), (store, "store")):
        with pytest.raises(InputError) as exc:
            main(["export", "--queue-url", str(queue), "--format", fmt, "--out", str(out)])
        assert_clean_message(str(exc.value), out)
    assert queue.read_bytes() == before
    assert msa.read_bytes() == (data_dir / "msa" / "2q2k_A.bfd_uniclust.a3m").read_bytes()
    assert main(["export", "--queue-url", str(queue), "--format", "csv", "--out", str(msa),
                 "--force"]) == 0


def test_reads_are_chunked_not_reserved(tmp_path):
    """Under a 1 GiB address-space limit a small file is read (main reserved 8 GiB up front:
    MemoryError) and a file over a small bound is still refused by size."""
    small = tmp_path / "x.a3m"
    small.write_text(">q\nMKV\n" * 1000)
    code = ("import sys; from protdp.data.safeio import read_bytes; "
            "print(len(read_bytes(sys.argv[1])))")
    out = subprocess.run(["bash", "-c", f'ulimit -v 1048576; exec "{sys.executable}" -c '
                          f'"{code}" {small}'], capture_output=True, text=True, cwd=REPO_ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    assert int(out.stdout) == small.stat().st_size
    with pytest.raises(InputError, match="larger than"):
        read_bytes(small, max_bytes=small.stat().st_size - 1)
    assert read_bytes(small, max_bytes=small.stat().st_size) == small.read_bytes()


_UNDER_LIMIT = """
import os, shutil, sys
from pathlib import Path
import torch
from protdp.cli import main
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.model import build_model
d, data = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
ck = save_model_checkpoint(build_model("configs/model/tiny.yaml", verbose=False), None,
                           d / "t.pt", training_crop=32, max_msa_rows=16)
a3m = data / "msa/2q2k_A.bfd_uniclust.a3m"
(d / "pairs.tsv").write_text("pair_id\\tmsa_file\\tstructure_file\\tchain\\n"
                             f"2q2k_A\\t{a3m}\\t{data}/structures/2q2k.cif\\tA\\n")
seq = "".join(a3m.read_text().split(">")[1].splitlines()[1:])
(d / "t.fasta").write_text(f">2q2k_A\\n{seq}\\n")
(d / "db.fasta").write_text(f">a\\n{seq}\\n>b\\n{seq[::-1]}\\n")
(d / "msas").mkdir()
shutil.copy(a3m, d / "msas" / "2q2k_A.a3m")
print("RCS", [
    main(["data", "build", "--pairs", str(d / "pairs.tsv"), "--out", str(d / "s.h5"),
          "--no-progress", "--workers", "1"]),
    main(["msa", "search", "--fasta", str(d / "t.fasta"), "--db", str(d / "db.fasta"),
          "--out", str(d / "ms"), "--no-progress"]),
    main(["predict", "--checkpoint", str(ck), "--fasta", str(d / "t.fasta"), "--msa-dir",
          str(d / "msas"), "--out", str(d / "pred"), "--no-progress", "--allow-unreleased",
          "--device", "cpu"])])
"""


def test_data_build_msa_search_predict_under_a_2_gib_address_space_limit(tmp_path, data_dir):
    """`ulimit -v 2 GiB` (as SLURM memory limits or strict overcommit): main died on the first
    input file of each command, reserving 8 GiB for the read."""
    script = tmp_path / "run.py"
    script.write_text(_UNDER_LIMIT)
    out = subprocess.run(["bash", "-c", f'ulimit -v {2 << 20}; exec "{sys.executable}" '
                          f'{script} {tmp_path} {data_dir}'], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=300)
    assert out.returncode == 0 and "RCS [0, 0, 0]" in out.stdout, (out.stdout + out.stderr)[-2000:]
    assert (tmp_path / "s.h5").is_file() and (tmp_path / "ms" / "2q2k_A" / "db.a3m").is_file()
    assert (tmp_path / "pred" / "summary.tsv").is_file()
