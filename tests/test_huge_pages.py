"""backend/quant/huge_pages.py: the LM head's weights on 2 MB pages, the same bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.quant.huge_pages import HUGE_PAGE, advise_huge_pages, head_tensors, huge_page_kb

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_a_tensor_collapsed_into_huge_pages_keeps_its_bytes() -> None:
    t = torch.randint(-128, 128, (12 << 20,), dtype=torch.int8)
    before = t.clone()
    start = t.data_ptr()
    collapsed = advise_huge_pages([t, t[1:]])  # a second view of the same storage is advised once
    if collapsed == 0:
        pytest.skip("the kernel declined MADV_COLLAPSE (before Linux 6.1, or no memory to compact)")
    whole = ((start + t.numel()) // HUGE_PAGE - (start + HUGE_PAGE - 1) // HUGE_PAGE) * HUGE_PAGE
    assert collapsed == whole and whole >= 4 * HUGE_PAGE
    assert huge_page_kb([(start, start + t.numel())]) * 1024 >= whole
    assert torch.equal(t, before)


def test_the_head_tensors_include_its_packed_weights() -> None:
    """SmolLM2's INT4 engine's head (LowBitHead): the W8A8 octets' int8 rows and scales, the bytes every step reads."""
    engine = LLMEngine(EngineConfig(enable_prefix_caching=False))
    head = engine.runner.model.lm_head
    shapes = {(tuple(t.shape), t.dtype) for t in head_tensors(head)}
    assert ((head.out_features, head.in_features), torch.int8) in shapes


def test_a_full_precision_head_with_a_packed_copy_loads() -> None:
    """A full-precision model's head keeps a oneDNN-packed copy (an opaque tensor, no storage to advise): the engine
    loads (the head is put on huge pages as it loads), and only the plain tensors are taken."""
    engine = LLMEngine(EngineConfig(quantization="none", enable_prefix_caching=False))
    head = engine.runner.model.lm_head
    held = [v for value in vars(head).values() if hasattr(value, "__dict__") for v in vars(value).values()]
    assert any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in held)  # the packed copy
    tensors = head_tensors(head)
    assert any(t.shape == (head.out_features, head.in_features) for t in tensors)
    assert all(t.layout == torch.strided for t in tensors)
