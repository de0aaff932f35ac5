"""Pipeline parallelism: the decoder layers split into contiguous stages, one per rank (gloo on CPU, NCCL on CUDA).

Stage s holds layers stage_layers(num_layers, stages, s) (as even as possible, earlier stages take the
remainder) and a KV cache for those layers only, so weights and KV cache per rank shrink by ~1/stages.
Stage 0 (rank 0) also holds the embeddings, the final norm and the lm_head: with tied embeddings (SmolLM2, Llama
3.2) that is one table, not two, and the ring closes where the sampler is. So the last stage sends back only the
(2, logits rows, hidden) stream of the rows the sampler needs, not (rows, vocab) logits.

One step (rank 0 broadcasts the ForwardBatch first, backend/parallel/driver.py):

    stage 0:       embed -> its layers -> send (delta, residual) to 1 ... recv rows from the last -> norm, lm_head
    stage 0<s<S-1: recv from s-1 -> its layers -> send to s+1
    stage S-1:     recv from S-2 -> its layers -> send the logits rows to 0

This is a plain pipeline: one batch goes through the stages one after another, so it splits memory, not time;
every rank but one idles at any moment. Overlapping micro-batches (or consecutive steps) across the stages is
left out. Only full decoder layers are split; TP and PP together are not supported.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from backend.model.forward_batch import ForwardBatch
from backend.model.llama import LlamaForCausalLM
from backend.model.ops import Ops


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The decoder layers of `stage`: contiguous, sizes differ by at most one, the first stages take the extra."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"pipeline_parallel_size {stages} must be between 1 and the model's {num_layers} decoder layers")
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} out of range for pipeline_parallel_size {stages}")
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


def keeps_tensor(name: str, layer_ids: range, ends: bool) -> bool:
    """Whether a checkpoint tensor ("layers.3.mlp...", "embed_tokens.weight", "lm_head.weight") is the stage's."""
    if name.startswith("layers."):
        return int(name.split(".", 2)[1]) in layer_ids
    return ends  # embeddings, final norm, lm_head: stage 0's


class PipelineStage(LlamaForCausalLM):
    """One stage's model. forward returns the logits on stage 0 and None on the others."""

    def __init__(self, config: PretrainedConfig, max_positions: int, ops: Ops | None, stage: tuple[int, int]) -> None:
        rank, stages = stage
        super().__init__(config, max_positions, ops, stage_layers(config.num_hidden_layers, stages, rank), ends=rank == 0)
        self.stage, self.stages = rank, stages

    def _recv(self, rows: int, src: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(delta, residual) of `rows` tokens from rank src; `like` gives dtype and device (the KV cache's)."""
        buf = torch.empty(2, rows, self.config.hidden_size, dtype=like.dtype, device=like.device)
        dist.recv(buf, src=src)
        return buf[0], buf[1]

    def forward(self, batch: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor | None:
        last = self.stages - 1
        if self.stage == 0:
            x, residual = self.embed(batch), None
        else:
            x, residual = self._recv(batch.num_tokens, self.stage - 1, kv_cache)
        x, residual = self.run_layers(x, residual, batch, kv_cache)
        if self.stage < last:
            dist.send(torch.stack([x, residual]), dst=self.stage + 1)
        else:  # only the rows the sampler reads go back
            rows = batch.logits_index
            dist.send(torch.stack([x[rows], residual[rows]]), dst=0)
        if self.stage != 0:
            return None
        return self.head(*self._recv(batch.logits_index.shape[0], last, kv_cache))
