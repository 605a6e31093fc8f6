"""bf16 against fp32 (issue 29 D3) on DeepMind's AF2 reference fixture (random small
model_3_ptm, imported with `protdp weights import`) and on a training step.

OpenFold's tolerances for the same question (tests/test_deepspeed_evo_attention.py, their
fused kernel against stock attention, both under bf16 autocast): full-model final positions
max |diff| < 0.5 Å; one Evoformer block, outputs after LayerNorm, mean |diff| < 4e-2 (bf16) and
2e-2 (fp32); attention input/weight gradients max |diff| < 5e-4 (fp32, tests/config.py eps).
`cases` asks a stricter question — bf16 against fp32, not kernel against kernel within bf16 —
on random weights, whose activations are not those of a trained model; `kernels_vs_explicit_bf16`
asks OpenFold's: protdp's fused ("auto": the CPU flash kernel) and "recompute" attention against
its explicit attention (which upcasts q, k, v to fp32), all under bf16 autocast. On these random
weights both questions give ~1 Å final positions: the untrained structure module amplifies any
rounding, so OpenFold's 0.5 Å (trained weights) is out of reach for either.

    PYTHONPATH=. python3 benchmarks/bf16_reference.py [--out benchmarks/results/bf16_reference.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from protdp.fileio import atomic_write_json  # noqa: E402
from protdp.metrics import lddt_ca  # noqa: E402

CASES = ("2p90_A02", "2jp1_A", "synthetic_L40")
OPENFOLD_TOLERANCES = {"model_positions_max_abs_A": 0.5, "block_layernormed_mean_abs_bf16": 4e-2,
                       "block_layernormed_mean_abs_fp32": 2e-2, "attention_grads_max_abs": 5e-4}


def _ln(t):
    return F.layer_norm(t.float(), t.shape[-1:])


def compare_case(model, root: Path, case: str) -> dict:
    """fp32 and bf16-autocast forward of the imported model on one fixture case."""
    from protdp.weights.compare import batch_from_features, read_npz

    path = root / f"features_{case}.npz"
    batch, passes = batch_from_features(read_npz(path), path)
    outs = {}
    for bf16 in (False, True):
        model.config.bf16 = bf16
        with torch.no_grad():
            outs[bf16] = model(batch, num_recycles=passes - 1)
    model.config.bf16 = False
    a, b = outs[False], outs[True]
    exists = a["final_atom_mask"] > 0
    dist = (a["final_atom_positions"] - b["final_atom_positions"]).norm(dim=-1)[exists]
    ca_a, ca_b = (o["final_atom_positions"][..., 1, :].numpy() for o in (a, b))
    return {"positions_max_abs_A": round(dist.max().item(), 4),
            "ca_rms_A": round(float(np.sqrt(((ca_a - ca_b) ** 2).sum(-1).mean())), 4),
            "lddt_ca_bf16_vs_fp32": round(lddt_ca(ca_b, ca_a), 4),
            "plddt_max_abs": round((a["plddt"] - b["plddt"]).abs().max().item(), 4),
            "pair_layernormed_mean_abs": round((_ln(a["pair"]) - _ln(b["pair"])).abs().mean().item(), 5),
            "msa_layernormed_mean_abs": round((_ln(a["msa"]) - _ln(b["msa"])).abs().mean().item(), 5)}


def compare_kernels_bf16(model, root: Path, case: str,
                         backends: tuple[str, ...] = ("auto", "recompute")) -> dict:
    """OpenFold's own question (a fused kernel against the stock attention, both under bf16
    autocast): final positions max |diff| and LayerNorm-ed pair / MSA mean |diff| of each
    backend in `backends` against the "explicit" backend, all under bf16 autocast."""
    from protdp.model.primitives import set_attention_backend
    from protdp.weights.compare import batch_from_features, read_npz

    path = root / f"features_{case}.npz"
    batch, passes = batch_from_features(read_npz(path), path)
    before = model.config.attention_backend
    outs = {}
    model.config.bf16 = True
    try:
        for backend in ("explicit",) + tuple(backends):
            set_attention_backend(model, backend)
            with torch.no_grad():
                outs[backend] = model(batch, num_recycles=passes - 1)
    finally:
        model.config.bf16 = False
        set_attention_backend(model, before)
    ref = outs["explicit"]
    exists = ref["final_atom_mask"] > 0
    res = {}
    for backend in backends:
        got = outs[backend]
        dist = (got["final_atom_positions"] - ref["final_atom_positions"]).norm(dim=-1)[exists]
        res[backend] = {
            "positions_max_abs_A": round(dist.max().item(), 4),
            "pair_layernormed_mean_abs": round((_ln(got["pair"]) - _ln(ref["pair"])).abs().mean().item(), 5),
            "msa_layernormed_mean_abs": round((_ln(got["msa"]) - _ln(ref["msa"])).abs().mean().item(), 5)}
    return res


def training_step(config: str = "tiny", L: int = 24, N: int = 8) -> dict:
    """One loss + backward of the same model and batch in fp32 and under bf16 autocast."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_model import make_batch, model_config

    from protdp.model import build_model
    from protdp.model.losses import compute_loss

    res = {}
    grads = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        model = build_model(model_config(config == "tiny", bf16=bf16), verbose=False).train()
        for p in model.parameters():        # non-zero final layers: every branch contributes
            if p.abs().sum() == 0:
                torch.nn.init.normal_(p, std=0.02)
        batch = make_batch(L, N, 4, "cpu")
        loss, _ = compute_loss(model(batch, num_recycles=0), batch, model.config)
        loss.backward()
        grads[bf16] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        res["fp32_loss" if not bf16 else "bf16_loss"] = loss.item()
    res["loss_rel_diff"] = abs(res["bf16_loss"] - res["fp32_loss"]) / abs(res["fp32_loss"])
    res["grads_finite"] = bool(torch.isfinite(grads[True]).all())
    res["grad_cosine"] = F.cosine_similarity(grads[True], grads[False], dim=0).item()
    res["grad_norm_rel_diff"] = abs(grads[True].norm() / grads[False].norm() - 1).item()
    return res


def import_fixture(root: Path, out: Path):
    from protdp.inference.checkpoint import load_model_checkpoint
    from protdp.weights import cli as weights_cli

    rc = weights_cli.main(["import", "--format", "alphafold",
                           str(root / "params" / "params_model_3_ptm_small.npz"), "--out", str(out),
                           "--alphafold-config", str(root / "config_model_3_ptm_small.json")])
    assert rc == 0
    return load_model_checkpoint(out).model.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bf16_reference.json"))
    ap.add_argument("--fixture", default=os.environ.get("PROTDP_AF2_REFERENCE",
                                                        str(ROOT.parent / "shared" / "af2_reference")))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = import_fixture(Path(args.fixture), Path(tmp) / "ckpt")
        cases = {case: compare_case(model, Path(args.fixture), case) for case in CASES}
        kernels = {case: compare_kernels_bf16(model, Path(args.fixture), case) for case in CASES}
    result = {"openfold_tolerances": OPENFOLD_TOLERANCES, "cases": cases,
              "kernels_vs_explicit_bf16": kernels,
              "training_step_tiny": training_step(), "torch": torch.__version__,
              "attention_backend": model.config.attention_backend}
    atomic_write_json(args.out, result, allow_nan=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
