"""The encoder stack in one C call (kernels/cpu/encoder_layers.c): its attention against torch's SDPA, and the
whole stack against the layer-by-layer path over the same kernels on the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import pytest
import torch

from backend.config import cache_dir
from backend.embed.embeddings import Embedder, mean_pool_normalize
from kernels.cpu.encoder_layers import encoder_attention, encoder_attention_ref, load_encoder_layers
from tests.c_kernels import requires_c_kernels

pytestmark = requires_c_kernels

TEXTS = ["What is the capital of France?", "ok", "How do I reverse a linked list in Python without recursion, step by step?"]


@pytest.fixture(scope="module")
def lib():
    return load_encoder_layers(cache_dir() / "kernels")


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(dtype="int8")


@pytest.mark.parametrize(("batch", "seq", "heads", "hidden"), [(1, 10, 12, 384), (3, 17, 12, 384), (2, 1, 4, 64), (2, 70, 2, 64)])
def test_attention_matches_sdpa(lib, batch: int, seq: int, heads: int, hidden: int) -> None:
    g = torch.Generator().manual_seed(batch * seq)
    qkv = torch.randn(batch, seq, 3 * hidden, generator=g) * 2
    mask = torch.rand(batch, seq, generator=g) > 0.3
    mask[:, 0] = True  # every sequence has a real token
    for m in (None, mask):
        out = encoder_attention(lib, qkv, m, heads)
        torch.testing.assert_close(out, encoder_attention_ref(qkv, m, heads), atol=1e-5, rtol=1e-4)


def test_attention_of_a_fully_masked_sequence_is_zero_not_nan(lib) -> None:
    qkv = torch.randn(2, 5, 3 * 64)
    mask = torch.tensor([[True] * 5, [False] * 5])
    out = encoder_attention(lib, qkv, mask, 2)
    assert bool(out[1].eq(0).all()) and bool(out.isfinite().all())
    torch.testing.assert_close(out[0], encoder_attention_ref(qkv[:1], None, 2)[0], atol=1e-5, rtol=1e-4)


def _both_paths(embedder: Embedder, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(stack's hidden states, the layer loop's, attention mask) for `texts`."""
    encoder = embedder._encoder
    assert encoder is not None and encoder.stack is not None  # int8 on the C kernels: the stack serves it
    enc = embedder.tokenizer(texts, padding=True, return_tensors="pt")
    stacked = encoder(enc["input_ids"], enc["attention_mask"])
    stack, encoder.stack = encoder.stack, None
    try:
        layered = encoder(enc["input_ids"], enc["attention_mask"])
    finally:
        encoder.stack = stack
    return stacked, layered, enc["attention_mask"]


@pytest.mark.parametrize("texts", [[TEXTS[0]], [TEXTS[1]], [TEXTS[2]], TEXTS], ids=["query", "short", "long", "padded"])
def test_the_stack_embeds_like_the_layer_loop(embedder: Embedder, texts: list[str]) -> None:
    # The same GEMMs and LayerNorms; attention's last-bit differences can flip an int8 activation's rounding (the
    # hidden states then differ by ~1e-3), so compare what is used: the pooled vectors
    stacked, layered, mask = _both_paths(embedder, texts)
    cosine = (mean_pool_normalize(stacked, mask) * mean_pool_normalize(layered, mask)).sum(dim=1)
    assert bool((cosine > 0.9999).all()), cosine


def test_the_stack_serves_only_int8_encoders() -> None:
    assert Embedder(dtype="float16")._encoder.stack is None  # type: ignore[union-attr]
