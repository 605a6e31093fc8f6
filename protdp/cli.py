"""`protdp <subcommand>`: one console script dispatching to each area's own CLI module.

Each subcommand is a function `f(argv: list[str]) -> int` in its subpackage's `cli.py`
("module:function"; a bare module means its `main`). A `ProtdpError` is printed as one clear
line (no traceback) with exit code 2.
"""

from __future__ import annotations

import importlib
import os
import sys

from protdp.errors import ProtdpError

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "data": ("protdp.data.cli", "build and inspect the HDF5 family store"),
    "train": ("protdp.train.cli", "pretrain with Megatron-style flags (same as pipelines/pretrain.py)"),
    "report": ("protdp.train.cli:report", "render loss/lDDT curves and the step-time breakdown of a run"),
    "msa": ("protdp.msa.cli", "MSA search with pyhmmer (AF2 jackhmmer settings) for FASTA targets"),
    "templates": ("protdp.templates.cli", "template hits into a training store (store-fasta, "
                  "add-to-store)"),
    "complex": ("protdp.complex.cli", "complexes (AlphaFold-Multimer): paired MSA features and "
                                       "the pairing per complex"),
    "interface": ("protdp.interface.cli", "ipSAE, pDockQ, pDockQ2, LIS per chain pair of a complex "
                                          "(AF2/ColabFold, AF3, Boltz, protdp files)"),
    "gate": ("protdp.external.cli", "other tools' predictions (ColabFold, AF2, AF3, Boltz) through "
                                    "the gate and review queue"),
    "predict": ("protdp.inference.cli", "batch structure prediction with the confidence gate"),
    "review": ("protdp.review.cli", "human review queue: reviewers, claims, decisions, web UI"),
    "redteam": ("protdp.safety.cli:redteam", "adversarial cases against the predictor and gate"),
    "calibrate": ("protdp.safety.cli:calibrate", "pLDDT vs true lDDT calibration report"),
    "release": ("protdp.safety.cli:release", "release gate of a checkpoint (accuracy, calibration, "
                                             "red-team, screening) -> release.json"),
    "plan": ("protdp.planning.cli", "memory and parallelism planner"),
    "weights": ("protdp.weights.cli", "AlphaFold2/OpenFold weights: import, export, compare to "
                                      "AlphaFold"),
    "preflight": ("protdp.parallel.cli", "measure network + model before a run; predict scaling"),
}


def _usage() -> str:
    lines = ["usage: protdp <subcommand> [options]", "", "subcommands:"]
    for name, (_, help_text) in SUBCOMMANDS.items():
        lines.append(f"  {name:<10} {help_text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`protdp SUBCOMMAND ...`; output piped into a reader that stops early (`| head`) ends
    quietly with status 141 (as a shell's SIGPIPE) instead of a BrokenPipeError traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from protdp import __version__
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"protdp: unknown subcommand '{name}'\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, func = SUBCOMMANDS[name][0].partition(":")
    entry = getattr(importlib.import_module(module_name), func or "main")
    try:
        return int(entry(rest) or 0)
    except ProtdpError as exc:
        print(f"protdp {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from protdp.parallel.env import leave_process
    leave_process(main())
