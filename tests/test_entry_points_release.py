"""No entry point that predicts can skip the release check (issue 41).

`protdp complex predict` used to decide with the gate on its own: no release check, no
`--allow-unreleased`, no `unreleased_checkpoint`, no review queue. Now every gate decision is
made in one place (`Predictor`, which checks the release record in its constructor), and
this file proves it two ways:

1. By reading the code (AST): every call of the gate (`route`), of `Predictor`, of
   `predict_batch`, of `workflows.predict` and of `protdp predict`'s `main`, anywhere in
   `protdp/` and `pipelines/`, is found and must be one of `CALLERS` below (a new entry point
   fails here until it is added, with a check). `release_gate="off"` only in the red-team
   suite, which runs as part of `protdp release` on a not-yet-released checkpoint.
2. By running each entry point on an unreleased checkpoint (monomer and multimer): refused
   without --allow-unreleased (release_gate "enforce", the default), and with it every
   prediction routed to review with `unreleased_checkpoint`.
Also: a complex of 30 chains (more than A-Z) through `protdp complex predict`, named with
AlphaFold's chain ids as `protdp predict` names them (the old path crashed on chain 27).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from protdp.cli import main as protdp_main
from protdp.errors import ConfigError
from protdp.inference.checkpoint import save_model_checkpoint
from test_complex_predict import COMMON, ckpt as multimer_ckpt  # noqa: F401  (fixture)
from test_predict import tiny_model

ROOT = Path(__file__).resolve().parent.parent
SEQ = "MKTAYIAKQRQISFVKSHFSRQ"

# the gate and every function that reaches it -> the modules allowed to call it
ENTRY_SYMBOLS = {
    ("protdp.gating", "route"), ("protdp.gating.route", "route"),
    ("protdp.inference.predictor", "Predictor"),
    ("protdp.inference.batch", "predict_batch"),
    ("protdp.workflows", "predict"),
    ("protdp.inference.cli", "main"),
}
CALLERS = {
    ("protdp/inference/predictor.py", "route"),          # the gate, after _check_release
    ("protdp/inference/batch.py", "Predictor"),          # release_gate passed through
    ("protdp/workflows.py", "predict_batch"),            # **kwargs passed through
    ("protdp/inference/cli.py", "predict"),              # `protdp predict`
    ("protdp/complex/cli.py", "main"),                  # `protdp complex predict`
    ("protdp/safety/redteam.py", "predict"),             # release_gate="off": the red-team
                                                         # suites a release runs (monomer and,
                                                         # through redteam's helpers, complex)
    ("pipelines/predict.py", "main"),                    # torchrun entry point
    ("pipelines/demo.py", "predict"),                    # demo.predict_chains
    # `protdp gate` (issue 43, on main): other tools' predictions; no protdp checkpoint, so no
    # release record applies
    ("protdp/external/gate.py", "route"),
}
RELEASE_GATE_OFF_ALLOWED = {"protdp/safety/redteam.py"}


def _calls(path: Path) -> tuple[set[str], list[str]]:
    """(names of ENTRY_SYMBOLS called in the file, release_gate values written literally)."""
    tree = ast.parse(path.read_text())
    local = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if (node.module, a.name) in ENTRY_SYMBOLS:
                    local[a.asname or a.name] = a.name
    called, gates = set(), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in local:
            called.add(local[node.func.id])
        for kw in node.keywords:
            if kw.arg == "release_gate" and isinstance(kw.value, ast.Constant):
                gates.append(kw.value.value)
    return called, gates


def test_every_gate_decision_path_is_enumerated():
    found, off = set(), set()
    for path in sorted([*ROOT.glob("protdp/**/*.py"), *ROOT.glob("pipelines/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        called, gates = _calls(path)
        found |= {(rel, c) for c in called}
        if "off" in gates:
            off.add(rel)
    expected = {c for c in CALLERS if (ROOT / c[0]).is_file()}    # branches merge at times
    assert found == expected, (f"new: {sorted(found - expected)}; gone: "
                               f"{sorted(expected - found)}: give the new entry point a release "
                               "check test here")
    assert off <= RELEASE_GATE_OFF_ALLOWED, off
    # the console commands whose module is, or imports, one of the callers
    from protdp.cli import SUBCOMMANDS
    callers = {r[:-3].replace("/", ".") for r, _ in CALLERS}
    reaching = set()
    for name, (mod, _) in SUBCOMMANDS.items():
        mod = mod.split(":")[0]
        if mod in callers or _imports(ROOT / (mod.replace(".", "/") + ".py")) & callers:
            reaching.add(name)
    # redteam / release / calibrate share `protdp.safety.cli`, which reaches the gate only
    # through the red-team suite (release_gate "off": what `protdp release` runs, above)
    gate = {n for n, (m, _) in SUBCOMMANDS.items() if m.split(":")[0] == "protdp.external.cli"}
    assert reaching == {"predict", "complex", "redteam", "release", "calibrate"} | gate, reaching


def _imports(path: Path) -> set[str]:
    """Every module a file imports (`from a.b import c` gives a.b and a.b.c)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


@pytest.fixture(scope="module")
def mono_ckpt(tmp_path_factory):
    return save_model_checkpoint(tiny_model(), None, tmp_path_factory.mktemp("mono") /
                                 "tiny.pt", training_crop=32, max_msa_rows=16)


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory):
    """`protdp complex features`-shaped folder: a heterodimer of two copies of SEQ pieces."""
    from protdp.inference.complexes import chain_inputs
    from protdp.complex.features import complex_features
    from protdp.complex.inputs import read_complexes

    d = tmp_path_factory.mktemp("feats")
    fasta = d / "c.fasta"
    fasta.write_text(f">dimer\n{SEQ}:{SEQ[::-1]}\n")
    (c,) = read_complexes(fasta)
    feats = complex_features(chain_inputs(c, None, max_length=100,
                                          max_unknown_fraction=0.5)[0]).features
    (d / "out" / "dimer").mkdir(parents=True)
    np.savez(d / "out" / "dimer" / "features.npz", **feats)
    return d / "out"


def _scores(out: Path) -> list[dict]:
    got = []
    for cur in sorted((out / "targets").glob("*/CURRENT")):
        got.append(json.loads((cur.parent / cur.read_text().strip() / "scores.json")
                              .read_text()))
    return got


def _assert_routed_unreleased(out: Path) -> None:
    scores = _scores(out)
    assert scores and all(s["route"] == "needs_review" and "unreleased_checkpoint"
                          in s["reasons"] for s in scores), scores
    prov = json.loads(next((out / "targets").glob("*/*/provenance.json")).read_text())
    assert prov["config"]["release"]["gate"] == "review"
    assert prov["review_item"] is not None


def _fasta(tmp_path: Path, complex_: bool) -> Path:
    f = tmp_path / "in.fasta"
    f.write_text(f">t\n{SEQ}:{SEQ[::-1]}\n" if complex_ else f">t\n{SEQ}\n")
    return f


def _cli_argv(kind, tmp_path, mono, multi, features):
    if kind == "predict-monomer":
        return ["predict", "--checkpoint", str(mono), "--fasta", str(_fasta(tmp_path, False))]
    if kind == "predict-multimer":
        return ["predict", "--checkpoint", str(multi), "--fasta", str(_fasta(tmp_path, True))]
    return ["complex", "predict", "--checkpoint", str(multi), "--features-dir", str(features)]


@pytest.mark.parametrize("kind", ["predict-monomer", "predict-multimer", "complex-predict"])
def test_console_commands_refuse_unreleased(kind, tmp_path, mono_ckpt, multimer_ckpt,  # noqa: F811
                                            features_dir, capsys):
    argv = _cli_argv(kind, tmp_path, mono_ckpt, multimer_ckpt, features_dir)
    out = tmp_path / "out"
    common = [a for a in COMMON if a != "--allow-unreleased"]
    assert protdp_main([*argv, "--out", str(out), *common]) == 2
    err = capsys.readouterr().err
    assert "is not released" in err and "--allow-unreleased" in err, err
    assert not list((out / "targets").glob("*/*/scores.json"))
    assert protdp_main([*argv, "--out", str(out), *common, "--allow-unreleased"]) == 0
    _assert_routed_unreleased(out)
    capsys.readouterr()            # resume: the rerun finds the prediction complete
    assert protdp_main([*argv, "--out", str(out), *common, "--allow-unreleased"]) == 0
    assert "(1 already complete, skipped)" in capsys.readouterr().out


def test_pipelines_predict_refuses_unreleased(tmp_path, mono_ckpt):
    argv = [sys.executable, str(ROOT / "pipelines" / "predict.py"), "--checkpoint",
            str(mono_ckpt), "--fasta", str(_fasta(tmp_path, False)), "--out",
            str(tmp_path / "out"), "--num-recycles", "0", "--no-plots", "--no-progress"]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    refused = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "is not released" in refused.stderr, refused.stderr
    ran = subprocess.run(argv + ["--allow-unreleased"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    _assert_routed_unreleased(tmp_path / "out")


def _python_entry(kind: str, ckpt, fasta: Path, out: Path, **gate):
    from protdp.inference.predictor import PredictConfig

    config = PredictConfig(num_recycles=0, plots=False)
    if kind == "workflows.predict":
        from protdp.workflows import predict
        return predict(ckpt, fasta, out, config=config, progress=False, **gate)
    if kind == "predict_batch":
        from protdp.inference.batch import predict_batch
        from protdp.workflows import QueueSink
        return predict_batch(ckpt, fasta, out, config=config, progress=False,
                             sink=QueueSink(str(out / "q.sqlite")), **gate)
    if kind == "Predictor":
        from protdp.inference.checkpoint import load_model_checkpoint
        from protdp.inference.inputs import read_inputs
        from protdp.inference.predictor import Predictor
        from protdp.workflows import QueueSink
        pred = Predictor(load_model_checkpoint(ckpt), out, config=config,
                         sink=QueueSink(str(out / "q.sqlite")), **gate)
        (t,), sha = read_inputs(fasta)
        try:
            return pred.predict_target(t, {"path": str(fasta), "sha256": sha, "msa_dir": None})
        finally:
            pred.close()
    sys.path.insert(0, str(ROOT / "pipelines"))
    from demo import predict_chains
    return predict_chains(ckpt, [("t", SEQ, None)], out, config=config, progress=False, **gate)


@pytest.mark.parametrize("kind", ["workflows.predict", "predict_batch", "Predictor",
                                  "demo.predict_chains"])
def test_python_entry_points_refuse_unreleased(kind, tmp_path, mono_ckpt):
    fasta = _fasta(tmp_path, False)
    with pytest.raises(ConfigError, match="is not released"):
        _python_entry(kind, mono_ckpt, fasta, tmp_path / "refused")
    out = tmp_path / "out"
    _python_entry(kind, mono_ckpt, fasta, out, release_gate="review")
    _assert_routed_unreleased(out)


def test_complex_of_30_chains_gets_alphafold_chain_ids(tmp_path, multimer_ckpt):  # noqa: F811
    """More chains than A-Z: named A..Z, a..d as `protdp predict` names them (was a crash)."""
    from protdp.inference.complexes import chain_inputs
    from protdp.complex.features import complex_features
    from protdp.complex.inputs import CHAIN_IDS, read_complexes

    fasta = tmp_path / "c.fasta"
    pieces = [SEQ[k % 10:k % 10 + 4] for k in range(30)]
    fasta.write_text(">many\n" + ":".join(pieces) + "\n")
    (c,) = read_complexes(fasta)
    feats = complex_features(chain_inputs(c, None, max_length=1000,
                                          max_unknown_fraction=0.5)[0]).features
    (tmp_path / "f" / "many").mkdir(parents=True)
    np.savez(tmp_path / "f" / "many" / "features.npz", **feats)
    out = tmp_path / "out"
    assert protdp_main(["complex", "predict", "--checkpoint", str(multimer_ckpt),
                        "--features-dir", str(tmp_path / "f"), "--out", str(out),
                        *COMMON]) == 0
    (scores,) = _scores(out)
    assert [ch["chain_id"] for ch in scores["chains"]] == list(CHAIN_IDS[:30])
    pdir = next((out / "targets" / "many").glob("*/provenance.json")).parent
    import gemmi
    st = gemmi.read_structure(str(pdir / "many.cif"))
    assert [ch.name for ch in st[0]] == list(CHAIN_IDS[:30])
