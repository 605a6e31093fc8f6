"""Template search and template embedding cost (issue 31), side by side with their peers.

1. Search: protdp's pyhmmer hmmsearch route vs HMMER's `hmmbuild --hand` + `hmmsearch` binaries
   (AF2's flags, --cpu 1 / one pyhmmer thread) for the AF2 template fixture's three query MSAs,
   against the fixture's pdb_seqres.txt enlarged with shuffled decoys (same composition and
   length, names `<pdb>_<chain>` like the real ones). Rows of both are compared.
2. Model: one forward pass of the fixture's template model (model_1_ptm-shaped, small) with the
   fixture's 4 templates vs AlphaFold's no-template placeholder, float32, one thread.
Results: benchmarks/results/templates.json.

    .venv/bin/python benchmarks/templates.py [--decoys 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from protdp.paths import data_root  # noqa: E402
from protdp.templates.hits import stockholm_rows  # noqa: E402
from protdp.templates.run import a3m_to_search_stockholm  # noqa: E402
from protdp.templates.search import HMMSEARCH_OPTIONS, read_database, search_templates  # noqa: E402

FIXTURE = data_root().parent / "af2_reference" / "templates"
CASES = ("4hhb_A_1-64", "4hhb_B_1-61", "2q2k_A")


def _database(path: Path, decoys: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    text = (FIXTURE / "raw_inputs" / "pdb_seqres.txt").read_text()
    seqs = [s.split("\n", 1)[1].replace("\n", "") for s in text.split(">")[1:]]
    out = [text.rstrip("\n")]
    for i in range(decoys):
        s = list(rng.choice(seqs))
        rng.shuffle(s)
        out.append(f">{i // 26:03d}{chr(97 + i % 26)}_A mol:protein length:{len(s)}  DECOY\n{''.join(s)}")
    path.write_text("\n".join(out) + "\n")


def _binary(msa: Path, db: Path, tmp: Path) -> str:
    flags = [x for k, v in HMMSEARCH_OPTIONS.items() for x in ((f"--{k}" if len(k) > 1 else f"-{k}"), str(v))]
    subprocess.run(["hmmbuild", "--hand", "--amino", str(tmp / "q.hmm"), str(msa)], check=True,
                   capture_output=True)
    subprocess.run(["hmmsearch", "--noali", "--cpu", "1", *flags, "-A", str(tmp / "o.sto"),
                    str(tmp / "q.hmm"), str(db)], check=True, capture_output=True)
    return (tmp / "o.sto").read_text()


def bench_search(decoys: int, repeats: int) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        db = tmp / "pdb_seqres.txt"
        _database(db, decoys)
        block = read_database(db)
        for case in CASES:
            msa = tmp / f"{case}.sto"
            msa.write_text(a3m_to_search_stockholm((FIXTURE / "raw_inputs" / f"{case}.a3m").read_text()))
            times = {"protdp_pyhmmer": [], "hmmsearch_binary": []}
            for _ in range(repeats):
                t0 = time.perf_counter()
                ours = search_templates(msa, block)
                times["protdp_pyhmmer"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                theirs = _binary(msa, db, tmp)
                times["hmmsearch_binary"].append(time.perf_counter() - t0)
            best = {k: min(v) for k, v in times.items()}
            out[case] = {"seconds": best, "ratio_protdp_over_binary":
                         best["protdp_pyhmmer"] / best["hmmsearch_binary"],
                         "same_rows": stockholm_rows(ours) == stockholm_rows(theirs),
                         "hits": len(stockholm_rows(ours))}
    return out


def bench_model(repeats: int) -> dict:
    from protdp.weights.compare import batch_from_features
    from protdp.weights.convert import import_params
    model = import_params(FIXTURE / "params" / "params_model_1_ptm_templates_small.npz", "alphafold",
                          sm_layers=2, num_recycles=1).model.eval()
    feats = dict(np.load(FIXTURE / "features_4hhb_A_1-64.npz"))
    batch, _ = batch_from_features(feats, FIXTURE)
    plain = {k: v for k, v in batch.items() if not k.startswith("template_")}
    res = {}
    for name, b in (("with_4_templates", batch), ("placeholder", plain)):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.no_grad():
                model(b, num_recycles=1)
            ts.append(time.perf_counter() - t0)
        res[name] = min(ts)
    res["ratio_templates_over_placeholder"] = res["with_4_templates"] / res["placeholder"]
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decoys", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    result = {"search": bench_search(args.decoys, args.repeats), "model_forward_s": bench_model(args.repeats),
              "decoys": args.decoys, "repeats": args.repeats, "host": platform.node(),
              "cpu": platform.processor(), "note": "shared 2-core machine; best of repeats"}
    out = ROOT / "benchmarks" / "results" / "templates.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
