"""Sentence embeddings with all-MiniLM-L6-v2: mean pooling over the attention mask, then L2 norm.

transformers loads the tokenizer and the weights; BERT checkpoints (MiniLM is one) run our lean encoder
forward (backend/embed/minilm.py, ~2x faster on a short query: the semantic cache waits for it on every
request), other architectures transformers' own. The forward runs off the event loop, on the process's
torch thread when there is one (the embedded engine's loop: `executor=engine`; one thread pool for all
torch work, backend/engine/async_engine.py says why), else on a thread of its own.

The semantic cache may embed with a faster copy in another dtype (`for_cache`: int8 where the C kernels
build), which shares the /v1/embeddings embedder's tokenizer, thread and embedding tables.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from backend.config import default_embedding_model_path
from backend.embed import tuned
from backend.embed.digest import file_digest
from backend.embed.minilm import BertEncoder
from backend.errors import InvalidRequestError
from backend.quant.cpu_gemm import half_weight_gemm_available, onednn_available
from kernels.cpu.build import c_kernels_unavailable

MODEL_NAME = "all-MiniLM-L6-v2"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}
_T = TypeVar("_T")


class Submitter(Protocol):
    """Runs a callable on another thread (concurrent.futures.Executor.submit; AsyncEngine.submit)."""

    def submit(self, fn: Callable[..., _T], /, *args: Any) -> Future[_T]: ...


class Embedder:
    """Loads the model once (blocking); `embed` is safe to call from many coroutines."""

    model_name: str = MODEL_NAME
    _executor: Submitter
    path: Path
    tokenizer: PreTrainedTokenizerBase
    _core: Tokenizer | None
    _encoder: BertEncoder | None

    def __init__(
        self, model_path: str | Path | None = None, batch_size: int = 32, dtype: str = "auto",
        executor: Submitter | None = None, *, share: Embedder | None = None, top: Path | None = None,
    ) -> None:
        """dtype: float32 | bfloat16 | float16 (fp16 weights, fp32 arithmetic) | auto: bfloat16 where oneDNN runs
        it natively, else float16 where FBGEMM is there (x86), else float32. The forward reads its weights once
        per query, so half the bytes is 1.2-1.5x faster; vectors have cosine > 0.9999 to the float32 ones, and
        the labelled cache set scores the same (bench/README "cache", "AVX2 CPUs"). int8 (the W8A8 C kernel, x86 AVX2;
        the semantic cache's default where it builds, `for_cache`, opt-in for /v1/embeddings): int8 weights and
        activations, the fastest on an AMD EPYC (bench/README "cache"), cosine to fp32 0.999 on questions but 0.994
        on "ok", the labelled set unchanged (bench/README "C kernels"). executor: where loading
        and `embed` run (default: one thread of its own, so there is one forward at a time). share: an Embedder of the
        same model whose tokenizer, executor and embedding tables this one uses (`variant`); model_path and executor
        are then its. top: a file of fine-tuned top layers (backend/embed/tuned.py) that replace the model's own."""
        if share is not None:
            self._executor, self.path, self.tokenizer = share._executor, share.path, share.tokenizer
            self._core = share._core
        else:
            self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="embedder")
            self.path = Path(model_path).expanduser() if model_path else default_embedding_model_path()
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            self._core = _padding_core(self.tokenizer)
        model = self._executor.submit(_load, self.path, top).result()
        self.dimensions: int = int(model.config.hidden_size)
        self.max_length: int = int(min(self.tokenizer.model_max_length, model.config.max_position_embeddings))
        bert = model.config.model_type == "bert"
        weights = _encoder_dtype(dtype)
        shared = share._encoder if share else None
        self._encoder = self._executor.submit(BertEncoder, model, weights, shared).result() if bert else None
        # transformers' forward where there is no encoder (the weights live in the encoder's packed copies)
        self.model: PreTrainedModel | None = None if self._encoder else model
        self.dtype: str = _name(weights) if bert else "float32"  # what the forward runs in
        # What produced a vector: the semantic cache keys its scopes by it (vectors of another model or dtype differ).
        self.identity = f"{self.path.name}{'+' + file_digest(top) if top else ''}/{self.dtype}"
        self.top = top  # the fine-tuned top layers in place of the model's own, if any
        self.batch_size = batch_size

    def variant(self, dtype: str) -> Embedder:
        """This model in another dtype, sharing this embedder's tokenizer, executor and (where the activations' dtype
        is the same: float32, float16, int8) embedding tables; this embedder itself where that changes nothing."""
        if self._encoder is None or _name(_encoder_dtype(dtype)) == self.dtype:
            return self  # transformers' forward (not BERT) runs float32 whatever the dtype
        return Embedder(batch_size=self.batch_size, dtype=dtype, share=self, top=self.top)

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """Unit vectors, one per text, and the number of prompt tokens (special tokens included)."""
        return await asyncio.wrap_future(self._executor.submit(self.embed_sync, texts))

    def embed_sync(self, texts: list[str]) -> tuple[list[list[float]], int]:
        vectors: list[list[float]] = []
        tokens = 0
        for start in range(0, len(texts), self.batch_size):
            batch_vectors, batch_tokens = self._embed_batch(texts[start : start + self.batch_size])
            vectors.extend(batch_vectors)
            tokens += batch_tokens
        return vectors, tokens

    def _embed_batch(self, texts: list[str]) -> tuple[list[list[float]], int]:
        input_ids, attention_mask = self._tokenize(texts)
        lengths = attention_mask.sum(dim=1)
        longest = int(lengths.max())
        if longest > self.max_length:
            raise InvalidRequestError(
                f"An input is {longest} tokens long; {self.model_name} reads at most {self.max_length}.",
                param="input",
            )
        with torch.inference_mode():
            hidden = self._hidden(input_ids, attention_mask)
        return mean_pool_normalize(hidden, attention_mask).tolist(), int(lengths.sum())

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(batch, tokens, dimensions): the final hidden states, from our encoder or transformers' forward."""
        if self._encoder is not None:
            return self._encoder(input_ids, attention_mask)
        assert self.model is not None  # one of the two is set (__init__)
        hidden: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden

    async def token_states(self, texts: list[str]) -> list[tuple[list[str], Any, list[float], Any]]:
        """Per text, its word-piece tokens (special tokens left out), their final hidden states (a float32 numpy
        array, tokens x dimensions), the text's unit vector (what `embed` returns), from one forward, and the
        pieces' rows of the word-embedding table (their meaning out of context): what the semantic cache's learned
        matcher reads (gateway/cache/matcher.py)."""
        return await asyncio.wrap_future(self._executor.submit(self.token_states_sync, texts))

    def token_states_sync(self, texts: list[str]) -> list[tuple[list[str], Any, list[float], Any]]:
        out: list[tuple[list[str], Any, list[float], Any]] = []
        if self._encoder is not None:
            table = self._encoder.word
        else:
            assert self.model is not None  # one of the two is set (__init__)
            table = self.model.get_input_embeddings().weight
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            input_ids, attention_mask = self._tokenize(batch)
            longest = int(attention_mask.sum(dim=1).max())
            if longest > self.max_length:
                raise InvalidRequestError(
                    f"An input is {longest} tokens long; {self.model_name} reads at most {self.max_length}.", param="input"
                )
            with torch.inference_mode():
                hidden = self._hidden(input_ids, attention_mask)
                vectors = mean_pool_normalize(hidden, attention_mask).tolist()
            states = hidden.float().numpy()
            for i in range(len(batch)):
                n = int(attention_mask[i].sum())
                ids = input_ids[i, 1 : n - 1]  # [CLS] ... [SEP]
                pieces = self.tokenizer.convert_ids_to_tokens(ids.tolist())
                static = table[ids].detach().float().numpy()
                out.append((pieces, states[i, 1 : n - 1].copy(), vectors[i], static))
        return out

    def _tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask), (batch, longest) each: `tokenizer(texts, padding=True, truncation=False)`."""
        if self._core is None:
            enc = self.tokenizer(texts, padding=True, truncation=False, return_tensors="pt")
            return enc["input_ids"], enc["attention_mask"]
        encodings = self._core.encode_batch(texts)
        return torch.tensor([e.ids for e in encodings]), torch.tensor([e.attention_mask for e in encodings])


def for_cache(main: Embedder, dtype: str, top: Path | None = None) -> Embedder:
    """The semantic cache's embedder (`cache.embedding_dtype`): `same` is `main` (the /v1/embeddings one); `auto` is
    int8 where the C kernels build (the query's embedding is most of a semantic hit's time: int8 is the fastest
    there, and the labelled set scores the same), else `main`; any embedding dtype is `main.variant(dtype)`. top:
    the learned matcher's fine-tuned top layers (backend/embed/tuned.py): always a copy of its own (`same`: in
    `main`'s dtype), sharing `main`'s tokenizer and thread, and its embedding tables where the dtypes agree."""
    if dtype == "auto":
        dtype = "int8" if c_kernels_unavailable() is None else "same"
    if top is not None:
        return Embedder(batch_size=main.batch_size, dtype=main.dtype if dtype == "same" else dtype, share=main, top=top)
    return main if dtype == "same" else main.variant(dtype)


def _padding_core(tokenizer: PreTrainedTokenizerBase) -> Tokenizer | None:
    """A fast tokenizer's Rust core set up once as transformers sets it up on each padded call (no truncation, pad to
    the longest): the wrapper cost ~0.12 ms a short query against ~0.04, on every semantic cache lookup. None for
    slow tokenizers or none with a pad token."""
    if not tokenizer.is_fast or tokenizer.pad_token_id is None:
        return None
    core = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    core.no_truncation()
    core.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
    return core


def _load(path: Path, top: Path | None = None) -> PreTrainedModel:
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    if top is not None:
        tuned.apply(model, top)
    return model


def _encoder_dtype(name: str) -> torch.dtype:
    if name == "auto":
        if onednn_available(torch.bfloat16):
            return torch.bfloat16
        return torch.float16 if half_weight_gemm_available() else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"embedding dtype {name!r}: use auto, float32, bfloat16, float16 or int8")
    return _DTYPES[name]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mean_pool_normalize(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the token states where mask is 1, then L2-normalised (sentence-transformers' recipe)."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * weights).sum(dim=1)
    mean = summed / weights.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)
