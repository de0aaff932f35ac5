"""One engine over several processes with torch.distributed (gloo on CPU, NCCL on CUDA): the machinery that
tensor parallelism (backend/parallel/tensor_parallel.py) and pipeline parallelism (backend/parallel/pipeline_parallel.py) share.

Only rank 0 runs the engine (scheduler, sampler, the HTTP gateway). Once loaded, it tells the workers how many
KV blocks its pool has (so every rank's cache has the same slots); then every step it broadcasts the
ForwardBatch, and the other ranks (`worker_loop`) run the same forward with their part of the model: TP takes
part in the all-reduces of the row-parallel layers, PP receives hidden states from the previous stage and
passes its own on. The workers throw away what the forward returns. Because every rank sees the same batch,
nothing else has to agree (priorities, ageing, sampling seeds live on rank 0 only).

    torchrun --nproc-per-node 2 -m gateway --parallel tensor|pipeline [gateway args]

Rank 0 serves (gateway/__main__.py hands `launch` its server: the engine never imports the gateway), the others
are workers; the world size becomes tensor_parallel_size or pipeline_parallel_size. TP and PP together (tp x pp
ranks) are not supported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from backend.config import load_engine_config

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


def _load_worker_model(cfg: Any) -> tuple[nn.Module, torch.dtype, str]:
    """This rank's part of the model, loaded exactly as rank 0 loads its own (max_model_len, ops, dtype)."""
    from backend.engine.model_runner import DTYPES
    from backend.model.ops import select_ops
    from backend.model.weights import load_model, model_max_len, resolve_model_dir

    model_dir = resolve_model_dir(cfg.resolved_model(), gguf_blocks=cfg.quantization == "auto")
    hf_max = model_max_len(model_dir)
    max_len = cfg.context_len(hf_max)
    dtype, device = DTYPES[cfg.dtype], cfg.resolved_device()
    ops = select_ops(cfg.kernel_backend, device, cfg.block_size)
    tp, pp = parallel_ranks(cfg.tensor_parallel_size, cfg.pipeline_parallel_size)
    model = load_model(model_dir, cfg, max_len, ops, tp=tp, pp=pp)
    return model, dtype, device


@torch.inference_mode()
def worker_loop(config: Any) -> None:
    """Ranks > 0: load this rank's part of the model and a KV cache like rank 0's, then run every broadcast batch.
    `config` is an EngineConfig (typed loosely: the engine imports this module)."""
    from backend.engine.model_runner import kv_cache_shape

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.set_flush_denormal(True)  # as rank 0 does
    model, dtype, device = _load_worker_model(config)
    box: list[object] = [None]
    dist.broadcast_object_list(box, src=0)  # Driver.share_num_blocks
    kv_cache = torch.zeros(kv_cache_shape(model, int(box[0]), config.block_size), dtype=dtype, device=device)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] == STOP:
            return
        model(box[0], kv_cache)


def launch(kind: str, serve: Callable[[], None], config_path: str | None) -> None:
    """Under torchrun: rank 0 runs `serve` with tensor_parallel_size (or pipeline_parallel_size) = world, the others
    are workers over the same configuration file."""
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    world = dist.get_world_size()
    # Through the environment, so the server's configuration and the workers' copy of it both pick it up.
    os.environ["SMOLGATE_TENSOR_PARALLEL_SIZE"] = str(world if kind == "tensor" else 1)
    os.environ["SMOLGATE_PIPELINE_PARALLEL_SIZE"] = str(world if kind == "pipeline" else 1)
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    try:
        if dist.get_rank() == 0:
            serve()
            dist.broadcast_object_list([STOP], src=0)  # the server stopped: release the workers
        else:
            worker_loop(load_engine_config(config_path))
    finally:
        dist.destroy_process_group()
