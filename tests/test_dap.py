"""Dynamic axial parallelism (issue 33): layout math without a process group, and spawned gloo
ranks comparing DAP against one process (tests/dap_workers.py records, the asserts live here)."""

from __future__ import annotations

import pytest

import dap_workers as dw
from protdp.errors import ConfigError
from protdp.parallel.dap_layout import (all_group_ranks, block_comm_bytes, group_layout,
                                        padded_size, shard_range)

FP64 = 1e-9
# fp64 model, but primitives.Attention computes logits/softmax in fp32: gradients through the
# pair biases carry fp32 round-off (~1e-7 relative); the split-only backward is off by O(1)
FP64_GRADS = 1e-6


def test_padding_and_shards():
    assert [padded_size(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 4, 4, 8, 8]
    assert [shard_range(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ConfigError):
        shard_range(7, 2, 0)


def test_group_layout_world_is_dp_times_dap():
    dap_groups, dp_groups = all_group_ranks(8, 4)
    assert dap_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dp_groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    lay = group_layout(8, 4, 6)
    assert (lay.dap_rank, lay.dp_rank, lay.dap_ranks, lay.dp_ranks) == (2, 1, (4, 5, 6, 7), (2, 6))
    with pytest.raises(ConfigError, match="multiple"):
        group_layout(6, 4, 0)


def test_block_comm_bytes_formula():
    b = block_comm_bytes(n_seq=128, n_res=256, k=4, c_m=256, c_z=128, msa_heads=8, pair_heads=4,
                         c_hidden_tri_mul=128, c_hidden_opm=32)
    assert b["pair_all_to_all"] == 4 * 3 * 256 * 256 * 128 * 4 // 16
    assert b["total"] == sum(v for k, v in b.items() if k != "total")
    assert block_comm_bytes(n_seq=1, n_res=1, k=1, c_m=1, c_z=1, msa_heads=1, pair_heads=1,
                            c_hidden_tri_mul=1, c_hidden_opm=1) == {}


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("dap")
    return dw.spawn([("collectives", {"dap": 2}), ("numerics", {"dap": 2}),
                     ("numerics", {"dap": 2, "backend": "explicit"}),
                     ("training", {"dap": 2}), ("training", {"dap": 1}),
                     ("reload", {"dap": 1}), ("inference", {"dap": 2})], 2, out)   # inference ends the group: last


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    """dp=1 x dap=4 numerics and training, dp=2 x dap=2 training on 4 ranks (one spawn)."""
    out = tmp_path_factory.mktemp("dap4")
    return dw.spawn([("numerics", {"dap": 4}), ("training", {"dap": 2}), ("training", {"dap": 4})],
                    4, out)


def _ok(results):
    for rank, res in enumerate(results):
        assert "error" not in res, f"rank {rank}: {res['error']}"
    return results


def test_collective_backwards_match_analytic(world2):
    for res in _ok(world2["collectives_2"]):
        for key in ("gather_fwd", "gather_bwd", "gather_replicated_bwd", "scatter_fwd",
                    "scatter_bwd", "a2a_fwd", "a2a_bwd"):
            assert res[key] <= 1e-12, (key, res[key])
        assert res["gather_bwd_split_only_would_be"] > 0.1   # the analytic check can fail


@pytest.mark.parametrize("world,dap,backend", [(2, 2, ""), (4, 4, ""), (2, 2, "_explicit")])
def test_dap_equals_one_process_fp64_and_split_only_backward_fails(world2, world4, world, dap, backend):
    """Default attention (on CPU "recompute" for a bias with a gradient: its bias gradient once
    raised on a rank whose MSA shard has no batch axis, leaving its DAP peer waiting in a
    collective), and the "explicit" reference backend."""
    for res in _ok({2: world2, 4: world4}[world][f"numerics_{dap}{backend}"])[:1]:   # rank 0 compares
        assert res["grad_names"]
        assert res["outputs"] <= FP64 * max(1.0, res["outputs_scale"]), res["outputs"]
        assert res["grads_rel"] <= FP64_GRADS, (res["grads_rel"], res["worst"])
        assert res["split_only_grads_rel"] > 1e-2, res["split_only_grads_rel"]


@pytest.mark.parametrize("world,dap", [(2, 2), (2, 1), (4, 2), (4, 4)])  # 1x2, 2x1, 2x2, 1x4
def test_training_steps_dp_x_dap_equal_one_process(world2, world4, world, dap):
    """fp32, 3 AdamW steps with clipping; dp 2 also shards the optimizer (distributed optimizer)."""
    ranks = _ok({2: world2, 4: world4}[world][f"training_{dap}"])
    assert len({r["checksum"] for r in ranks}) == 1, [r["checksum"] for r in ranks]  # all agree
    for res in ranks[:1]:                      # rank 0 stepped the single-process reference
        assert res["moved"] > 1e-4              # the optimizer really changed the weights
        assert res["weights_rel"] <= 1e-5, res["weights_rel"]
        for ours, ref in res["norms"]:
            assert abs(ours - ref) <= 1e-4 * ref, res["norms"]


def test_checkpoint_of_dap2_loads_at_dp2(world2):
    """Saved at dp 1 x dap 2, loaded at dp 2 x dap 1 (distributed optimizer resharded)."""
    for res in _ok(world2["reload_1"]):
        assert res["weights_diff"] == 0.0 and res["stepped"]
        assert res["optimizer_steps"] == [dw.STEPS]


def test_predict_dap2_writes_what_one_rank_writes(world2):
    res = _ok(world2["inference_2"])[0]
    assert res["atoms"] > 100 and res["same"]
    assert res["max_coord_diff"] <= 2e-3, res["max_coord_diff"]
    assert res["max_plddt_diff"] <= 0.011, res["max_plddt_diff"]


def test_dap_size_flag_and_world_arithmetic():
    from protdp.train.args import parse_args

    args = parse_args(["--data", "x.h5", "--dap-size", "2", "--data-parallel-size", "2",
                       "--global-batch-size", "4"])
    assert args.check_world(4).data_parallel_size == 2
    with pytest.raises(ConfigError, match="--dap-size 2"):
        args.check_world(3)
    with pytest.raises(ConfigError, match="dap-size"):
        parse_args(["--data", "x.h5", "--tensor-model-parallel-size", "2"])


def test_plan_proposes_dap_when_batch_caps_dp_and_when_nothing_fits():
    from protdp.config import load_config
    from protdp.model.config import ModelConfig
    from protdp.paths import REPO_ROOT
    from protdp.planning import memory
    from protdp.planning.params import parameter_count
    from protdp.planning.plan import plan

    cfg = load_config(ModelConfig, REPO_ROOT / "configs/model/af2.yaml")
    r = plan(cfg, crop=256, gpu_mem=80 * 2**30, dp=128, gpus=1024, global_batch=128)
    cap = r["recommendation"]["batch_cap"]
    assert (cap["dp"], cap["dap_size"], cap["flag"]) == (128, 8, "--dap-size 8")
    assert plan(cfg, crop=256, gpu_mem=80 * 2**30, dp=64, gpus=64,
                global_batch=128)["recommendation"]["batch_cap"]["dap_size"] == 1
    act = memory.activation_bytes(cfg, memory.Shape(256, 128, 1024), True, bf16=True)["peak"]
    st = memory.state_bytes(parameter_count(cfg), 8, True, True)["total"]
    rec = plan(cfg, crop=256, gpu_mem=int(st + act / 3 + 1), dp=8, bf16=True,
               reserve=0.0)["recommendation"]
    assert rec["dap_degree"] == 3 and rec["dap"]["dap_size"] == 4       # a power of two >= 3
    assert rec["dap"]["bytes_per_rank"] <= st + act / 3 + 1
    assert rec["dap"]["comm_bytes_per_block"] == block_comm_bytes(
        n_seq=128, n_res=256, k=4, c_m=cfg.c_m, c_z=cfg.c_z, msa_heads=cfg.msa_heads,
        pair_heads=cfg.pair_heads, c_hidden_tri_mul=cfg.c_hidden_tri_mul,
        c_hidden_opm=cfg.c_hidden_opm)["total"]
