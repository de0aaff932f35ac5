"""Constrained decoding with llguidance: grammars compiled per request (cached), one matcher per sequence.

    validate(params)      # at submission: a bad or unsupported schema is an InvalidRequestError (HTTP 400)
    new_matcher(params)   # per sequence (n>1 siblings get their own), a copy of the cached compiled grammar
    apply_masks(logits, seqs)   # in the sampling step, before greedy/sampling: forbidden tokens -> -inf
    advance(matcher, token)     # after the token is chosen; True once the grammar is complete

Why llguidance: see bench/README.md ("Structured outputs"). The grammar text is the engine's
only input: a JSON schema (`guided_json`), "any JSON object" (`guided_json_object`), or a
llguidance Lark grammar (`guided_grammar`, used by the gateway for tool calls).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from functools import cache
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from backend.engine.request import Sequence
from backend.engine.sampling_params import SamplingParams
from backend.errors import InvalidRequestError
from backend.model.spm_tokenizer import SpmTokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

CACHE_SIZE = 256
# Compact JSON: no whitespace between tokens, so a small model cannot wander into endless blanks.
JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}


def grammar_text(params: SamplingParams) -> str | None:
    """The llguidance grammar for these params, or None when the request is unconstrained."""
    if params.guided_grammar is not None:
        return params.guided_grammar
    if params.guided_json is not None:
        return _json_grammar(params.guided_json)
    if params.guided_json_object:
        return _json_grammar('{"type": "object"}')
    return None


def _json_grammar(schema: str) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
    except (ValueError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"invalid JSON schema: {exc}", param="response_format") from exc


class GrammarCache:
    """Compiled grammars (template matchers) by grammar text, LRU; safe to call from any thread."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int) -> None:
        self._hf_tokenizer, self._vocab_size = hf_tokenizer, vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use: not every tokenizer converts
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0

    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            try:
                if isinstance(self._hf_tokenizer, SpmTokenizer):
                    self._tokenizer = self._hf_tokenizer.guidance(self._vocab_size)
                else:
                    self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size)
            except ValueError as exc:
                raise InvalidRequestError(f"this model's tokenizer does not support constrained decoding: {exc}") from exc
        return self._tokenizer

    def template(self, grammar: str) -> llguidance.LLMatcher:
        with self._lock:
            found = self._templates.get(grammar)
            if found is not None:
                self._templates.move_to_end(grammar)
                return found
        matcher = llguidance.LLMatcher(self.tokenizer(), grammar)
        if matcher.is_error():
            raise InvalidRequestError(f"unsupported schema or grammar: {matcher.get_error()}", param="response_format")
        with self._lock:
            self.compiles += 1
            self._templates[grammar] = matcher
            while len(self._templates) > CACHE_SIZE:
                self._templates.popitem(last=False)
        return matcher

    def validate(self, params: SamplingParams) -> None:
        grammar = grammar_text(params)
        if grammar is not None:
            self.template(grammar)

    def new_matcher(self, params: SamplingParams) -> llguidance.LLMatcher | None:
        grammar = grammar_text(params)
        return None if grammar is None else self.template(grammar).deep_copy()


def forbidden_tokens(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """(rows, words) int32 bitmask (bit i of word w: token 32w+i allowed) -> (rows, vocab) bool, True where forbidden."""
    bits = np.unpackbits(bitmask.view(np.uint8), axis=-1, count=vocab_size, bitorder="little")
    forbidden: np.ndarray = bits == 0
    return forbidden


@cache
def _executor() -> llguidance.LLExecutor:
    return llguidance.LLExecutor()


def apply_masks(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Set the logits of every token a row's grammar forbids to -inf (one batched masked_fill)."""
    rows = [i for i, s in enumerate(seqs) if s.guide is not None]
    if not rows:
        return
    vocab = logits.shape[1]
    bitmask = np.full((len(rows), (vocab + 31) // 32), -1, dtype=np.int32)
    if len(rows) == 1:
        seqs[rows[0]].guide.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
    else:  # llguidance's thread pool fills the rows in parallel, without the GIL
        matchers = [(seqs[row].guide, j) for j, row in enumerate(rows)]
        _executor().unsafe_compute_mask_ptr(matchers, bitmask.ctypes.data, bitmask[0].nbytes, len(rows))
    forbidden = forbidden_tokens(bitmask, vocab)
    if logits.device.type == "cpu":  # numpy: single-threaded, no intra-op thread pool woken for a small write
        dense = logits.numpy()
        for j, row in enumerate(rows):
            np.copyto(dense[row], -np.inf, where=forbidden[j])
        return
    index = torch.tensor(rows, device=logits.device)
    mask = torch.from_numpy(forbidden).to(logits.device, non_blocking=True)
    logits[index] = logits[index].masked_fill(mask, -float("inf"))


def advance(matcher: llguidance.LLMatcher, token: int) -> bool:
    """Feed the chosen token; True when the sequence must end (grammar complete, or violated)."""
    matcher.consume_token(token)
    return bool(matcher.is_stopped() or matcher.is_error())
