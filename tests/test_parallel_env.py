"""Launcher environments and ParallelConfig validation (no process group), and how a launched
process leaves (leave_process, in fresh interpreters)."""

from __future__ import annotations

import re

import pytest

from protdp.errors import ConfigError
from protdp.parallel.config import ParallelConfig, default_bucket_size
from protdp.parallel import collectives as coll
from protdp.parallel.env import default_backend, detect_launch_env, first_slurm_host


def test_torchrun_env():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"}
    le = detect_launch_env(env)
    assert (le.rank, le.world_size, le.local_rank, le.local_world_size, le.master_addr,
            le.master_port, le.launcher) == (3, 8, 1, 2, "10.0.0.5", 1234, "torchrun")


def test_openmpi_env():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    le = detect_launch_env(env)
    assert (le.rank, le.world_size, le.local_rank, le.master_addr, le.launcher) == (
        1, 2, 1, "127.0.0.1", "mpirun")
    with pytest.raises(ConfigError, match="MASTER_ADDR"):  # multi-node mpirun needs it
        detect_launch_env({**env, "OMPI_COMM_WORLD_SIZE": "4"})


def test_slurm_env():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_NODELIST": "gpu[007-010,12]",
           "SLURM_JOB_ID": "123456"}
    le = detect_launch_env(env)
    assert (le.rank, le.world_size, le.local_rank, le.local_world_size, le.master_addr,
            le.master_port, le.launcher) == (5, 8, 1, 2, "gpu007", 29500 + 456, "slurm")


def test_no_launcher_is_world_of_one():
    le = detect_launch_env({})
    assert (le.rank, le.world_size, le.launcher) == (0, 1, "none")


def test_bad_env_values():
    with pytest.raises(ConfigError, match="RANK"):
        detect_launch_env({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="outside world size"):
        detect_launch_env({"RANK": "2", "WORLD_SIZE": "2"})


def test_first_slurm_host():
    assert first_slurm_host("node1,node2") == "node1"
    assert first_slurm_host("cn[0012-0015]") == "cn0012"


def test_config_batch_arithmetic():
    cfg = ParallelConfig(data_parallel_size=4, micro_batch_size=2, global_batch_size=64)
    assert cfg.num_micro_batches == 8
    assert ParallelConfig(data_parallel_size=2, micro_batch_size=3).global_batch_size == 6
    assert cfg.resolved_bucket_size == default_bucket_size(4) == 40_000_000
    assert default_bucket_size(64) == 64_000_000
    with pytest.raises(ConfigError, match=r"multiple of micro_batch_size × data_parallel_size"):
        ParallelConfig(data_parallel_size=4, micro_batch_size=2, global_batch_size=20)


def test_config_rejects_model_parallelism_with_advice():
    with pytest.raises(ConfigError, match="tensor parallelism is not implemented.*data_parallel"):
        ParallelConfig(data_parallel_size=1, tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match="pipeline.*gradient accumulation"):
        ParallelConfig(data_parallel_size=1, pipeline_model_parallel_size=4)
    with pytest.raises(ConfigError, match="requires use_distributed_optimizer"):
        ParallelConfig(data_parallel_size=1, overlap_param_gather=True)
    with pytest.raises(ConfigError, match="grad_reduce_collective"):
        ParallelConfig(data_parallel_size=1, grad_reduce_collective="allreduce")


def test_config_dp_from_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert ParallelConfig().data_parallel_size == 3


MPI_SCRIPT = """
import torch, torch.distributed as dist
from protdp.parallel import init_distributed
le = init_distributed(timeout=30)
t = torch.tensor([float(le.rank + 1)])
dist.all_reduce(t)
print(f"{le.launcher} rank {le.rank}/{le.world_size} local {le.local_rank} sum {t.item()}")
"""


def test_openmpi_launch_end_to_end():
    """mpirun sets only OMPI_COMM_WORLD_*: init_distributed must form the group from them."""
    import os
    import shutil
    import subprocess
    import sys

    from parallel_workers import free_port

    mpirun = shutil.which("mpirun")
    # .ci/run installs openmpi-bin; without it this test fails rather than hiding the launcher
    assert mpirun is not None, "mpirun not found: apt-get install openmpi-bin (see .ci/run)"
    env = {**os.environ, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    cmd = [mpirun, "--oversubscribe", "-np", "2", "-x", "MASTER_PORT", "-x", "PYTHONPATH",
           sys.executable, "-c", MPI_SCRIPT]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the two ranks share one stdout: their lines can interleave, so find the reports anywhere
    lines = sorted(re.findall(r"mpirun rank \d+/\d+ local \d+ sum [\d.]+?(?=mpirun|\s|$)",
                              proc.stdout))
    assert lines == ["mpirun rank 0/2 local 0 sum 3.0", "mpirun rank 1/2 local 1 sum 3.0"]


def test_cuda_machines_pair_nccl_with_gloo_for_cpu_tensors(monkeypatch):
    """NCCL alone rejects CPU tensors (metrics, object gathers): CUDA machines get both."""
    import torch
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend = default_backend()
    # torch's own parser must read it as one backend per device
    assert BackendConfig(Backend(backend)).get_device_backend_map() == {"cpu": "gloo",
                                                                         "cuda": "nccl"}
    assert coll.backend_for_device(backend, "cuda") == "nccl"
    assert coll.backend_for_device(backend, "cpu") == "gloo"
    assert coll.backend_for_device("gloo", "cpu") == "gloo"


def test_collectives_follow_the_backend_of_the_buffers_device():
    pair = "cpu:gloo,cuda:nccl"
    on_gpu, on_cpu = (coll.backend_for_device(pair, d) for d in ("cuda", "cpu"))
    assert coll.grad_reduce_collective("auto", on_gpu, True) == "reduce_scatter"
    assert coll.grad_reduce_collective("auto", on_gpu, False) == "all_reduce"
    assert coll.param_gather_collective("auto", on_gpu) == "all_gather"
    assert coll.grad_reduce_collective("auto", on_cpu, True) == "ring_reduce_scatter"
    assert coll.grad_reduce_collective("auto", on_cpu, False) == "ring_all_reduce"
    assert coll.param_gather_collective("auto", on_cpu) == "ring_all_gather"
    assert coll.grad_reduce_collective("all_reduce", on_cpu, True) == "all_reduce"  # explicit wins


def test_device_check_script_runs_its_checks(tmp_path):
    """benchmarks/gpu_check.py is what a lent GPU runs; here its checks run on CPU (world of 1)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_check.py"),
                           "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "gloo" and len(res["checks"]) >= 10
    assert all(res["checks"].values()), res["checks"]
    assert res["fp32_distopt"]["max_rel_norm_diff"] <= 1e-6
    assert res["nan_step"]["applied"].count(False) == 1


def test_leave_process_runs_exit_handlers_then_exits_with_the_status():
    """A process that joined a process group leaves through os._exit after its exit handlers
    (the group destroyed, output flushed) with the command's status; one that did not exits
    normally. Each run in a fresh interpreter, as a launched rank is."""
    import subprocess
    import sys

    from protdp.paths import REPO_ROOT

    script = ("import atexit, sys\n"
              "from protdp.parallel.env import init_distributed, leave_process\n"
              "import torch.distributed as dist\n"
              "if sys.argv[1] == 'group':\n"
              "    init_distributed(timeout=30)\n"
              "atexit.register(lambda: print('handler ran; group', dist.is_initialized()))\n"
              "print('done', end=' ')\n"
              "leave_process(3)\n")
    for mode in ("group", "plain"):
        proc = subprocess.run([sys.executable, "-c", script, mode], capture_output=True,
                              text=True, cwd=REPO_ROOT, timeout=120)
        assert proc.returncode == 3, (mode, proc.stderr[-2000:])
        # the handler registered last runs first, before the group is destroyed
        assert proc.stdout == f"done handler ran; group {mode == 'group'}\n", (mode, proc.stdout)
