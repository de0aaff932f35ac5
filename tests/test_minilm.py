"""Our BERT encoder forward against transformers' BertModel on the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from backend.config import default_embedding_model_path
from backend.embed.embeddings import Embedder, for_cache, mean_pool_normalize
from backend.embed.minilm import BertEncoder
from kernels.cpu.build import c_kernels_unavailable

TEXTS = ["What is the capital of France?", "ok", "How do I reverse a linked list in Python without recursion, step by step?"]


@pytest.fixture(scope="module")
def bert() -> tuple[torch.nn.Module, object]:
    path = str(default_embedding_model_path())
    return AutoModel.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def test_single_queries_match_transformers(bert: tuple) -> None:
    model, tok = bert
    ours = BertEncoder(model)
    assert (ours.emb_norm.lib is None) == (c_kernels_unavailable() is not None)  # LayerNorm + residual in C where it can
    for text in TEXTS:
        enc = tok([text], return_tensors="pt")
        with torch.inference_mode():
            ref = model(**enc).last_hidden_state
        torch.testing.assert_close(ours(enc["input_ids"], enc["attention_mask"]), ref, atol=1e-4, rtol=1e-4)


def test_padded_batch_matches_transformers_on_real_tokens(bert: tuple) -> None:
    model, tok = bert
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        ref = model(**enc).last_hidden_state
    ours = BertEncoder(model)(enc["input_ids"], enc["attention_mask"])
    real = enc["attention_mask"].bool()  # padding positions' states are never used (mean pooling masks them)
    torch.testing.assert_close(ours[real], ref[real], atol=1e-4, rtol=1e-4)


INT8 = pytest.param("int8", 0.99, marks=pytest.mark.skipif(c_kernels_unavailable() is not None, reason="no C kernels"))


@pytest.mark.parametrize(("dtype", "min_cosine"), [("float32", 0.99999), ("bfloat16", 0.999), ("float16", 0.99999), INT8])
def test_embedder_vectors_match_sentence_transformers_recipe(bert: tuple, dtype: str, min_cosine: float) -> None:
    model, tok = bert
    vectors, tokens = Embedder(dtype=dtype).embed_sync(TEXTS)
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        ref = mean_pool_normalize(model(**enc).last_hidden_state, enc["attention_mask"])
    assert tokens == int(enc["attention_mask"].sum())
    cosine = (torch.tensor(vectors) * ref).sum(dim=1)
    assert bool((cosine > min_cosine).all()), cosine


def test_the_cache_variant_shares_what_it_can_and_embeds_like_its_own_embedder() -> None:
    main = Embedder(dtype="float16")
    assert for_cache(main, "same") is main and main.variant("float16") is main
    own = for_cache(main, "auto")
    if c_kernels_unavailable() is not None:
        assert own is main
        return
    assert own.dtype == "int8" and own.identity == f"{main.path.name}/int8" != main.identity
    assert own.tokenizer is main.tokenizer and own._executor is main._executor
    assert own._encoder.word is main._encoder.word and own._encoder.position is main._encoder.position
    assert own.embed_sync(TEXTS) == Embedder(dtype="int8").embed_sync(TEXTS)  # sharing changes nothing


def test_embedder_refuses_an_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="embedding dtype 'int3'"):
        Embedder(dtype="int3")


def test_unsupported_variant_is_refused(bert: tuple) -> None:
    model, _ = bert
    model.config.hidden_act = "relu"
    try:
        with pytest.raises(ValueError, match="unsupported BERT variant"):
            BertEncoder(model)
    finally:
        model.config.hidden_act = "gelu"


def test_the_tokenizer_core_pads_and_ids_like_transformers_padded_call() -> None:
    embedder = Embedder(dtype="float32")
    texts = [*TEXTS, "", "héllo wörld 日本語 🙂", "long " * 600]  # the last past the model's 512 (refused later)
    input_ids, attention_mask = embedder._tokenize(texts)
    enc = embedder.tokenizer(texts, padding=True, truncation=False, return_tensors="pt")
    assert torch.equal(input_ids, enc["input_ids"]) and torch.equal(attention_mask, enc["attention_mask"])
