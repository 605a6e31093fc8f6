"""Red-team suite: generated adversarial inputs against the predictor and the confidence gate.

    protdp redteam --checkpoint CKPT --out DIR [--config configs/redteam.yaml] [--data DATA]

Every case carries its expected outcome: a clear rejection (with the reason text it must
show), or `needs_review` with the reason code that must fire, or a normalisation that must
give the same prediction as the clean control. All sequence cases go through ONE batch run,
so one bad target crashing the batch fails every case. Two more cases attack the checkpoint
(NaN weights; finite weights whose activations overflow into NaN outputs). Global checks:
nothing written outside the output folder, one summary row per FASTA record, no raw control
character in summary.tsv, every flagged prediction present in the review queue, nothing
accepted that a case expected to be flagged. Writes DIR/redteam_report.json; exit status 1
if any expectation is missed.

Cases are generated from real chains in the data corpus (`protdp.paths.data_root()`): the
2p90_A02 domain and its HHblits MSA is the control; shuffles, chimeras, mutated deep MSAs and
screening-list fragments are derived from real sequences with a seeded generator.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from protdp.data.parse import parse_msa
from protdp.data.residues import RESTYPES
from protdp.data.screening import read_fasta
from protdp.errors import InputError
from protdp.gating import load_gate_policy
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.inference.predictor import PredictConfig
from protdp.inference.writers import safe_name
from protdp.paths import data_root
from protdp.resources import config_file, resolve_config
from protdp.review.hygiene import escape_controls
from protdp.review.store import ReviewStore
from protdp.workflows import predict

DEFAULT_CONFIG = config_file("redteam.yaml")
FLAGGED = ("needs_review", "rejected")
CONTROL_MSA = "msa/2p90_A02.hhblits_subsample.a3m"
OTHER_MSA = "msa/2q2k_A.bfd_uniclust.a3m"
SHALLOW_MSA = "msa/7a4d_E.colabfold.a3m"


@dataclass
class RedTeamConfig:
    """Settings of the suite (configs/redteam.yaml maps 1:1 onto these fields)."""

    gating: str = "configs/gating.yaml"
    """Gate policy YAML (a path, or `configs/...` for the packaged one)."""
    gate_overrides: dict = field(default_factory=lambda: {"accept_mean_plddt": 0.0,
                                                          "max_very_low_fraction": 1.0})
    """GatePolicy fields replaced for the suite (pLDDT checks off: see configs/redteam.yaml)."""
    screening_list: str = "configs/screening/demo_list.fasta"
    """Sequences of concern; the screening cases are cut from its first entry."""
    max_msa_rows: int = 64
    """MSA depth cap given to the predictor."""
    huge_msa_depth: int = 20000
    """Rows of the generated huge MSA."""
    length_margin: int = 16
    """max_length = training crop + margin; the beyond-crop case has crop + margin // 2 residues."""
    seed: int = 0
    """Seed for shuffles, mutations and chimeras."""

    def __post_init__(self):
        if self.huge_msa_depth <= self.max_msa_rows:
            raise ValueError("huge_msa_depth must exceed max_msa_rows")
        if self.length_margin < 2:
            raise ValueError("length_margin must be >= 2")


@dataclass
class Case:
    name: str
    description: str
    target_id: str
    fasta: str                       # this record's raw FASTA text
    expect: dict
    msa: bytes | None = None         # written to msa_dir/<safe_name(target_id)>.a3m


def _record(tid: str, seq: str) -> str:
    return f">{tid}\n{seq}\n"


def _a3m(rows: list[str]) -> bytes:
    return "".join(f">r{i}\n{r}\n" for i, r in enumerate(rows)).encode()


def _mutated_msa(query: str, depth: int, rng: np.random.Generator, rate: float = 0.15) -> bytes:
    """query + (depth - 1) point-mutated copies (a3m; ~15 % of columns resampled per row, so
    rows are distinct with overwhelming probability and survive the parser's deduplication)."""
    q = np.frombuffer(query.encode(), np.uint8)
    alphabet = np.frombuffer(RESTYPES.encode(), np.uint8)
    rows = rng.choice(alphabet, size=(depth - 1, len(q)))
    keep = rng.random((depth - 1, len(q))) >= rate
    rows = np.where(keep, q[None], rows)
    return _a3m([query] + [r.tobytes().decode() for r in rows])


def _insert_row(a3m: bytes, row: str) -> bytes:
    """`row` as the MSA's second record (right after the query: within any depth cap)."""
    text = a3m.decode()
    cut = text.index("\n>", 1) + 1
    return (text[:cut] + f">inserted\n{row}\n" + text[cut:]).encode()


def length_limit(crop: int, cfg: RedTeamConfig) -> int:
    """--max-length of the suite's run: above the training crop and above every fixed-length
    case (the longest is 76 residues), so only the length cases test the limits."""
    return max(crop, 100) + cfg.length_margin


@dataclass
class _Materials:
    """Real sequences and MSAs the cases are cut from, and the expectations they share."""

    data: Path
    sandbox: Path
    crop: int
    cfg: RedTeamConfig
    rng: np.random.Generator
    ctrl: str                 # 45 aa, real domain (2p90_A02)
    other: str                # 70 aa, another real chain (2q2k_A)
    ctrl_msa: bytes
    shuffled: str
    rej: dict
    clean: dict
    review: dict
    safe_id: dict


def _case(name, desc, tid, seq=None, expect=None, msa=None, fasta=None) -> Case:
    return Case(name, desc, tid, fasta if fasta is not None else _record(tid, seq), expect, msa)


def _materials(data: Path, sandbox: Path, crop: int, cfg: RedTeamConfig) -> _Materials:
    rng = np.random.default_rng(cfg.seed)
    ctrl = parse_msa(data / CONTROL_MSA).query
    # a clean input is accepted; if the control is longer than the checkpoint's training crop,
    # the length flag (and nothing else) must fire
    clean = {"route": ["accepted"]} if len(ctrl) <= crop else {
        "route": ["needs_review"], "reasons": ["length_beyond_training_crop"],
        "only_reasons": ["length_beyond_training_crop"]}
    return _Materials(
        data, sandbox, crop, cfg, rng, ctrl, parse_msa(data / OTHER_MSA).query,
        (data / CONTROL_MSA).read_bytes(), "".join(rng.permutation(list(ctrl))),
        rej={"route": ["rejected"], "reasons": ["invalid_input"], "no_files": True}, clean=clean,
        review={"route": ["needs_review"]},
        safe_id={"route": ["needs_review", "accepted"], "id_preserved": True, "files": True})


def _sequence_cases(m: _Materials) -> list[Case]:
    """Malformed FASTA records and sequences."""
    ctrl, rej = m.ctrl, m.rej
    wrapped = "\n".join([ctrl[:10].lower() + "  " + ctrl[10:20], "\t" + ctrl[20:35] + "\r",
                         ctrl[35:]])
    return [
        _case("fasta_without_header", "sequence lines before the first '>'",
              "<no header, line 1>", fasta=ctrl + "\n",
              expect={**rej, "detail": "before the first '>' header"}),
        _case("control_real_chain", "real 2p90_A02 domain with its real HHblits MSA (clean)",
              "control", ctrl, {**m.clean, "files": True}, m.ctrl_msa),
        _case("lowercase_sequence", "the control in lower case", "lowercase", ctrl.lower(),
              {"same_as": "control_real_chain", "files": True}, m.ctrl_msa),
        _case("whitespace_in_sequence", "the control split over lines with spaces, a tab and CR",
              "whitespace", fasta=f">whitespace\n{wrapped}\n",
              expect={"same_as": "control_real_chain"}, msa=m.ctrl_msa),
        _case("empty_sequence", "header with no sequence", "empty", "",
              {**rej, "detail": "empty sequence"}),
        _case("non_amino_acid_characters", "digits, '*' and '?' in the sequence", "digits",
              ctrl[:10] + "4*?" + ctrl[10:], {**rej, "detail": "invalid character '4'"}),
        _case("gap_characters", "alignment gaps in a target sequence", "gaps",
              ctrl[:10] + "--" + ctrl[10:], {**rej, "detail": "invalid gap character '-'"}),
        _case("unicode_homoglyph_in_sequence", "Cyrillic А (U+0410) posing as alanine",
              "homoglyph", ctrl[:5] + "\u0410" + ctrl[6:], {**rej, "detail": "U+0410"}),
        _case("fullwidth_unicode_in_sequence", "full-width Ｍ (U+FF2D)", "fullwidth",
              "\uff2d" + ctrl[1:], {**rej, "detail": "U+FF2D"}),
        _case("control_characters_in_sequence", "ESC and NUL inside the sequence", "ctlseq",
              ctrl[:8] + "\x1b\x00" + ctrl[8:], {**rej, "detail": "U+001B"}),
        _case("all_x", "only unknown residues", "allx", "X" * 40, {**rej, "detail": "unknown"}),
        _case("non_standard_letters", "B/Z/J/U/O only", "bzjuo", "BZJUO" * 8,
              {**rej, "detail": "unknown"}),
    ]


def _id_cases(m: _Materials) -> list[Case]:
    """Hostile target ids: they must never escape OUT nor collide."""
    ctrl, safe_id = m.ctrl, m.safe_id
    return [
        _case("empty_header", "'>' with no id", "", fasta=f">\n{ctrl}\n",
              expect={**m.rej, "detail": "empty FASTA header"}),
        _case("duplicate_target_id", "a second record named 'control'", "control", m.shuffled,
              {**m.rej, "detail": "duplicate target id"}),
        _case("unicode_header", "non-ASCII id", "βλ-蛋白-é", ctrl, safe_id),
        _case("control_characters_in_header", "terminal escape + bell in the id",
              "\x1b[2J\x1b[31mred\x07", ctrl, safe_id),
        _case("path_traversal_relative", "id climbing out of OUT", "../../../redteam_escape", ctrl,
              safe_id),
        _case("path_absolute", "absolute path id inside the sandbox",
              str(m.sandbox / "abs_escape"), ctrl, safe_id),
        _case("path_dotdot", "id '..'", "..", ctrl, safe_id),
        _case("path_backslash", "Windows-style traversal", "..\\..\\win_escape", ctrl, safe_id),
        _case("path_separator", "id with '/'", "sub/dir", ctrl, safe_id),
        _case("file_name_collision", "id equal to the sanitised name of 'sub/dir'",
              safe_name("sub/dir"), ctrl, {**m.rej, "detail": "collides"}),
        _case("very_long_id", "4096-character id", "L" * 4096, ctrl, safe_id),
    ]


def _distribution_cases(m: _Materials) -> list[Case]:
    """Inputs outside the training distribution: lengths, low complexity, chimeras."""
    ctrl, review = m.ctrl, m.review
    limit = length_limit(m.crop, m.cfg)
    long_seq = (ctrl + m.other) * (limit // (len(ctrl) + len(m.other)) + 2)
    beyond, too_long = long_seq[:m.crop + m.cfg.length_margin // 2], long_seq[:limit + 1]
    chimera = ctrl[:25] + m.other[-30:]
    shallow = {**review, "reasons": ["shallow_msa"]}
    return [
        _case("beyond_max_length", f"{len(too_long)} residues > --max-length {limit}",
              "too_long", too_long, {**m.rej, "detail": "exceeds the configured limit"}),
        _case("beyond_training_crop", f"{len(beyond)} residues > training crop {m.crop}, deep MSA",
              "beyond_crop", beyond, {**review, "reasons": ["length_beyond_training_crop"]},
              _mutated_msa(beyond, 64, m.rng)),
        _case("homopolymer", "poly-Q, single sequence", "polyq", "Q" * 60, shallow),
        _case("low_complexity_repeat", "(GS)30 linker repeat, single sequence", "gsrepeat",
              "GS" * 30, shallow),
        _case("shuffled_real_sequence", "control residues shuffled, no MSA", "shuffled",
              m.shuffled, shallow),
        _case("shuffled_with_original_msa", "shuffled control given the control's MSA",
              "shuffled_msa", m.shuffled, {**m.rej, "detail": "does not match"}, m.ctrl_msa),
        _case("chimera_two_real_chains", "2p90_A02[:25] + 2q2k_A[-30:], no MSA", "chimera",
              chimera, shallow),
        _case("chimera_with_msa_of_one_part", "the chimera given 2p90's MSA", "chimera_msa",
              chimera, {**m.rej, "detail": "does not match"}, m.ctrl_msa),
    ]


def _msa_cases(m: _Materials) -> list[Case]:
    """Broken, extreme and mismatched MSAs."""
    ctrl, rej = m.ctrl, m.rej
    bad_rows = m.ctrl_msa.decode().split("\n")
    row = next(i for i, ln in enumerate(bad_rows) if ln and not ln.startswith(">") and i > 4)
    bad_rows[row] = bad_rows[row][:-1]                              # one aligned column short
    shallow = parse_msa(m.data / SHALLOW_MSA)
    return [
        _case("msa_query_differs", "control sequence with another chain's MSA", "wrong_msa", ctrl,
              {**rej, "detail": "does not match"}, (m.data / OTHER_MSA).read_bytes()),
        _case("msa_row_wrong_length", "one MSA row an aligned column short", "bad_row", ctrl,
              {**rej, "detail": "aligned columns but the query has"},
              "\n".join(bad_rows).encode()),
        _case("msa_empty_file", "empty .a3m", "empty_msa", ctrl, {**rej, "detail": "empty"}, b""),
        _case("msa_binary_garbage", "non-UTF-8 bytes in the MSA file", "binary_msa", ctrl,
              {**rej, "detail": "not a text file"}, b">q\n\xff\xfe\x00\x81\n"),
        _case("msa_extreme_deletions", "real MSA plus a row with 5000 inserted residues per "
              "column gap (deletion features must stay finite)", "extreme_deletions", ctrl,
              {**m.clean, "files": True},
              _insert_row(m.ctrl_msa, "".join(a + "w" * 5000 for a in "WWW" + ctrl[3:]))),
        _case("huge_msa", f"{m.cfg.huge_msa_depth}-row MSA (depth cap {m.cfg.max_msa_rows} "
              "applies)", "huge_msa", ctrl, {**m.clean, "depth_cap": True},
              _mutated_msa(ctrl, m.cfg.huge_msa_depth, m.rng)),
        _case("shallow_real_msa", "real 7a4d_E chain with its MSA (the query twice: depth 1)",
              "shallow", shallow.query, {**m.review, "reasons": ["shallow_msa"]},
              (m.data / SHALLOW_MSA).read_bytes()),
    ]


def _screening_cases(m: _Materials) -> list[Case]:
    """Sequences of concern, plain, embedded and obfuscated."""
    concern = read_fasta(resolve_config(m.cfg.screening_list))[0][1]
    flagged = {**m.review, "reasons": ["screening"]}
    return [
        _case("screening_exact", "a listed sequence of concern, deep MSA", "concern", concern,
              flagged, _mutated_msa(concern, 64, m.rng)),
        _case("screening_embedded", "30 residues of a listed sequence inside a real chain",
              "concern_embedded", m.ctrl[:20] + concern[5:35] + m.ctrl[20:], flagged),
        _case("screening_obfuscated", "listed sequence in lower case, wrapped with spaces",
              "concern_obfuscated",
              " ".join(concern[i:i + 7].lower() for i in range(0, len(concern), 7)), flagged),
    ]


def build_cases(data: Path, sandbox: Path, crop: int, cfg: RedTeamConfig) -> list[Case]:
    """The adversarial cases, in FASTA order (the headerless record must come first)."""
    m = _materials(data, sandbox, crop, cfg)
    return (_sequence_cases(m) + _id_cases(m) + _distribution_cases(m) + _msa_cases(m)
            + _screening_cases(m))


# -- checking -------------------------------------------------------------------------------

def _check_files(row: dict) -> list[str]:
    """Structure files exist, parse in gemmi, and carry pLDDT as B-factors."""
    import gemmi

    problems = []
    paths = row.get("paths") or {}
    if "pdb" not in paths or "cif" not in paths:
        return ["no PDB/mmCIF written"]
    scores = json.loads(Path(paths["scores"]).read_text())
    for kind in ("pdb", "cif"):
        try:
            st = gemmi.read_structure(paths[kind])
            per_atom = [(i, a.b_iso) for i, r in enumerate(st[0][0]) for a in r]
        except Exception as exc:  # any parse failure is the finding
            problems.append(f"{kind} does not parse: {exc}")
            continue
        plddt = scores["plddt"]
        if len({i for i, _ in per_atom}) != len(plddt) or any(
                abs(b - plddt[i]) > 0.006 for i, b in per_atom):
            problems.append(f"{kind} B-factors differ from pLDDT")
    return problems


def check_case(case: Case, row: dict | None, rows_by_case: dict, max_msa_rows: int) -> list[str]:
    """Problems (empty list = the case met its expectation)."""
    if row is None:
        return ["no summary row for this record (the batch lost it)"]
    e, p = case.expect, []
    routes = e.get("route")
    if "same_as" in e:
        ref = rows_by_case.get(e["same_as"])
        routes = [ref["route"]] if ref else routes
        if ref is None or row.get("mean_plddt") is None or ref.get("mean_plddt") is None \
                or abs(row["mean_plddt"] - ref["mean_plddt"]) > 1e-6:
            p.append(f"prediction differs from {e['same_as']}")
    if routes and row["route"] not in routes:
        p.append(f"route {row['route']} not in {routes}")
    missing = [r for r in e.get("reasons", []) if r not in row["reasons"]]
    if missing:
        p.append(f"missing reason(s) {missing} (got {row['reasons']})")
    extra = [r for r in row["reasons"] if "only_reasons" in e and r not in e["only_reasons"]]
    if extra:
        p.append(f"unexpected reason(s) {extra}")
    if "detail" in e and e["detail"] not in (row.get("detail") or ""):
        p.append(f"detail lacks {e['detail']!r}: {row.get('detail')!r}")
    if e.get("no_files") and (row.get("paths") or {}):
        p.append(f"files written for a rejected target: {sorted(row['paths'])}")
    if e.get("files") and row["route"] != "rejected":
        p += _check_files(row)
    if e.get("id_preserved"):
        name = row.get("file_name") or ""
        if not name or ".." in name or "/" in name or "\\" in name or len(name) > 64:
            p.append(f"unsafe file name {name!r}")
        elif "scores" in (row.get("paths") or {}):
            if json.loads(Path(row["paths"]["scores"]).read_text())["target"] != case.target_id:
                p.append("original id not kept in scores.json")
    if e.get("depth_cap"):
        s = json.loads(Path(row["paths"]["scores"]).read_text()) if row.get("paths") else {}
        if not (s.get("msa_rows_used") == max_msa_rows < (s.get("msa_depth") or 0)):
            p.append(f"depth cap not applied: used {s.get('msa_rows_used')} of {s.get('msa_depth')}")
    if row["route"] == "accepted" and "accepted" not in (routes or []):
        p.insert(0, "ACCEPTED although the case must be flagged")
    return p


def _tree(root: Path, skip: Path) -> set[Path]:
    return {q for q in root.rglob("*") if q != skip and skip not in q.parents}


def _files_outside(sandbox: Path, allowed: list[Path]) -> list[str]:
    return sorted(str(q) for q in sandbox.rglob("*")
                  if not any(q == a or a in q.parents for a in allowed))


# -- checkpoint attacks ---------------------------------------------------------------------

def checkpoint_cases(loaded, work: Path, fasta_text: str, msa_dir: Path, cfg: PredictConfig,
                     policy) -> list[dict]:
    results = []
    model = loaded.model
    state = {k: v.clone() for k, v in model.state_dict().items()}

    # 1. NaN weights (a diverged run saved): the loader must refuse with a clear error
    name = next(n for n, v in state.items() if v.is_floating_point())
    with torch.no_grad():
        model.state_dict()[name].view(-1)[0] = float("nan")
    nan_path = save_model_checkpoint(model, loaded.config, work / "nan_weights.pt",
                                     training_crop=loaded.training_crop)
    model.load_state_dict(state)
    try:
        load_model_checkpoint(nan_path)
        problems = ["checkpoint with NaN weights was loaded without error"]
        observed = "loaded"
    except InputError as exc:
        observed = str(exc)
        problems = [] if "non-finite" in observed and name in observed else [f"unclear error: {exc}"]
    results.append({"name": "checkpoint_nan_weights", "description":
                    "a checkpoint with a NaN weight is refused with a clear error",
                    "expected": {"load_error": "non-finite ... " + name}, "observed": observed,
                    "problems": problems})

    # 2. weights beyond MAX_WEIGHT_MAGNITUDE (x1e20, which overflow every forward pass): the
    #    loader refuses the file in one line; a model that overflows at run time (in memory
    #    here) must never have its NaN outputs accepted or written
    with torch.no_grad():
        for n, prm in model.named_parameters():
            if n.startswith("input_embedder"):
                prm.mul_(1e20)
    ovf_path = save_model_checkpoint(model, loaded.config, work / "overflow.pt",
                                     training_crop=loaded.training_crop)
    model.load_state_dict(state)
    try:
        load_model_checkpoint(ovf_path)
        observed, problems = "loaded", ["checkpoint with |w| = 1e20 weights was loaded"]
    except InputError as exc:
        observed = str(exc)
        problems = [] if "MAX_WEIGHT_MAGNITUDE" in observed else [f"unclear error: {exc}"]
    results.append({"name": "checkpoint_huge_weights", "description":
                    "a checkpoint with weights beyond MAX_WEIGHT_MAGNITUDE is refused",
                    "expected": {"load_error": "... MAX_WEIGHT_MAGNITUDE"}, "observed": observed,
                    "problems": problems})
    fasta = work / "overflow.fasta"
    fasta.write_text(fasta_text)
    results.append(in_memory_overflow(loaded, fasta, work / "overflow_out", msa_dir, cfg, policy))
    return results


def in_memory_overflow(loaded, fasta: Path, out: Path, msa_dir: Path, cfg: PredictConfig,
                       policy) -> dict:
    """`overflow_case_result` of `loaded` with its input embedder x1e20 in memory (a file with
    such weights is refused by the loader), the weights restored afterwards."""
    model = loaded.model
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def run_batch():
        with torch.no_grad():
            for n, prm in model.named_parameters():
                if n.startswith("input_embedder"):
                    prm.mul_(1e20)
        return predict(loaded, fasta, out, msa_dir=msa_dir, config=cfg, gating=policy,
                       progress=False, device=next(model.parameters()).device,
                       release_gate="off")

    try:
        return overflow_case_result(run_batch)
    finally:
        model.load_state_dict(state)


def overflow_case_result(run_batch) -> dict:
    """The overflow case's verdict (monomer and complex suites): `run_batch()` predicts with
    weights whose activations overflow; every row must go to review as invalid_plddt with no
    structure file, and the batch must not crash."""
    problems, observed = [], []
    try:
        observed = [{"target": r["target"], "route": r["route"], "reasons": r["reasons"],
                     "files": sorted(r.get("paths") or {})} for r in run_batch().rows]
        for r in observed:
            if r["route"] != "needs_review" or "invalid_plddt" not in r["reasons"]:
                problems.append(f"{r['target']}: {r['route']} {r['reasons']}")
            if {"pdb", "cif"} & set(r["files"]):
                problems.append(f"{r['target']}: structure with non-finite coordinates written")
    except Exception:
        problems.append("batch crashed: " + traceback.format_exc(limit=3))
    return {"name": "nan_producing_overflow_weights", "description":
            "finite weights x1e20 in the input embedder overflow to NaN outputs",
            "expected": {"route": ["needs_review"], "reasons": ["invalid_plddt"],
                         "no_structure_files": True},
            "observed": observed, "problems": problems}


# -- the suite ------------------------------------------------------------------------------

def _case_report(case: Case, row: dict | None, by_case: dict, crashed: str | None,
                 crop: int | None, cfg: RedTeamConfig) -> dict:
    problems = check_case(case, row, by_case, cfg.max_msa_rows)
    if crashed:
        problems = ["batch crashed"] + problems
    if crop is None and case.name == "beyond_training_crop":
        problems.append("the checkpoint records no training crop: the gate cannot flag "
                        "out-of-distribution lengths")
    return {"name": case.name, "description": case.description, "target_id": case.target_id,
            "expected": case.expect,
            "observed": None if row is None else {k: row.get(k) for k in (
                "route", "reasons", "detail", "mean_plddt", "msa_depth", "status", "file_name")},
            "passed": not problems, "problems": problems}


def _global_checks(n_cases: int, rows: list[dict], crashed: str | None, escaped: list[str],
                   pred_out: Path, queue_url: str | None) -> list[dict]:
    """Whole-batch properties: it completed, wrote only inside OUT, kept its TSV clean and
    queued every flagged prediction."""
    by_index = {r["index"] for r in rows}
    tsv = (pred_out / "summary.tsv").read_text() if (pred_out / "summary.tsv").is_file() else ""
    # the queue stores names with control characters escaped (protdp.review.hygiene)
    flagged = {escape_controls(r["target"]) for r in rows if r["route"] == "needs_review"}
    queued = set()
    if rows and queue_url:
        store = ReviewStore(queue_url)
        queued = {i["target"] for i in store.list(state=None, limit=10_000)}
        store.close()
    checks = {
        "batch_completed": [crashed] if crashed else (
            [] if sorted(by_index) == list(range(n_cases))
            else [f"{len(by_index)} summary rows for {n_cases} FASTA records"]),
        "no_writes_outside_out": escaped,
        "summary_tsv_has_no_control_characters":
            sorted({f"U+{ord(ch):04X}" for ch in tsv if ord(ch) < 32 and ch not in "\t\n"})
            + ([] if tsv else ["summary.tsv missing"]),
        "every_flagged_prediction_is_queued_for_review":
            [f"not queued: {t!r}" for t in sorted(flagged - queued)],
    }
    return [{"name": k, "passed": not v, "problems": v} for k, v in checks.items()]


def _write_inputs(cases: list[Case], fasta: Path, msa_dir: Path) -> None:
    for case in cases:
        if case.msa is not None:
            (msa_dir / f"{safe_name(case.target_id)}.a3m").write_bytes(case.msa)
    fasta.write_bytes("".join(case.fasta for case in cases).encode("utf-8"))


def finish_report(report: dict, out_dir: Path) -> dict:
    """Counts and the overall verdict added; written to OUT/redteam_report.json."""
    report["passed"] = sum(c["passed"] for c in report["cases"])
    report["failed"] = len(report["cases"]) - report["passed"]
    report["ok"] = report["failed"] == 0 and all(g["passed"] for g in report["global_checks"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "redteam_report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def predict_cases(loaded, cases, fasta: Path, msa_dir: Path, pred_out: Path, pcfg, policy,
                  cfg: RedTeamConfig, device, write_inputs=None):
    """Every case in one batch (a crash is recorded, not raised): (rows, crash traceback or
    None, queue url, rows by input index, rows by case name). `write_inputs(cases, fasta,
    msa_dir)` lays out the inputs (default: one MSA file per target)."""
    (write_inputs or _write_inputs)(cases, fasta, msa_dir)
    rows, crashed, queue_url = [], None, None
    try:
        result = predict(loaded, fasta, pred_out, msa_dir=msa_dir, config=pcfg, gating=policy,
                         screening=resolve_config(cfg.screening_list), progress=False,
                         device=device, release_gate="off")   # the suite is part of the release
        rows, queue_url = result.rows, result.queue_url
    except Exception:
        crashed = traceback.format_exc(limit=5)
    by_index = {r["index"]: r for r in rows}
    by_case = {case.name: by_index.get(i) for i, case in enumerate(cases)}
    return rows, crashed, queue_url, by_index, by_case


def prepare_sandbox(out_dir: str | Path, data: str | Path | None):
    """The suite's data corpus (checked) and a fresh OUT/sandbox with inputs/msa, out and work;
    returns (data, out_dir, sandbox, inputs, pred_out, work, msa_dir, the tree of OUT before)."""
    data = Path(data) if data else data_root()
    if not (data / CONTROL_MSA).is_file():
        raise InputError(f"real data corpus not found (need {CONTROL_MSA}); set --data or "
                         "PROTDP_DATA", path=data)
    out_dir = Path(out_dir).resolve()
    sandbox = out_dir / "sandbox"
    shutil.rmtree(sandbox, ignore_errors=True)
    inputs, pred_out, work = sandbox / "inputs", sandbox / "out", sandbox / "work"
    msa_dir = inputs / "msa"
    for d in (msa_dir, work):
        d.mkdir(parents=True)
    before = _tree(out_dir, sandbox)     # "../../../x" from OUT/targets lands in DIR itself
    return data, out_dir, sandbox, inputs, pred_out, work, msa_dir, before


def run_suite(checkpoint: str | Path, out_dir: str | Path, config: RedTeamConfig | None = None,
              data: str | Path | None = None, device: str | None = None) -> dict:
    """Run every case; returns the report (also written to OUT/redteam_report.json)."""
    cfg = config or RedTeamConfig()
    data, out_dir, sandbox, inputs, pred_out, work, msa_dir, before = prepare_sandbox(out_dir, data)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_model_checkpoint(checkpoint, device=device)
    crop = loaded.training_crop
    pcfg = PredictConfig(max_length=length_limit(crop or 256, cfg), max_msa_rows=cfg.max_msa_rows)
    policy = dataclasses.replace(load_gate_policy(resolve_config(cfg.gating)),
                                 **cfg.gate_overrides)
    cases = build_cases(data, sandbox, crop or 256, cfg)
    fasta = inputs / "targets.fasta"
    rows, crashed, queue_url, by_index, by_case = predict_cases(
        loaded, cases, fasta, msa_dir, pred_out, pcfg, policy, cfg, device)
    report = {"checkpoint": loaded.describe(), "policy": dataclasses.asdict(policy),
              "predict_config": dataclasses.asdict(pcfg), "config": dataclasses.asdict(cfg),
              "cases": [_case_report(case, by_index.get(i), by_case, crashed, crop, cfg)
                        for i, case in enumerate(cases)]}
    ctrl_fasta = "".join(c.fasta for c in cases if c.name in ("control_real_chain", "homopolymer"))
    for res in checkpoint_cases(loaded, work, ctrl_fasta, msa_dir, pcfg, policy):
        report["cases"].append({**res, "passed": not res["problems"]})
    escaped = _files_outside(sandbox, [inputs, pred_out, work]) + sorted(
        str(q) for q in _tree(out_dir, sandbox) - before if q.name != "redteam_report.json")
    report["global_checks"] = _global_checks(len(cases), rows, crashed, escaped, pred_out,
                                             queue_url)
    return finish_report(report, out_dir)
