"""One engine over several processes with torch.distributed (gloo on CPU, NCCL on CUDA): the machinery that
tensor parallelism (backend/model/tensor_parallel.py) and pipeline parallelism (backend/model/pipeline_parallel.py) share.

Only rank 0 runs the engine (scheduler, sampler, the HTTP gateway). Once loaded, it tells the workers how many
KV blocks its pool has (so every rank's cache has the same slots); then every step it broadcasts the
ForwardBatch (its model is a Driver: backend/model/ranks.py), and the other ranks (`worker_loop`) run the same
forward with their part of the model: TP takes part in the all-reduces of the row-parallel layers, PP receives
hidden states from the previous stage and passes its own on. The workers throw away what the forward returns.
Because every rank sees the same batch, nothing else has to agree (priorities, ageing, sampling seeds live on rank 0 only).

    torchrun --nproc-per-node 2 -m gateway --parallel tensor|pipeline [gateway args]

Rank 0 serves (gateway/__main__.py hands `launch` its server: the engine never imports the gateway), the others
are workers; the world size becomes tensor_parallel_size or pipeline_parallel_size. TP and PP together (tp x pp
ranks) are not supported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from backend.config import EngineConfig, load_engine_config
from backend.model.ranks import STOP, parallel_ranks

if TYPE_CHECKING:
    from backend.model.llama import LlamaForCausalLM


def _load_worker_model(cfg: EngineConfig) -> tuple[LlamaForCausalLM, torch.dtype, str]:
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
def worker_loop(config: EngineConfig) -> None:
    """Ranks > 0: load this rank's part of the model and a KV cache like rank 0's, then run every broadcast batch."""
    from backend.engine.model_runner import allocate_kv_cache

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.set_flush_denormal(True)  # as rank 0 does
    model, dtype, device = _load_worker_model(config)
    num_blocks: list[int] = [0]
    dist.broadcast_object_list(num_blocks, src=0)  # Driver.share_num_blocks: an int
    kv_cache = allocate_kv_cache(model, num_blocks[0], config.block_size, dtype=dtype, device=device)
    while True:
        box: list[object] = [None]
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
