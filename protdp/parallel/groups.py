"""Process groups for world = DP × DAP (Megatron concept: `parallel_state.initialize_model_parallel`
builds the model-parallel and data-parallel groups once, every rank creating every group in the
same order).

The data-parallel engine (`DataParallel`, `DistributedOptimizer`: buckets, overlap, distributed
optimizer, grad-norm clipping, NaN vote) runs over `dp_group`; the model's axial blocks over
`dap_group` (`protdp.parallel.dap.AxialComm`). With dap_size 1 the DP group is the world and no
DAP group exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from protdp.parallel.dap import AxialComm
from protdp.parallel.dap_layout import all_group_ranks, group_layout


@dataclass
class ParallelGroups:
    """This rank's groups and its index in each."""

    dp_group: object            # None = the default (world) group
    dap_group: object           # None when dap_size == 1
    dp_rank: int
    dp_size: int
    dap_rank: int
    dap_size: int

    def axial_comm(self, split_only_gather_backward: bool = False) -> AxialComm | None:
        """The model's DAP communicator (None without DAP)."""
        if self.dap_size == 1:
            return None
        return AxialComm(self.dap_group, self.dap_size, self.dap_rank,
                         split_only_gather_backward=split_only_gather_backward)


def build_groups(dap_size: int) -> ParallelGroups:
    """Create the DP and DAP groups of the initialized world (collective: every rank calls it)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    layout = group_layout(world, dap_size, rank)
    if dap_size == 1:
        return ParallelGroups(None, None, rank, world, 0, 1)
    dap_groups, dp_groups = all_group_ranks(world, dap_size)
    mine_dap = mine_dp = None
    for ranks in dap_groups:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine_dap = g
    for ranks in dp_groups:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine_dp = g
    return ParallelGroups(mine_dp, mine_dap, layout.dp_rank, len(layout.dp_ranks),
                          layout.dap_rank, dap_size)
