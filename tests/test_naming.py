"""One word each for the two multi-chain things (docs/architecture.md, "Naming: complex and
multimer"): *complex* is the input and the prediction, *multimer* the AlphaFold-Multimer
network and its weights. These checks fail when a module lands under the other word."""

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "protdp"

# modules named for the network's weights file or its loading, outside model/multimer/
MULTIMER_WEIGHT_MODULES = {
    "weights/alphafold_multimer.py", "weights/compare_multimer.py",
    "weights/multimer_checkpoint.py", "train/multimer_file.py", "inference/multimer_loading.py",
}


def _modules() -> list[str]:
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))


def test_multimer_network_lives_in_one_subpackage():
    flat = [m for m in _modules() if m.startswith("model/")
            and ("multimer" in Path(m).name or "complex" in Path(m).name)]
    assert flat == [], f"AlphaFold-Multimer model code belongs in protdp/model/multimer/: {flat}"
    assert (PACKAGE / "model" / "multimer" / "model.py").is_file()


def test_multimer_word_only_for_the_network_and_its_weights():
    stray = [m for m in _modules() if "multimer" in m and not m.startswith("model/multimer/")
             and m not in MULTIMER_WEIGHT_MODULES]
    assert stray == [], f"modules about complexes (inputs, jobs, outputs) say complex: {stray}"
    assert not (PACKAGE / "multimer").exists(), "complex inputs live in protdp/complex/"


def test_complex_cli_spellings_parse():
    """`protdp complex ...` and the predict front end it has always accepted."""
    for argv in (["complex", "--help"], ["complex", "predict", "--help"]):
        out = subprocess.run([sys.executable, "-m", "protdp.cli", *argv], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, (argv, out.stderr[-2000:])
        assert "usage" in out.stdout.lower()
