"""Docs that cannot rot (issue 48): every `protdp ...` / `python pipelines/...` command line of
README.md and docs/ (not docs/pending/) is parsed by the CLI's own argparse parser; blocks
marked `<!-- runnable -->` are run; the site builds with `mkdocs build --strict`; the benchmark
tables are the ones `benchmarks/tables.py` generates from benchmarks/results/*.json.

How a command is checked. Code blocks: continuation lines are joined, comments dropped, the
launcher (`torchrun ...`, `mpirun ...`, `python`, `-m protdp.cli`, `-m protdp.train`; `sbatch
examples/slurm/pretrain.sbatch ARGS` passes ARGS to the trainer) and leading `VAR=value` words
skipped; the subcommand's parser is obtained by calling its entry point
with `ArgumentParser.parse_args` patched to hand back the parser instead of parsing (nothing
runs), then the words are parsed by it (unknown subcommand or flag, missing required argument,
bad choice: the test names file and line). Every `--flag` must be spelled in full (argparse
would accept a prefix). A command with a literal `...` word is abbreviated: only its flags are
checked. Inline code spans in prose (`protdp review verify --expect-head`) are abbreviated too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from protdp.cli import SUBCOMMANDS
from protdp.paths import REPO_ROOT, data_root

DOCS = REPO_ROOT / "docs"
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
RUNNABLE = "<!-- runnable -->"
LAUNCHERS = {"torchrun", "mpirun", "srun", "python", "python3"}
SLURM_SCRIPT = "examples/slurm/pretrain.sbatch"
# entry points of `python <script>` / `python -m <module>` -> the module:function behind them
SCRIPTS = {
    "pipelines/pretrain.py": "protdp.train.cli", "protdp.train": "protdp.train.cli",
    "pipelines/predict.py": "protdp.inference.cli",
    "pipelines/build_dataset.py": "protdp.data.cli",
}


def doc_files() -> list[Path]:
    pages = [p for p in DOCS.rglob("*.md") if "pending" not in p.relative_to(DOCS).parts]
    return [REPO_ROOT / "README.md"] + sorted(pages)


@dataclass
class Command:
    where: str            # file:line
    words: list[str]      # after the launcher: [subcommand, args...] or [script, args...]
    abbreviated: bool


def _logical_lines(body: str, first_line: int):
    """(line number, text) of a block's lines with `\\` continuations joined."""
    buf, start = "", None
    for i, line in enumerate(body.splitlines()):
        start = first_line + i if start is None else start
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield start, buf + line
        buf, start = "", None


def _command_words(words: list[str]) -> list[str] | None:
    """The words from the subcommand / script on, or None when the line runs something else."""
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]                         # PROTDP_REVIEW_TOKEN=... protdp review ...
    if not words:
        return None
    if words[0] == "protdp":
        return words[1:]
    if words[0] == "sbatch" and SLURM_SCRIPT in words:    # extra arguments go to the trainer
        return ["python", "pipelines/pretrain.py"] + words[words.index(SLURM_SCRIPT) + 1:]
    if words[0] not in LAUNCHERS:
        return None
    for i, w in enumerate(words):
        if w in SCRIPTS or (w.startswith("pipelines/") and w.endswith(".py")):
            return ["python", w] + words[i + 1:]
        if w == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if module == "protdp.cli":
                return words[i + 2:]
            return ["python", module] + words[i + 2:]
    return None


def _split_commands(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in words:
        if w in ("&&", ";", "|", "||"):
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out + [cur]


def commands_in(path: Path) -> list[Command]:
    text = path.read_text()
    rel = path.relative_to(REPO_ROOT)
    found = []
    blocks = []
    for m in FENCE.finditer(text):
        line0 = text.count("\n", 0, m.start("body")) + 1
        blocks.append((m.start(), m.end()))
        for lineno, line in _logical_lines(m.group("body"), line0):
            try:
                lex = shlex.split(line, comments=True)
            except ValueError:
                continue
            for words in _split_commands(lex):
                cmd = _command_words(words)
                if cmd is not None:
                    found.append(Command(f"{rel}:{lineno}", cmd, "..." in cmd))
    for m in re.finditer(r"`(protdp [^`\n]+)`", text):
        if any(a <= m.start() < b for a, b in blocks):
            continue
        words = m.group(1).split()
        if re.fullmatch(r"[a-z][\w-]*", words[1]):  # not `protdp <subcommand>`, `protdp data: error`
            found.append(Command(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}",
                                 words[1:], True))
    return found


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def _entry(words: list[str]):
    """(entry function, argv it is given) of a command's words."""
    if words[0] == "python":
        module, argv = SCRIPTS.get(words[1]), words[2:]
        if module is None:
            raise AssertionError(f"no parser known for {words[1]}")
        if words[1] == "pipelines/build_dataset.py":
            argv = ["build"] + argv
        return getattr(importlib.import_module(module), "main"), argv
    if words[0] not in SUBCOMMANDS:
        raise AssertionError(f"unknown subcommand 'protdp {words[0]}'")
    module, _, func = SUBCOMMANDS[words[0]][0].partition(":")
    return getattr(importlib.import_module(module), func or "main"), words[1:]


# sub-commands that hand the flags they do not know on to another command's parser:
# `protdp complex predict` passes every other flag through to `protdp predict` (issue 41)
PASS_THROUGH = {("complex", "predict"): "predict"}


def parser_of(entry) -> argparse.ArgumentParser:
    """The parser an entry point builds, taken from its parse_args call (nothing runs), or,
    for an entry point that only calls parse_known_args (`protdp complex`), from the last
    parse_known_args that stopped it."""
    seen = []

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    def known(self, *args, **kwargs):
        seen.append(self)
        return originals[1](self, *args, **kwargs)
    originals = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args)
    argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = capture, known
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            entry([])
    except _Captured as got:
        return got.parser
    except SystemExit:
        if seen:
            return seen[-1]
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = originals
    raise AssertionError(f"{entry.__module__}.{entry.__name__} never called parse_args")


def _options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Option strings valid for argv: the parser's and those of the sub-command argv names."""
    opts = set()
    for action in parser._actions:
        opts.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for word in argv:
                if word in action.choices:
                    rest = argv[argv.index(word) + 1:]
                    return opts | _options(action.choices[word], rest)
    return opts


def check(cmd: Command) -> str | None:
    """None if the command line is one its CLI accepts, else the reason."""
    try:
        entry, argv = _entry(cmd.words)
        parser = parser_of(entry)
    except AssertionError as exc:
        return str(exc)
    known = _options(parser, argv)
    through = PASS_THROUGH.get(tuple(cmd.words[:2]))
    if through is not None:                 # its unknown flags are the other command's
        other, _ = _entry([through])
        known |= _options(parser_of(other), [])
    for word in argv:
        flag = word.split("=", 1)[0]
        if flag.startswith("-") and not re.match(r"^-\d", flag) and flag not in known:
            return f"unknown flag {flag}"
    if cmd.abbreviated:
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            if through is None:
                parser.parse_args(argv)
            else:                           # flags checked above; required ones here
                parser.parse_known_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


ALL_COMMANDS = [c for path in doc_files() for c in commands_in(path)]


def test_docs_have_commands():
    """The extraction finds the command lines (a broken regex would pass everything)."""
    assert len(ALL_COMMANDS) >= 100, len(ALL_COMMANDS)
    assert sum(not c.abbreviated for c in ALL_COMMANDS) >= 50
    subcommands = {c.words[0] for c in ALL_COMMANDS}
    assert set(SUBCOMMANDS) <= subcommands, set(SUBCOMMANDS) - subcommands


def test_every_command_line_parses():
    problems = [f"{c.where}: {' '.join(c.words)}: {why}"
                for c in ALL_COMMANDS if (why := check(c)) is not None]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line, why", [
    ("protdp predict --checkpoint c/ --fasta t.fasta --out o/ --no-such-flag", "unknown flag"),
    ("protdp predict --fasta t.fasta --out o/", "required"),
    ("protdp nosuch --x", "unknown subcommand"),
    ("protdp review frobnicate", "invalid choice"),
    ("torchrun --nproc_per_node 2 pipelines/pretrain.py --data d.h5 --train-iter 5", "unknown flag"),
])
def test_a_wrong_command_is_caught(line, why):
    cmd = Command("t:1", _command_words(shlex.split(line)), False)
    assert why in (check(cmd) or ""), check(cmd)


def test_inline_spans_and_abbreviations_are_flag_checked(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("Run `protdp review verify --expect-hed 1:ab` then\n\n```bash\n"
                    "protdp predict ... --max-memry 70\n```\n")
    rel = Path(os.path.relpath(page, REPO_ROOT))
    found = commands_in(REPO_ROOT / rel)
    assert [c.abbreviated for c in found] == [True, True]
    assert all("unknown flag" in (check(c) or "") for c in found)


def runnable_blocks() -> list[tuple[str, str]]:
    out = []
    for path in doc_files():
        text = path.read_text()
        for m in FENCE.finditer(text):
            if text[:m.start()].rstrip().endswith(RUNNABLE):
                out.append((f"{path.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, m.start()) + 1}",
                            m.group("body")))
    return out


def test_runnable_blocks_are_marked():
    assert runnable_blocks(), "no block is marked <!-- runnable -->"


@pytest.mark.parametrize("where, body", runnable_blocks())
def test_runnable_block_runs(where, body, tmp_path):
    """The block as a bash script, from a folder laid out like a checkout beside ../shared."""
    work = tmp_path / "repo"
    work.mkdir()
    (work / "configs").symlink_to(REPO_ROOT / "configs")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data_root())
    script = ("set -euo pipefail\n"
              f'protdp() {{ "{sys.executable}" -m protdp.cli "$@"; }}\n' + body)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    run = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, f"{where}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"


def test_benchmark_tables_are_current():
    run = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "tables.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_benchmark_tables_come_from_results(tmp_path, monkeypatch):
    """A page's table is rewritten from the JSON: an edited number is stale."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import tables
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    page = (DOCS / "benchmarks.md").read_text()
    assert "<!-- table: model_vs_openfold_train -->" in page
    assert tables.render(page) == page
    edited = page.replace("| small, 2 blocks | 128 |", "| small, 2 blocks | 127 |", 1)
    assert edited != page and tables.render(edited) == page


def test_mkdocs_builds_strict(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=REPO_ROOT, capture_output=True, text=True,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "training" / "index.html").is_file()
    assert not (tmp_path / "site" / "pending").exists()


def test_readme_is_a_five_minute_read_pointing_at_real_pages():
    """README.md stays short (issue 48: at most 200 lines) and every page it links exists."""
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(set(links)) >= 8, links
    missing = sorted({link for link in links if not (REPO_ROOT / link).is_file()})
    assert not missing, missing
