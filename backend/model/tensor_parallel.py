"""Tensor parallelism (Megatron-style) with torch.distributed: gloo on CPU, NCCL on CUDA.

Each rank holds 1/world of every decoder layer: q/k/v and gate/up are column-parallel (rank r keeps its share
of the attention heads, KV heads and MLP columns), o_proj and down_proj are row-parallel (rank r keeps the
matching input columns) and their partial outputs are summed with one all-reduce each. Embeddings, norms and
the lm_head are replicated. Each rank's KV cache holds only its KV heads, so the cache is split too.

Rank 0 drives, the other ranks follow its batches (backend/parallel/driver.py, shared with pipeline parallelism); here
only the sharding: every rank runs the same forward on its shard and takes part in the all-reduces.

    torchrun --nproc-per-node 2 -m gateway --parallel tensor [args]   # rank 0 serves, rank 1 is a worker
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from transformers import PretrainedConfig


def shard_config(config: PretrainedConfig, world: int) -> PretrainedConfig:
    """The config of one rank's model: heads, KV heads and MLP width divided by the world size."""
    heads, kv_heads, inter = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if heads % world or kv_heads % world or inter % world:
        raise ValueError(f"tensor_parallel_size {world} must divide the heads ({heads}), KV heads ({kv_heads}) "
                         f"and intermediate size ({inter})")
    shard = copy.deepcopy(config)
    shard.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads  # kept, not recomputed
    shard.num_attention_heads, shard.num_key_value_heads = heads // world, kv_heads // world
    shard.intermediate_size = inter // world
    return shard


def _rows(t: torch.Tensor, sizes: list[int], rank: int, world: int) -> torch.Tensor:
    """Split dim 0 into the fused parts `sizes`, keep rank's slice of each, concatenate again."""
    return torch.cat([part.chunk(world, dim=0)[rank] for part in t.split(sizes, dim=0)], dim=0)


def shard_state(state: dict[str, torch.Tensor], shard: PretrainedConfig, rank: int, world: int) -> dict[str, torch.Tensor]:
    """Rank's slice of a full-precision state dict in our names (fused qkv_proj / gate_up_proj)."""
    q_size = shard.num_attention_heads * shard.head_dim * world
    kv_size = shard.num_key_value_heads * shard.head_dim * world
    inter = shard.intermediate_size * world
    out = {}
    for name, t in state.items():
        if ".self_attn.qkv_proj." in name:  # weight (q + 2kv, hidden) or bias (q + 2kv,)
            out[name] = _rows(t, [q_size, kv_size, kv_size], rank, world)
        elif ".mlp.gate_up_proj." in name:
            out[name] = _rows(t, [inter, inter], rank, world)
        elif name.endswith((".self_attn.o_proj.weight", ".mlp.down_proj.weight")):
            out[name] = t.chunk(world, dim=1)[rank]  # row-parallel: the input columns
        else:
            out[name] = t  # embeddings, norms, lm_head: replicated
    return {k: v.contiguous() for k, v in out.items()}


class RowParallel(nn.Module):
    """A row-parallel linear: this rank's partial product, summed over the ranks."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        dist.all_reduce(y)
        return y


def make_row_parallel(model: nn.Module) -> None:
    for layer in model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj)
        layer.mlp.down_proj = RowParallel(layer.mlp.down_proj)
