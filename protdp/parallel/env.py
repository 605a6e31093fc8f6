"""Launch environment: who am I (rank / world / local rank) and the process-group init.

Megatron concept: `initialize_megatron` → `torch.distributed.init_process_group` from the
launcher's environment. Three launchers are understood, in this order of precedence:
torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR/PORT`), OpenMPI `mpirun`
(`OMPI_COMM_WORLD_*`) and SLURM `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
`SLURM_JOB_NODELIST`). Without any of them the process is a world of 1 (no launcher needed).
`detect_launch_env` is a pure function of the environment mapping.
"""

from __future__ import annotations

import atexit
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

from protdp.errors import ConfigError

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as read from the launcher."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "mpirun" | "slurm" | "none"


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ConfigError(f"environment variable {key}={env[key]!r}: expected an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM hostlist: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot parse a host name")
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _slurm_tasks_on_first_node(value: str) -> int:
    """SLURM_TASKS_PER_NODE like '2(x4),1' -> 2."""
    return int(re.match(r"\d+", value).group(0))


def detect_launch_env(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Rank/world/local rank/master address from torchrun, OpenMPI, SLURM or nothing (world 1)."""
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        return _checked(LaunchEnv(
            rank=_int(env, "RANK"), world_size=world,
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=port or DEFAULT_PORT,
            launcher="torchrun"))
    if "OMPI_COMM_WORLD_RANK" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE")
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") if (
            "OMPI_COMM_WORLD_LOCAL_SIZE" in env) else world
        if "MASTER_ADDR" not in env and local_world != world:
            raise ConfigError("mpirun across several nodes: export MASTER_ADDR (the host of rank 0) "
                              "to every rank, e.g. `mpirun -x MASTER_ADDR=node1 -x MASTER_PORT=29500`")
        return _checked(LaunchEnv(
            rank=_int(env, "OMPI_COMM_WORLD_RANK"), world_size=world,
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if (
                "OMPI_COMM_WORLD_LOCAL_RANK" in env) else 0,
            local_world_size=local_world, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port or DEFAULT_PORT, launcher="mpirun"))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        elif nodelist:
            addr = first_slurm_host(nodelist)
        else:
            raise ConfigError("SLURM job without SLURM_JOB_NODELIST: export MASTER_ADDR")
        if port is None:  # a per-job port so two jobs on one node do not collide
            port = DEFAULT_PORT + (_int(env, "SLURM_JOB_ID") % 1000 if "SLURM_JOB_ID" in env else 0)
        world = _int(env, "SLURM_NTASKS")
        if "SLURM_NTASKS_PER_NODE" in env:
            local_world = _slurm_tasks_on_first_node(env["SLURM_NTASKS_PER_NODE"])
        elif "SLURM_TASKS_PER_NODE" in env:
            local_world = _slurm_tasks_on_first_node(env["SLURM_TASKS_PER_NODE"])
        else:
            local_world = world
        return _checked(LaunchEnv(
            rank=_int(env, "SLURM_PROCID"), world_size=world,
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            local_world_size=local_world, master_addr=addr, master_port=port, launcher="slurm"))
    return LaunchEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                     master_addr="127.0.0.1", master_port=port or DEFAULT_PORT, launcher="none")


def _checked(le: LaunchEnv) -> LaunchEnv:
    if le.world_size < 1 or not 0 <= le.rank < le.world_size:
        raise ConfigError(f"{le.launcher}: rank {le.rank} is outside world size {le.world_size}")
    if not 0 <= le.local_rank < max(le.local_world_size, 1):
        raise ConfigError(f"{le.launcher}: local rank {le.local_rank} is outside local world size "
                          f"{le.local_world_size}")
    return le


def _as_timedelta(timeout) -> timedelta:
    if isinstance(timeout, timedelta):
        return timeout
    if timeout is None:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    if timeout <= 0:
        raise ConfigError(f"timeout={timeout!r}: expected a positive number of seconds")
    return timedelta(seconds=float(timeout))


def default_backend() -> str:
    """NCCL for CUDA tensors plus gloo for CPU tensors on CUDA machines, gloo otherwise.

    The pair ('cpu:gloo,cuda:nccl') lets the few CPU-side collectives (step metrics, layout hash,
    checkpoint barriers, object gathers) run next to NCCL's GPU collectives; NCCL alone rejects
    CPU tensors.
    """
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def _shutdown_at_exit() -> None:
    """Destroy the default process group before the interpreter finalizes: a process that exits
    with live gloo pairs (after point-to-point traffic) can abort ("terminate called without an
    active exception") and turn a finished run into a failed one."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # exiting anyway: never mask the program's own exit status
        pass


_joined_group = False
"""Whether this process has created a default process group (init_distributed)."""


def leave_process(code: int) -> None:
    """End a command-line process with exit status `code`. A process that created a process
    group runs its exit handlers (the group destroyed, the comm thread closed, logs flushed)
    and then leaves with os._exit: C++ destructors run at interpreter finalization can abort a
    finished rank whose gloo threads are still joinable ("terminate called without an active
    exception", pytorch/pytorch#179291), turning a run that completed into a failed one. Any
    other process exits normally (sys.exit)."""
    import sys

    if not _joined_group:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):    # closed or broken pipe: nothing more to say there
            pass
    os._exit(code if isinstance(code, int) else 1)


def init_distributed(timeout: float | timedelta | None = DEFAULT_TIMEOUT_S,
                     backend: str | None = None,
                     env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Initialize the default process group from the launcher environment (idempotent).

    `timeout` (seconds or timedelta) bounds every collective: a dead or diverged peer surfaces as
    a `DistributedError` naming the rank and operation instead of a silent hang.
    A world of 1 without a launcher gets an in-memory store (no port needed).
    """
    import torch
    import torch.distributed as dist

    global _joined_group
    launch = detect_launch_env(env)
    if dist.is_initialized():
        return launch
    atexit.register(_shutdown_at_exit)  # runs after the comm thread's own atexit close
    _joined_group = True
    backend = backend or default_backend()
    td = _as_timedelta(timeout)
    if "nccl" in backend:
        torch.cuda.set_device(launch.local_rank)
    if launch.world_size == 1 and launch.launcher == "none":
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=td)
        return launch
    if launch.launcher == "torchrun":
        source = env if env is not None else os.environ
        attempt = source.get("TORCHELASTIC_RESTART_COUNT")
        if attempt is not None and source.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # The agent's TCPStore outlives an elastic restart: gloo's full-mesh set-up of
            # attempt N would read attempt N-1's (dead) peer addresses ("Connection refused").
            # A per-attempt key prefix keeps every attempt's rendezvous apart.
            store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                                  is_master=False, timeout=td)
            dist.init_process_group(backend, store=dist.PrefixStore(f"protdp/attempt_{attempt}", store),
                                    rank=launch.rank, world_size=launch.world_size, timeout=td)
        else:  # torchrun's agent may already host the store (env://)
            dist.init_process_group(backend, init_method="env://", rank=launch.rank,
                                    world_size=launch.world_size, timeout=td)
        return launch
    store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                          is_master=launch.rank == 0, timeout=td)
    dist.init_process_group(backend, store=store, rank=launch.rank,
                            world_size=launch.world_size, timeout=td)
    return launch
