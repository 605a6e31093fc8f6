"""bf16 autocast against fp32 (issue 29 D3) on DeepMind's AF2 reference fixture and on a
training step (benchmarks/bf16_reference.py computes the figures; results are committed in
benchmarks/results/bf16_reference.json).

Tolerances: OpenFold's bf16 Evoformer-block tolerance (mean |diff| of LayerNorm-ed outputs
< 4e-2) is met by the whole trunk's pair and MSA outputs, both bf16 against fp32 and, OpenFold's
own question, protdp's fused attention against its explicit attention with both in bf16
(`test_bf16_kernels_*`). OpenFold's full-model tolerance (final positions max |diff| < 0.5 Å,
kernel against kernel in bf16, on AlphaFold's trained weights) is met on trained weights
(tests/test_model_overfit.py: 0.11 Å and 0.095 Å) and NOT on this random-weight model, by
either question: bf16 against fp32 measures 1.0-1.4 Å max, 0.33-0.54 Å Cα RMS,
lDDT-Cα 0.95-0.98, and kernel against kernel in bf16 1.17 Å max on 2p90 (the random structure
module amplifies any rounding alike); the bounds below are set just above those measurements,
so a change that makes bf16 worse fails."""

import sys
from pathlib import Path

import pytest
import torch

from model_fixtures import AF2_CASES, af2_reference, one_thread  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bf16_reference import (OPENFOLD_TOLERANCES, compare_case, compare_kernels_bf16,  # noqa: E402
                            import_fixture, training_step)


@pytest.fixture(scope="module")
def imported_model(af2_reference, tmp_path_factory):  # noqa: F811
    return import_fixture(af2_reference, tmp_path_factory.mktemp("bf16") / "ckpt")


@pytest.mark.parametrize("case", AF2_CASES)
def test_bf16_trunk_against_fp32_on_af2_fixture(imported_model, af2_reference, case):  # noqa: F811
    r = compare_case(imported_model, af2_reference, case)
    print(case, r)
    assert imported_model.config.bf16 is False                   # restored after the run
    assert r["positions_max_abs_A"] > 1e-3                       # bf16 really ran
    assert r["pair_layernormed_mean_abs"] < 4e-2 and r["msa_layernormed_mean_abs"] < 4e-2
    assert r["positions_max_abs_A"] < 2.0 and r["ca_rms_A"] < 0.75
    assert r["lddt_ca_bf16_vs_fp32"] > 0.93 and r["plddt_max_abs"] < 0.5


def test_bf16_kernels_against_explicit_attention(imported_model, af2_reference):  # noqa: F811
    """OpenFold's question, asked of protdp: fused and recompute attention against explicit,
    all under bf16 autocast, on the longest fixture case: OpenFold's block tolerance, and the
    positions bound of bf16 against fp32 above."""
    res = compare_kernels_bf16(imported_model, af2_reference, "2p90_A02")
    print(res)
    from protdp.model.primitives import Attention
    assert imported_model.config.bf16 is False                      # restored after the run
    assert {m.backend for m in imported_model.modules() if isinstance(m, Attention)} == {"auto"}
    for backend, r in res.items():
        assert 1e-3 < r["positions_max_abs_A"] < 2.0, backend            # the kernels differ
        assert r["pair_layernormed_mean_abs"] < OPENFOLD_TOLERANCES["block_layernormed_mean_abs_bf16"]
        assert r["msa_layernormed_mean_abs"] < OPENFOLD_TOLERANCES["block_layernormed_mean_abs_bf16"]


def test_bf16_training_step_matches_fp32():
    r = training_step()
    assert r["grads_finite"]
    assert r["loss_rel_diff"] < 1e-2                              # stated tolerance: 1 %
    assert r["grad_cosine"] > 0.999 and r["grad_norm_rel_diff"] < 1e-2
