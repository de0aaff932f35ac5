"""The model over several ranks (backend/parallel/driver.py runs them): this process's rank for the parallelism
configured, and rank 0's Driver, the model that hands each ForwardBatch to the other ranks before running its part.

The engine wraps its model in a Driver when tensor_parallel_size or pipeline_parallel_size is > 1; the workers'
loop that receives the batches (`worker_loop`) and the launch under torchrun live in backend/parallel/driver.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from backend.model.llama import LlamaForCausalLM

STOP = "stop"
Rank = tuple[int, int]  # (rank, world size)


def check_world(name: str, size: int) -> Rank:
    """(rank, world) of the process group `name` (tensor_parallel_size, pipeline_parallel_size) = size runs on."""
    if not dist.is_initialized():
        raise ValueError(f"{name} {size} needs torch.distributed initialised (launch with torchrun)")
    if dist.get_world_size() != size:
        raise ValueError(f"{name} {size} but the process group has {dist.get_world_size()} ranks")
    return dist.get_rank(), size


def parallel_ranks(tensor_parallel_size: int, pipeline_parallel_size: int) -> tuple[Rank | None, Rank | None]:
    """(tp, pp): this process's (rank, world) for the kind of parallelism configured, None for the other one."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if tp < 1 or pp < 1:
        raise ValueError(f"tensor_parallel_size ({tp}) and pipeline_parallel_size ({pp}) must be >= 1")
    if tp > 1 and pp > 1:
        raise ValueError(f"tensor_parallel_size {tp} with pipeline_parallel_size {pp}: tp x pp is not supported, "
                         "use one kind of parallelism")
    if tp > 1:
        return check_world("tensor_parallel_size", tp), None
    if pp > 1:
        return None, check_world("pipeline_parallel_size", pp)
    return None, None


class Driver(nn.Module):
    """Rank 0's model: broadcasts each ForwardBatch to the workers, then runs its own part."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model
        self.config, self.head_dim, self.layer_windows = model.config, model.head_dim, model.layer_windows
        self.layer_ids = model.layer_ids  # what kv_cache_shape needs

    def share_num_blocks(self, num_blocks: int) -> None:
        """The workers size their caches by rank 0's pool: block ids (slots) in every batch are rank 0's."""
        dist.broadcast_object_list([num_blocks], src=0)

    def forward(self, batch: object, kv_cache: torch.Tensor) -> torch.Tensor:
        dist.broadcast_object_list([batch], src=0)
        return self.model(batch, kv_cache)

    def stop_workers(self) -> None:
        dist.broadcast_object_list([STOP], src=0)
