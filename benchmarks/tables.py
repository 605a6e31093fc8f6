"""Benchmark tables of the docs, generated from `benchmarks/results/*.json` (never typed by hand).

A docs page asks for a table with a pair of HTML comments; everything between them is
rewritten from the results files:

    <!-- table: model_vs_openfold_train -->
    ...generated...
    <!-- /table -->

`python benchmarks/tables.py` rewrites every page of `docs/` (not `docs/pending/`) in place;
`--check` changes nothing and exits 1 naming each page whose tables are stale
(`tests/test_docs.py` runs it).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _rows(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def model_vs_openfold_train() -> str:
    """Training fwd+bwd, protdp vs OpenFold (peak RSS; time from the in-process A/B rounds)."""
    doc = _load("model_vs_openfold.json")
    ab = {(r["width"], r["blocks"], r["L"]): r for r in doc.get("in_process_ab_time", [])}
    rows = []
    for r in doc["train"]:
        key = (r["width"], r["blocks"], r["L"])
        time = ab[key]["median_time_ratio"] if key in ab else r["protdp_over_openfold_time"]
        rows.append([f"{r['width']}, {r['blocks']} block{'s' if r['blocks'] > 1 else ''}",
                     r["L"], f"{r['protdp']['peak_mib']:.0f} MiB",
                     f"{r['openfold']['peak_mib']:.0f} MiB",
                     _x(r["protdp_over_openfold_memory"]),
                     _x(r["protdp_explicit_over_openfold_memory"]), _x(time)])
    head = ["config", "L", "protdp peak", "OpenFold peak", "memory", "`explicit` memory", "time"]
    return _rows(head, rows) + f"\n(protdp commit {doc['protdp_commit']}; " \
        "`model_vs_openfold.json`)\n"


def model_vs_openfold_infer() -> str:
    """Inference peak of one Evoformer block, protdp vs OpenFold `inplace_safe`."""
    doc = _load("model_vs_openfold_infer.json")
    rows = []
    for r in doc["infer"]:
        p, o = r["protdp"], r["openfold"]
        rows.append([r["L"], f"{p['peak_mib']:.0f} MiB", f"{o['peak_mib']:.0f} MiB",
                     _x(r["protdp_over_openfold_memory"]),
                     f"{_x(r['protdp_over_openfold_time'])} ({p['n']} run{'s' if p['n'] > 1 else ''}"
                     f": {p['time_s']:.0f} s vs {o['time_s']:.0f} s)"])
    head = ["L", "protdp", "OpenFold (`inplace_safe`)", "ratio memory",
            "ratio time (median, shared CPU)"]
    note = doc["infer"][0].get("note") or doc.get("note") or ""
    return _rows(head, rows) + f"\n(`model_vs_openfold_infer.json`: {note})\n"


DDP_FILES = ["ddp.json", "ddp_b128.json", "ddp_netsim_1gbit.json", "ddp_netsim_4gbit.json",
             "ddp_netsim_4gbit_b128.json", "ddp_netsim_1gbit_accel300.json",
             "ddp_netsim_4gbit_accel60.json"]


def ddp_step_ratios() -> str:
    """Step time of each data-parallel engine over torch DDP's, one column per results file."""
    docs = {f: _load(f) for f in DDP_FILES if (RESULTS / f).is_file()}
    names: list[str] = []
    for doc in docs.values():
        names += [n for n in doc["configs"] if n not in names]
    rows = []
    for name in names:
        cells = []
        for doc in docs.values():
            ratio = doc["configs"].get(name, {}).get("ratio_to_torch_ddp")
            cells.append(_x(ratio) if ratio is not None else "")
        rows.append([f"`{name}`"] + cells)
    head = ["engine"] + [f"`{Path(f).stem}`" for f in docs]
    return _rows(head, rows) + "\n(step time / torch DDP's step time; lower is faster)\n"


def scaling() -> str:
    """Speed-up and efficiency vs one rank, measured beside the preflight's prediction."""
    doc = _load("scaling.json")
    rows = []
    for name, r in doc["summary"].items():
        flags = " ".join(doc["configs"].get(name, {}).get("flags", []))
        pred = r.get("predicted_efficiency")
        rows.append([f"`{name}`", r["dp"], f"`{flags}`" if flags else "", f"{r['speedup']:.2f}",
                     f"{r['efficiency']:.2f}", f"{pred:.2f}" if pred is not None else "",
                     f"{r['exposed_comm_fraction']:.3f}"])
    head = ["config", "dp", "flags", "speed-up", "efficiency", "predicted efficiency",
            "exposed comm fraction"]
    return _rows(head, rows) + f"\n({doc['benchmark']}; `scaling.json`)\n"


def dap() -> str:
    """Activation memory per rank and bytes moved per block at each DAP size."""
    doc = _load("dap.json")
    rows = [[r["dap_size"], f"{r['activation_mib_per_rank']:.0f} MiB",
             f"{r['activation_ratio_vs_dap1']:.2f}x", f"{r['ideal_ratio']:.2f}x",
             f"{r['comm_bytes_measured_rank0']['total'] / 2 ** 20:.0f} MiB",
             "yes" if r["comm_matches_formula"] else "NO"] for r in doc["rows"]]
    head = ["dap", "saved activations per rank", "vs dap 1", "ideal", "bytes moved (rank 0)",
            "= `dap_layout` formula"]
    return _rows(head, rows) + (f"\n(crop {doc['crop']}, {doc['msa_rows']} MSA rows, "
                                f"{doc['model']}; `dap.json`)\n")


def predict_memory() -> str:
    """The predictor's memory model against the measured peak of one inference pass."""
    doc = _load("predict_memory.json")
    rows = [[r["length"], r["msa_rows"], r["chunk"] or "none", f"{r['measured_mib']:.1f} MiB",
             f"{r['predicted_mib']:.1f} MiB", f"{r['predicted_over_measured']:.2f}"]
            for r in doc["rows"]]
    head = ["L", "MSA rows", "chunk", "measured", "predicted", "predicted / measured"]
    return _rows(head, rows) + f"\n({doc['device']}; `predict_memory.json`)\n"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s >= 1 else f"{1000 * s:.1f} ms"


def loader_tail() -> str:
    """Ordered feed vs tolerant feed with one straggler and one worker-killing family."""
    doc = _load("loader_tail.json")
    rows = []
    for key, label in (("baseline", "baseline (ordered feed)"), ("quarantine", "tolerant feed")):
        r = doc[key]
        worker = [e for e in r["ended"] if e.startswith("WorkerError")]
        ended = ("completed" if set(r["ended"]) == {"completed"}
                 else re.sub(r" \(pid \d+\)", "", (worker or r["ended"])[0])[:90])
        if r["records"]:
            ended += f", {len(r['records'])} quarantine records"
        rows.append([label, f"{r['steps_completed']} of {doc['steps']}",
                     f"{r['max_step_over_median']:.4f}", _seconds(r["data_wait_p99"]), ended])
    head = ["feed", "steps", "max step / median", "data wait p99", "ended"]
    return _rows(head, rows) + (
        f"\n(2 ranks, {doc['workers_per_rank']} workers and prefetch {doc['prefetch_depth']} per "
        f"rank, stand-in step {doc['stand_in_step_s']:.0f} s, families {doc['families']}; "
        f"deadline floor {doc['deadline']['floor_s']:.0f} s; `loader_tail.json`)\n")


HOSTILE_SECTIONS = {"template_mmcif": "template mmCIF", "templates_npz_json": "templates.npz / .json",
                    "multimer_checkpoints": "multimer_model.pt, 2 readers",
                    "family_store_declared_sizes": "family store, verify + read",
                    "complex_store": "complex store, verify + read",
                    "predict_options": "predict options",
                    "weight_magnitude": "weights 1e30 / NaN / Inf / 1.5e4 / at 1e4, 13 loaders"}
OUTCOMES = ("raw", "silent", "hang", "rejected", "valid_change", "intact")


def _outcomes(counts: dict) -> str:
    return ", ".join(f"{k} {counts[k]}" for k in OUTCOMES + tuple(sorted(set(counts) - set(OUTCOMES)))
                     if counts.get(k))


def hostile_round4() -> str:
    """Hostile-input audit round 4: outcome counts per section, before and after issue 47. The
    before column is the main run holding most sections; a section measured on another main
    commit (added later) names that commit."""
    doc = _load("hostile_audit.json")
    mains = sorted((k for k in doc if k.startswith("round4_main")),
                   key=lambda k: (-len(doc[k]["cases"]), k))
    before, after = mains[0], doc["round4_after"]
    rows, total, seconds = [], {}, 0.0
    for key, label in HOSTILE_SECTIONS.items():
        src = next((m for m in mains if key in doc[m]["cases"]), before)
        counts = doc[src]["cases"].get(key, {})
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
        n = sum(after["cases"].get(key, {}).values())
        note = f" (main {src.removeprefix('round4_main_')})" if src != before else ""
        rows.append([f"{label} ({n})", _outcomes(counts) + note,
                     _outcomes(after["cases"].get(key, {}))])
    for m in mains:
        seconds += doc[m].get("seconds") or sum(doc[m].get("section_seconds", {}).values())
    rows.append([f"all ({sum(after['totals'].values())})",
                 f"{_outcomes(total)}; {round(seconds, 1)} s",
                 f"{_outcomes(after['totals'])}; {after['seconds']} s"])
    head = ["section (cases)", before.removeprefix("round4_").replace("_", " "), "after issue 47"]
    return _rows(head, rows) + "\n(`hostile_audit.json`, `round4_*`; `hostile_audit.py --round4`)\n"


def _script_of(result: Path) -> str:
    """The benchmark script writing a results file: the longest script name it starts with."""
    if result.stem.startswith("preflight_netsim"):
        return "preflight_check.py"
    stems = sorted((p.stem for p in (ROOT / "benchmarks").glob("*.py")), key=len, reverse=True)
    return next((f"{s}.py" for s in stems if result.stem.startswith(s)), "?")


SENTENCE_END = re.compile(r"[.?!)]$")
SUMMARY_PARAGRAPHS = 3      # at most this many docstring paragraphs make one summary
BULLET = re.compile(r"^\s*[*-]\s+", re.M)


def summary_of(doc: str) -> str:
    """A docstring's summary for the results index: its first paragraph, continued into the
    next ones (bullets unmarked) while it has not ended a sentence, so a first paragraph that
    introduces a list ("each outcome classified as") is not cut off mid-sentence."""
    taken = []
    for para in doc.split("\n\n")[:SUMMARY_PARAGRAPHS]:
        taken.append(BULLET.sub("", para))
        if SENTENCE_END.search(para.rstrip()):
            break
    return " ".join(" ".join(taken).split()).replace("|", "\\|")


def _summary(script: str) -> str:
    path = ROOT / "benchmarks" / script
    if not path.is_file():
        return ""
    return summary_of(ast.get_docstring(ast.parse(path.read_text())) or "")


def results_index() -> str:
    """Every results file, the script that writes it and what that script measures."""
    rows = []
    for result in sorted(RESULTS.glob("*.json")):
        script = _script_of(result)
        rows.append([f"`{result.name}`", f"`{script}`", _summary(script)])
    return _rows(["results", "script", "what it measures"], rows)


TABLES = {f.__name__: f for f in (model_vs_openfold_train, model_vs_openfold_infer,
                                  ddp_step_ratios, scaling, dap, predict_memory,
                                  loader_tail, hostile_round4, results_index)}


def render(text: str, source: str = "") -> str:
    """The page with every marked table regenerated; an unknown table name is an error."""
    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise SystemExit(f"{source}: unknown table '{name}' (known: {sorted(TABLES)})")
        return m.group(1) + TABLES[name]() + m.group(4)
    return MARKER.sub(fill, text)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "pending" not in p.relative_to(DOCS).parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = ap.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        new = render(text, str(page))
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not args.check:
                page.write_text(new)
    if stale:
        print(("stale: " if args.check else "rewrote: ") + ", ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
