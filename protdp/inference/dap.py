"""Inference across the K ranks of a DAP group (`pipelines/predict.py --dap-size K`): one long
target's Evoformer split over K ranks (`protdp.model.axial`), so a target whose pair
activations do not fit one device runs on several.

Rank 0 of each DAP group (the leader) runs the whole predictor (targets of its data-parallel
index, gate, writers, review queue); its model is wrapped in `LeaderModel`, which first sends
each forward's batch to the group's other ranks (followers). A follower runs `follow`: it
receives each batch and joins the same forward (the collectives need every rank) until the
leader says stop. Followers write nothing, so outputs, provenance and the review queue are
exactly one rank's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

STOP = "stop"


def _send(obj, group, leader: int) -> None:
    dist.broadcast_object_list([obj], src=leader, group=group)


def _receive(group, leader: int):
    box = [None]
    dist.broadcast_object_list(box, src=leader, group=group)
    return box[0]


def _chunk_size(model: nn.Module) -> int | None:
    """The row-chunk size the predictor chose for this forward (`memory.set_chunk_size`)."""
    for module in model.modules():
        if hasattr(module, "chunk_size") and not isinstance(module.chunk_size, torch.Tensor):
            return module.chunk_size
    return None


class LeaderModel(nn.Module):
    """The leader's model: every forward is announced to the followers, then run. The chunk
    size and every early-stop decision (`after_pass`) are the leader's, sent to the followers
    so all ranks of the group run the same passes (the collectives need every rank)."""

    def __init__(self, model: nn.Module, group, leader: int):
        super().__init__()
        self.model, self.group, self.leader = model, group, leader
        self.config = model.config

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def forward(self, batch: dict, num_recycles: int | None = None, after_pass=None):
        cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in batch.items()}
        _send(("run", cpu, num_recycles, _chunk_size(self.model), after_pass is not None),
              self.group, self.leader)
        if after_pass is None:
            return self.model(batch, num_recycles=num_recycles)

        def decide(i: int, out: dict) -> bool:
            stop = bool(after_pass(i, out))
            _send(stop, self.group, self.leader)
            return stop

        return self.model(batch, num_recycles=num_recycles, after_pass=decide)

    def stop(self) -> None:
        """Release the followers (call exactly once, also after an error)."""
        _send((STOP, None, None, None, False), self.group, self.leader)


@torch.no_grad()
def follow(model: nn.Module, group, leader: int, device: torch.device) -> int:
    """A follower's loop: join every forward the leader announces (its chunk size, its
    early-stop decisions); returns how many ran."""
    from protdp.inference.memory import set_chunk_size

    model.eval()
    runs = 0
    while True:
        kind, batch, num_recycles, chunk, early_stop = _receive(group, leader)
        if kind == STOP:
            return runs
        batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
        set_chunk_size(model, chunk)
        decide = (lambda i, out: bool(_receive(group, leader))) if early_stop else None
        model(batch, num_recycles=num_recycles, after_pass=decide)
        runs += 1
