"""benchmarks/gpu_model.py (issue 29 D6) is what a lent GPU runs; here every section runs on CPU
with tiny sizes, so the script cannot rot, and its bias-gradient check is itself checked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_model_benchmark_runs_on_cpu_tiny(tmp_path):
    out = tmp_path / "gpu_model.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_model.py"), "--device", "cpu",
                           "--tiny", "--out", str(out), "--budget-s", "200"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    sec = res["sections"]
    assert set(sec) == {"block", "bias_grad", "train_step", "inference"}
    backends = sec["block"]["backends"]
    assert backends["explicit"]["kernel_train"] == "explicit"
    assert backends["sdpa"]["kernel_infer"] == "sdpa_flash_cpu"
    for name in ("explicit", "sdpa"):
        assert backends[name]["forward_ms"] > 0 and backends[name]["backward_ms"] > 0, backends[name]
    assert "error" not in backends["lowmem"] and backends["lowmem"]["inference_ms"] > 0
    cases = sec["bias_grad"]["cases"]
    math32 = [c for c in cases if c["kernel"] == "sdpa_math" and c["dtype"] == "float32"]
    assert {c["length"] for c in math32} == {1, 17, 64}
    for c in math32:                                 # fp32 kernels vs the fp64 explicit truth
        assert max(c[k] for k in c if k.endswith("_max_rel")) < 1e-5, c
    # CPU flash refuses a bias that needs a gradient: recorded, not a crash
    assert all("error" in c for c in cases if c["kernel"] == "sdpa_flash_cpu")
    for L, row in sec["train_step"]["crops"].items():
        assert row["loss_finite"] and row["step_s"] > 0 and row["achieved_tflops"] >= 0, (L, row)
    assert all(row["finite"] for row in sec["inference"]["lengths"].values())



def test_gpu_model_rejects_unknown_section(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_model import main

    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--tiny", "--out", str(tmp_path / "x.json"), "--only", "block,nope"])
    assert exc.value.code == 2 and "unknown section(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
