"""kill -9 at bad moments of the complex paths (issue 32 audit).

Each case forks a child that runs the real command in-process with one function wrapped so
that the child SIGKILLs itself at that exact moment (a real kill -9: no finally, no atexit),
then the parent checks what is on disk and reruns. Reference: an uninterrupted run on the
same inputs (same seed: the same ipTM / atoms), and for the store its content digests.

- `protdp complex store`: killed while writing a complex, while verifying, just before the
  rename; the previous store is byte-identical and verifies, a rerun without --force is one
  line naming the file, with --force it finishes the job (the leftover `.building` removed).
- complex `protdp predict`: killed while writing the structures, after the publish rename,
  after the review item, while writing provenance.json (a torn file) and while writing the
  summary; the rerun resumes (never taking a half-written folder as done), ends with the
  reference's scores and exactly one review item per complex.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal

import pytest

from protdp import fileio
from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.review.binding import mismatches
from protdp.review.store import ReviewStore
from complex_fixtures import GOOD_ROWS, write_manifest
from test_complex_predict import COMMON, RAW, _msa_dir, ckpt  # noqa: F401  (fixture)


def _kill_when(module, attr: str, when, *, before: bool = False):
    """Wrap module.attr so the process SIGKILLs itself on the call for which `when(*args)` is
    true (after the call returns, or `before` it)."""
    real = getattr(module, attr)

    def wrapped(*args, **kwargs):
        hit = when(*args, **kwargs)
        if hit and before:
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(module, attr, wrapped)


def _run_killed(patch, fn) -> None:
    """Run fn() in a forked child with `patch()` applied there; assert it died of SIGKILL."""
    pid = os.fork()
    if pid == 0:                                 # child: never returns into pytest
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            patch()
            fn()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


# --------------------------------------------------------------------------- complex store
@pytest.fixture
def store_inputs(tmp_path):
    rows = [(c, s, ch, "-") for c, s, ch, _ in GOOD_ROWS]     # small: without their MSAs
    return write_manifest(tmp_path / "complexes.tsv", rows)


def test_kill_9_during_complex_store_leaves_old_store_or_none(tmp_path, store_inputs,
                                                                 capsys):
    import protdp.complex.store as st

    manifest = store_inputs
    out = tmp_path / "complexes.h5"
    args = ["complex", "store", "--manifest", str(manifest), "--out", str(out)]
    # no previous store: a kill while writing the second complex leaves no store at all
    n = {"calls": 0}

    def second_complex(*a, **k):
        n["calls"] += 1
        return n["calls"] == 2

    _run_killed(lambda: _kill_when(st, "_write_complex", second_complex),
                lambda: protdp_main(args))
    building = tmp_path / ".complexes.h5.building"
    assert not out.exists() and building.exists()          # the kill left only the temp file
    assert protdp_main(args) == 0                          # a rerun builds, cleans up
    assert not building.exists() and st.verify_complex_store(out) == []
    good = out.read_bytes()
    ids = st.ComplexStore(out).complex_ids
    assert len(ids) >= 2
    # a forced rebuild killed at three moments: the previous store is untouched each time
    for module, attr, when in ((st, "_write_complex", lambda *a, **k: True),
                               (st, "verify_complex_store", lambda *a, **k: True),
                               (fileio, "replace_file", lambda *a, **k: True)):   # its rename
        _run_killed(lambda: _kill_when(module, attr, when, before=True),
                    lambda: protdp_main(args + ["--force"]))
        assert out.read_bytes() == good, attr
        assert st.verify_complex_store(out) == [] and st.ComplexStore(out).complex_ids == ids
    # a rerun without --force is one line naming the file; with --force it finishes
    capsys.readouterr()
    assert protdp_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: exists (give --force" in err
    assert protdp_main(args + ["--force"]) == 0
    assert not building.exists() and st.verify_complex_store(out) == []
    assert st.ComplexStore(out).complex_ids == ids


def test_store_never_writes_through_links(tmp_path, store_inputs, capsys):
    """--out, or the lock beside it, a link to a file outside: one line, the file untouched
    (neither replaced nor created)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.h5").write_bytes(b"not ours")
    (tmp_path / "link.h5").symlink_to(outside / "keep.h5")
    args = ["complex", "store", "--manifest", str(store_inputs), "--force", "--out"]
    assert protdp_main(args + [str(tmp_path / "link.h5")]) == 2
    assert f"{tmp_path / 'link.h5'}: is a symbolic link" in capsys.readouterr().err
    (tmp_path / ".c.h5.lock").symlink_to(outside / "created")
    assert protdp_main(args + [str(tmp_path / "c.h5")]) == 2
    assert "cannot open the build lock .c.h5.lock" in capsys.readouterr().err
    assert (outside / "keep.h5").read_bytes() == b"not ours"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.h5"]
    assert not (tmp_path / "c.h5").exists()


def test_corrupt_store_is_named_not_read(tmp_path, store_inputs):
    """A store whose bytes changed after the build (a flipped array) fails verification naming
    the complex; a truncated one is one line naming the file."""
    import h5py

    import protdp.complex.store as st
    from protdp.errors import InputError

    out = tmp_path / "c.h5"
    st.build_complex_store(store_inputs, out, log=lambda line: None)
    cid = st.ComplexStore(out).complex_ids[0]
    with h5py.File(out, "r+") as h5:
        ds = h5[f"complexes/{cid}/0/all_atom_positions"]
        arr = ds[()]
        arr[0, 1, 0] += 1.0
        ds[...] = arr
    assert st.verify_complex_store(out) == [f"complex {cid}: arrays differ from content_sha256"]
    out.write_bytes(out.read_bytes()[:4096])
    with pytest.raises(InputError, match="c.h5"):
        st.ComplexStore(out)
    assert st.verify_complex_store(out)[0].startswith("not a readable complex store")


# --------------------------------------------------------------------------- complex predict
@pytest.fixture
def complex_inputs(tmp_path):
    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    fasta = tmp_path / "complexes.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n")
    msas = _msa_dir(tmp_path, {"hb": ("hbA_1-36", "hbB_1-40", False)})
    return fasta, msas


def _whole_json(path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def _predict_args(ckpt, fasta, msas, out):
    return ["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--msa-dir", str(msas),
            "--out", str(out), *COMMON]


def _state(out):
    """(per complex: the CURRENT folder's scores.json ipTM / pLDDT / route), review items."""
    got = {}
    for name in ("hb",):
        tdir = out / "targets" / name
        pdir = tdir / (tdir / "CURRENT").read_text().strip()
        assert (pdir / "provenance.json").is_file()
        s = json.loads((pdir / "scores.json").read_text())
        got[name] = (s["iptm"], s["plddt"], s["route"], sorted(p.name for p in pdir.iterdir()))
        assert not [p for p in tdir.iterdir() if ".partial-" in p.name]
    store = ReviewStore(str(out / "review_queue.sqlite"))
    listed = store.list(state=None)
    items = sorted(i["target"] for i in listed)
    for i in listed:            # each item still binds its folder's bytes (reviewable)
        assert mismatches(store.get(i["id"])) == [], i["target"]
    store.close()
    return got, items


def test_kill_9_during_complex_predict_resumes(tmp_path, ckpt, complex_inputs, capsys):  # noqa: F811
    import protdp.inference.batch as batch
    import protdp.inference.predictor as predictor
    import protdp.complex.outputs as mouts

    fasta, msas = complex_inputs
    ref_out = tmp_path / "ref"
    assert protdp_main(_predict_args(ckpt, fasta, msas, ref_out)) == 0
    ref = _state(ref_out)
    assert ref[1] == ["hb"]                               # random weights: to review

    def torn_provenance(path, obj):                       # a half-written provenance.json
        if path.name == "provenance.json":
            path.write_text(json.dumps(obj)[:200])
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write_json(path, obj)

    real_write_json = predictor.write_json
    calls = {"n": 0}

    def nth(k):
        def when(*a, **kw):
            calls["n"] += 1
            return calls["n"] == k
        return when

    # one output folder, killed at each point in turn: every rerun resumes the previous
    # kill's state (a crash of a resume included)
    points = {
        "structures": lambda: _kill_when(mouts, "write_complex_structures", nth(2)),
        "published": lambda: _kill_when(predictor, "publish_build", nth(1)),
        "enqueued": lambda: _kill_when(predictor.Predictor, "_enqueue", nth(1)),
        "provenance": lambda: setattr(predictor, "write_json", torn_provenance),
        "summary": lambda: _kill_when(batch, "write_summary_csv", nth(1), before=True),
    }
    out = tmp_path / "out"
    tdir = out / "targets" / "hb"
    for point, patch in points.items():
        calls["n"] = 0
        _run_killed(patch, lambda: protdp_main(_predict_args(ckpt, fasta, msas, out)))
        published = [p for p in tdir.iterdir() if not p.name.startswith(".")
                     and p.is_dir()] if tdir.is_dir() else []
        # what each kill leaves: nothing published before the rename; after it, a folder
        # without a (whole) provenance.json, which the rerun finishes or redoes
        if point == "structures":
            assert [p.name for p in tdir.iterdir() if ".partial-" in p.name] and not published
        elif point in ("published", "enqueued", "provenance"):
            assert len(published) == 1 and not _whole_json(published[0] / "provenance.json")
            assert not (tdir / "CURRENT").exists()
    assert protdp_main(_predict_args(ckpt, fasta, msas, out)) == 0
    assert _state(out) == ref
    text = capsys.readouterr().out
    assert "1 targets: 0 accepted, 1 need review, 0 rejected" in text, text
    rows, ref_rows = (list(csv.DictReader(open(d / "summary.csv"))) for d in (out, ref_out))
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in rows] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in ref_rows]


def test_kill_9_during_complex_predict_command_leaves_no_ungated_scores(tmp_path, ckpt,  # noqa: F811
                                                                      capsys):
    """`protdp complex predict` (a front end of `protdp predict`, issue 41) killed while
    writing scores.json: nothing is published (the build folder is hidden until renamed), and
    the rerun writes the gated scores; a link planted as a complex's output folder is one
    rejected row, never written through."""
    import protdp.inference.predictor as predictor
    from protdp.inference.writers import read_summary
    from test_complex_pairing import FIXTURE

    feats = tmp_path / "features" / "hb"
    feats.mkdir(parents=True)
    (feats / "features.npz").write_bytes(
        (FIXTURE / "features_4hhb_hbA1-36_hbB1-40.npz").read_bytes())
    out = tmp_path / "pred"
    args = ["complex", "predict", "--features-dir", str(tmp_path / "features"), "--checkpoint",
            str(ckpt), "--out", str(out), *COMMON]
    _run_killed(lambda: _kill_when(predictor, "write_json",
                                   lambda path, obj: path.name == "scores.json"),
                lambda: protdp_main(args))
    tdir = out / "targets" / "hb"
    assert not (tdir / "CURRENT").exists()
    assert [p.name for p in tdir.iterdir() if not p.name.startswith(".")] == []
    assert protdp_main(args) == 0
    pdir = tdir / (tdir / "CURRENT").read_text().strip()
    scores = json.loads((pdir / "scores.json").read_text())
    assert scores["route"] == "needs_review" and "unreleased_checkpoint" in scores["reasons"]
    # its output folder replaced by a link to a folder outside: one rejected row, nothing
    # written there
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(tdir)
    tdir.symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    assert protdp_main(args) == 0
    row = read_summary(out / "summary.tsv")[0]
    assert row["route"] == "rejected" and "is a symbolic link" in row["detail"], row
    assert list(outside.iterdir()) == []
