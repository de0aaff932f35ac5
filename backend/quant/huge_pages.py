"""An LM head's weights on 2 MB pages (Linux transparent huge pages), where the kernel allows it.

Every decode step reads the whole head: Gemma 3's Q8_0 head is 166 MB, SmolLM2's int8 one 24 MB. On 4 KB pages that is
a TLB entry for every 4 KB and the hardware prefetchers stop at every page boundary. `python -m bench.huge_pages`
(two engines in one process, stepping alternately) on a Zen 4: Gemma 3 1.047x at 32 streams and 1.075x at one with
AVX-512, 1.028x and 1.147x with AVX2; SmolLM2 0.996x and 1.043x.

Where THP is `always` the kernel already backs large allocations with huge pages; where it is `madvise` (Debian's and
Ubuntu's default) only regions advised with MADV_HUGEPAGE get them, so the head's are advised, and MADV_COLLAPSE (Linux
6.1 and later) moves its pages, already written by the loader, into huge ones at once rather than whenever khugepaged
gets to them. Only whole aligned 2 MB stretches inside a tensor are advised, so no other memory changes. The values are
the same bytes: nothing the head computes changes. Elsewhere (THP `never`, another OS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:
    if platform.system() != "Linux":
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name, use_errno=True).madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def advise_huge_pages(tensors: Iterable[torch.Tensor]) -> int:
    """Each CPU tensor's whole 2 MB stretches advised MADV_HUGEPAGE, then collapsed into huge pages; returns the bytes
    collapsed (0 where the kernel declines: THP off, or a kernel before 6.1, where khugepaged may still do it later)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    collapsed, seen = 0, set()
    for t in tensors:
        if t.device.type != "cpu" or t.layout != torch.strided:  # (a oneDNN-packed tensor has no storage to advise)
            continue
        storage = t.untyped_storage()
        start = storage.data_ptr()
        if start in seen:
            continue
        seen.add(start)
        first = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        end = (start + storage.nbytes()) // HUGE_PAGE * HUGE_PAGE
        if end <= first:
            continue
        madvise(first, end - first, MADV_HUGEPAGE)
        if madvise(first, end - first, MADV_COLLAPSE) == 0:
            collapsed += end - first
    return collapsed


def head_tensors(head: nn.Module) -> list[torch.Tensor]:
    """The head's tensors in CPU memory: its parameters and buffers, and the tensors of the packed weights it holds as
    attributes (GgufLinear's PackedGrouped, LowBitHead's W8A8 octets)."""
    found = [*head.parameters(), *head.buffers()]
    for value in vars(head).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif hasattr(value, "__dict__") and not isinstance(value, nn.Module):
            found += [v for v in vars(value).values() if isinstance(v, torch.Tensor)]
    # plain CPU memory only: a oneDNN-packed copy (PackedLinear's, a full-precision head's) has no storage to advise
    return [t for t in found if t.device.type == "cpu" and t.layout == torch.strided]


def huge_page_kb(ranges: Iterable[tuple[int, int]]) -> int:
    """kB on huge pages (/proc/self/smaps' AnonHugePages) of the mappings that overlap any [start, end) of `ranges`."""
    spans, total, inside = list(ranges), 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):
            lo, hi = (int(v, 16) for v in first.split("-"))
            inside = any(lo < end and start < hi for start, end in spans)
        elif inside and first == "AnonHugePages:":
            total += int(line.split()[1])
    return total


def head_on_huge_pages(model: nn.Module) -> None:
    """The model's LM head on 2 MB pages where the kernel allows it (logged once with the size collapsed)."""
    head = getattr(model, "lm_head", None)
    if head is None:
        return
    collapsed = advise_huge_pages(head_tensors(head))
    if collapsed:
        log.info("LM head: %d MB on 2 MB pages", collapsed >> 20)
