"""The greedy fast path: numpy's argmax over fp32 logits picks what torch.argmax picks (ties: the first index), and a
plain greedy batch skips the ladder only when nothing in it would change the argmax; the Rust decode the detokenizer
uses returns what the transformers tokenizer's decode does."""

from __future__ import annotations

import torch

from backend.engine.detokenizer import text_decoder
from backend.engine.request import Sequence
from backend.engine.sampler import greedy_tokens, is_plain_greedy
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import tokenizer


def test_greedy_tokens_equal_torch_argmax_with_ties() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(33, 49152, generator=gen)
    logits[3, 100] = logits[3, 7] = logits[3].max() + 1  # a tie: the first index wins
    logits[5, :] = 0.0  # all tied
    logits[6, 49151] = 1e9  # the last column
    assert greedy_tokens(logits) == logits.argmax(dim=-1).tolist()
    assert greedy_tokens(logits[::2]) == logits[::2].argmax(dim=-1).tolist()  # strided rows
    assert greedy_tokens(logits.bfloat16()) == logits.bfloat16().argmax(dim=-1).tolist()  # the torch fallback


def _seq(params: SamplingParams, outputs: int = 0) -> Sequence:
    return Sequence("r", 0, [1, 2, 3] + [4] * outputs, 3, params, None)  # type: ignore[arg-type]


def test_plain_greedy_excludes_what_changes_the_argmax() -> None:
    assert is_plain_greedy(_seq(SamplingParams(temperature=0)))
    assert not is_plain_greedy(_seq(SamplingParams(temperature=0.7)))
    assert not is_plain_greedy(_seq(SamplingParams(temperature=0, logprobs=0)))
    assert not is_plain_greedy(_seq(SamplingParams(temperature=0, logit_bias={5: 3.0})))
    assert not is_plain_greedy(_seq(SamplingParams(temperature=0, repetition_penalty=1.2)))
    assert not is_plain_greedy(_seq(SamplingParams(temperature=0, min_tokens=2), outputs=1))
    assert is_plain_greedy(_seq(SamplingParams(temperature=0, min_tokens=2), outputs=2))
    guided = _seq(SamplingParams(temperature=0))
    guided.guide = object()
    assert not is_plain_greedy(guided)


def test_text_decoder_equals_the_tokenizers_decode() -> None:
    tok = tokenizer()
    decode = text_decoder(tok)
    text = "Héllo wörld! 日本語のテキスト 🚀🎉 tabs\tand\nnewlines, 'quotes' and  double  spaces ."
    ids = tok.encode(text, add_special_tokens=False)
    specials = list(tok.all_special_ids)
    samples = [ids, specials + ids + specials, list(range(0, 49152, 97))]
    samples += [ids[i:j] for i in range(len(ids)) for j in range(i + 1, min(len(ids), i + 4) + 1)]  # split characters
    for sample in samples:
        assert decode(sample) == tok.decode(sample, skip_special_tokens=True)
