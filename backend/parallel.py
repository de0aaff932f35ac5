"""Tensor parallelism (Megatron-style) with torch.distributed: gloo on CPU, NCCL on CUDA.

Each rank holds 1/world of every decoder layer: q/k/v and gate/up are column-parallel (rank r keeps its share
of the attention heads, KV heads and MLP columns), o_proj and down_proj are row-parallel (rank r keeps the
matching input columns) and their partial outputs are summed with one all-reduce each. Embeddings, norms and
the lm_head are replicated. Each rank's KV cache holds only its KV heads, so the cache is split too.

Only rank 0 runs the engine (scheduler, sampler, the HTTP gateway). Every step it broadcasts the ForwardBatch;
the other ranks (`worker_loop`) run the same forward on their shard, taking part in the all-reduces, and throw
their logits away. Because every rank sees the same batch, nothing else has to agree (priorities, ageing,
sampling seeds live on rank 0 only).

    torchrun --nproc-per-node 2 -m backend.parallel [gateway args]   # rank 0 serves, rank 1 is a worker
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from transformers import PretrainedConfig

STOP = "stop"


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


class Driver(nn.Module):
    """Rank 0's model: broadcasts each ForwardBatch to the workers, then runs its own shard."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config, self.head_dim, self.layer_windows = model.config, model.head_dim, model.layer_windows

    def forward(self, batch: object, kv_cache: torch.Tensor) -> torch.Tensor:
        dist.broadcast_object_list([batch], src=0)
        return self.model(batch, kv_cache)

    def stop_workers(self) -> None:
        dist.broadcast_object_list([STOP], src=0)


def check_world(size: int) -> tuple[int, int]:
    """(rank, world) of the process group tensor parallelism runs on."""
    if not dist.is_initialized():
        raise ValueError(f"tensor_parallel_size {size} needs torch.distributed initialised (launch with torchrun)")
    if dist.get_world_size() != size:
        raise ValueError(f"tensor_parallel_size {size} but the process group has {dist.get_world_size()} ranks")
    return dist.get_rank(), size


@torch.inference_mode()
def worker_loop(config: object) -> None:
    """Ranks > 0: load this rank's shard and a KV cache like rank 0's, then run every broadcast batch."""
    from backend.engine import DTYPES
    from backend.model_runner import kv_cache_shape, num_kv_blocks
    from backend.weights import load_model, resolve_model_dir

    cfg = config  # EngineConfig (typed loosely: this module is imported by the engine)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    from backend.engine import LLMEngine  # max_model_len and ops exactly as rank 0 computes them
    from backend.ops import select_ops

    model_dir = resolve_model_dir(cfg.resolved_model())
    hf_max = LLMEngine._model_max_len(model_dir)
    max_len = min(cfg.max_model_len or hf_max, hf_max)
    dtype, device = DTYPES[cfg.dtype], cfg.resolved_device()
    ops = select_ops(cfg.kernel_backend, device, cfg.block_size)
    tp = check_world(cfg.tensor_parallel_size)
    model = load_model(model_dir, dtype, device, max_len, ops, quantization=cfg.quantization, tp=tp)
    blocks = num_kv_blocks(model, cfg.block_size, cfg.kv_cache_memory_mb, dtype)
    kv_cache = torch.zeros(kv_cache_shape(model, blocks, cfg.block_size), dtype=dtype, device=device)
    while True:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] == STOP:
            return
        model(box[0], kv_cache)


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point: rank 0 runs the gateway with tensor_parallel_size = world, the others are workers."""
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    world = dist.get_world_size()
    os.environ["SMOLGATE_TENSOR_PARALLEL_SIZE"] = str(world)
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    from gateway.__main__ import main as serve
    from gateway.__main__ import parse_args
    from gateway.config import load_config

    argv = argv if argv is not None else sys.argv[1:]
    try:
        if dist.get_rank() == 0:
            serve(argv)
            dist.broadcast_object_list([STOP], src=0)  # the server stopped: release the workers
        else:
            worker_loop(load_config(parse_args(argv).config).engine)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
