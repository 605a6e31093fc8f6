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


class LeaderModel(nn.Module):
    """The leader's model: every forward is announced to the followers, then run."""

    def __init__(self, model: nn.Module, group, leader: int):
        super().__init__()
        self.model, self.group, self.leader = model, group, leader
        self.config = model.config

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def forward(self, batch: dict, num_recycles: int | None = None):
        cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in batch.items()}
        _send(("run", cpu, num_recycles), self.group, self.leader)
        return self.model(batch, num_recycles=num_recycles)

    def stop(self) -> None:
        """Release the followers (call exactly once, also after an error)."""
        _send((STOP, None, None), self.group, self.leader)


@torch.no_grad()
def follow(model: nn.Module, group, leader: int, device: torch.device) -> int:
    """A follower's loop: join every forward the leader announces; returns how many ran."""
    model.eval()
    runs = 0
    while True:
        kind, batch, num_recycles = _receive(group, leader)
        if kind == STOP:
            return runs
        batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
        model(batch, num_recycles=num_recycles)
        runs += 1
