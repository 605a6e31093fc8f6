"""Layout math of dynamic axial parallelism (DAP, FastFold / ScaleFold): pure functions, no
process group.

World = DP × DAP (Megatron's rank order: the model-parallel group is the fastest-varying index,
so the K ranks of one DAP group are consecutive and usually share a node's fast links). A tensor
axis of length n is padded to a multiple of K and split into K equal contiguous shards.

Communication per Evoformer block (forward; backward moves the same bytes again), per rank, for
an MSA of S rows and a pair representation of L × L, both already padded, K ranks, b bytes per
element (`block_comm_bytes`): each all-to-all sends (K-1)/K of the local shard, each all-gather
receives (K-1) shards:

- MSA all-to-all row -> column and back:            2 × (K-1)/K × S·L/K·C_m
- pair all-to-alls (tri-mul-out -> in, in -> att-start, -> att-end, -> next block): 4 × (K-1)/K × L²/K·C_z
- all-gathers: row-attention pair bias (K-1)·L²/K·H_msa, triangle-attention biases
  2 × (K-1)·L²/K·H_pair, triangle-multiplication operands 2 × (K-1)·L²/K·c_tri,
  outer-product-mean operand (K-1)·S·L/K·c_opm.
"""

from __future__ import annotations

from dataclasses import dataclass

from protdp.errors import ConfigError


def padded_size(n: int, k: int) -> int:
    """Smallest multiple of k that is >= n."""
    if k < 1 or n < 0:
        raise ConfigError(f"padded_size(n={n}, k={k}): expected n >= 0 and k >= 1")
    return -(-n // k) * k


def shard_range(n_padded: int, k: int, rank: int) -> tuple[int, int]:
    """[start, end) of `rank`'s contiguous shard of an axis of padded length n_padded."""
    if n_padded % k:
        raise ConfigError(f"axis of length {n_padded} is not padded to a multiple of {k}")
    if not 0 <= rank < k:
        raise ConfigError(f"rank {rank} outside a DAP group of {k}")
    size = n_padded // k
    return rank * size, (rank + 1) * size


@dataclass(frozen=True)
class GroupLayout:
    """Global ranks of this rank's DAP group and DP group, and its index in each."""

    dap_ranks: tuple[int, ...]
    dp_ranks: tuple[int, ...]
    dap_rank: int
    dp_rank: int


def group_layout(world_size: int, dap_size: int, rank: int) -> GroupLayout:
    """World = DP × DAP with DAP fastest: DAP group d = ranks d·K .. d·K+K-1; DP group j = ranks
    j, j+K, j+2K, ... (every member of a DAP group has the same DP index, so it reads the same
    sample and owns the same distributed-optimizer shard)."""
    if dap_size < 1 or world_size % dap_size:
        raise ConfigError(f"--dap-size {dap_size}: the world size {world_size} must be a multiple "
                          "of it (world = data-parallel size × dap size)")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} outside world {world_size}")
    dp_index, dap_index = divmod(rank, dap_size)
    dap_ranks = tuple(range(dp_index * dap_size, (dp_index + 1) * dap_size))
    dp_ranks = tuple(range(dap_index, world_size, dap_size))
    return GroupLayout(dap_ranks, dp_ranks, dap_index, dp_index)


def all_group_ranks(world_size: int, dap_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(every DAP group, every DP group) as lists of global ranks, in creation order (every rank
    must create every group, in the same order: torch.distributed.new_group is collective)."""
    layouts = [group_layout(world_size, dap_size, r) for r in range(world_size)]
    dap = sorted({lay.dap_ranks for lay in layouts})
    dp = sorted({lay.dp_ranks for lay in layouts})
    return [list(g) for g in dap], [list(g) for g in dp]


def block_comm_bytes(*, n_seq: int, n_res: int, k: int, c_m: int, c_z: int, msa_heads: int,
                     pair_heads: int, c_hidden_tri_mul: int, c_hidden_opm: int,
                     bytes_per_element: int = 4) -> dict[str, int]:
    """Bytes each rank sends (all-to-all) or receives (all-gather) per Evoformer block forward,
    by collective, for padded sizes (see the module docstring); {} when k == 1."""
    if k == 1:
        return {}
    s, l_ = padded_size(n_seq, k), padded_size(n_res, k)
    a2a = (k - 1) / k
    b = bytes_per_element
    out = {
        "msa_all_to_all": int(2 * a2a * s * l_ // k * c_m * b),
        "pair_all_to_all": int(4 * a2a * l_ * l_ // k * c_z * b),
        "row_bias_all_gather": (k - 1) * l_ * l_ // k * msa_heads * b,
        "tri_att_bias_all_gather": 2 * (k - 1) * l_ * l_ // k * pair_heads * b,
        "tri_mul_all_gather": 2 * (k - 1) * l_ * l_ // k * c_hidden_tri_mul * b,
        "opm_all_gather": (k - 1) * s * l_ // k * c_hidden_opm * b,
    }
    out["total"] = sum(out.values())
    return out
