"""Cache keys: a hash over everything that shapes the output, one namespace per API key.

- `namespace`: the tenant; entries written under one API key are never seen under another.
- `model_fingerprint`: model id, the files that define the model (weights, config, tokenizer, chat template: name,
  size, mtime), every engine setting that can change the generated text (OUTPUT_ENGINE_FIELDS) and their values as
  the running engine resolved them (`auto` device, KV dtype, INT4 kernel...), plus the operator's salt. The engine
  settings left out are listed with the reason in NON_OUTPUT_ENGINE_FIELDS; tests/test_cache_keys.py fails when an
  EngineConfig field is in neither.
- `upstream_fingerprint`: for a routed model whose deployments are third-party APIs: the model's name, each
  deployment's kind, address and model name, and the operator's salt (the weights are the provider's: `cache.fingerprint`
  is the lever when they change under one name).
- `exact_key`: namespace + fingerprint + endpoint + every output-affecting request field
  + the prompt token ids (so the chat template is part of the key).
- `semantic_scope`: the same, minus the last user message, plus the identity of the embedder
  (model and dtype: a Redis cache may be shared by replicas that embed differently); semantic
  matches happen only inside one scope, so a different system prompt, history, parameter or
  embedder never matches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from backend.config import EngineConfig
from backend.engine.sampling_params import SamplingParams

# Request fields that change nothing in the generated output (transport, bookkeeping).
NON_OUTPUT_FIELDS = frozenset(
    {
        "model", "messages", "prompt", "stream", "stream_options", "user", "metadata", "store", "service_tier",
        "safety_identifier", "prompt_cache_key", "cache",
        # folded into SamplingParams, hashed from there (so 0 and 0.0 are one key)
        "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
        "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
        "include_stop_str_in_output", "max_tokens", "max_completion_tokens",
        "priority",  # scheduling only: the same answer whatever the priority
    }
)  # fmt: skip
# EngineConfig fields that can change the text a request gets: in the fingerprint.
OUTPUT_ENGINE_FIELDS = (
    "model", "quantization", "served_model_name", "chat_template", "dtype", "device", "max_model_len",
    "allow_long_max_model_len",
    "int4_dense_copy", "int4_cpu_kernel", "packed_copy", "kernel_backend", "kv_cache_dtype", "block_size",  # numerics
    "num_speculative_tokens", "speculative_method", "speculative_model", "medusa_min_confidence",  # sampled text
    "speculative_max_batch", "speculative_row_cost",
    "tensor_parallel_size", "pipeline_parallel_size", "num_threads", "deterministic", "cuda_graphs",  # reduction order
    "seed",  # the sampler's generator for requests without a seed
)  # fmt: skip
# EngineConfig fields left out, and why: capacity and scheduling. What runs next to a request, how its prompt is
# chunked, whether its prefix was still cached, are run-time state no key can hold; on the batch-invariant path
# (the default INT4 model on the C kernels, README "Batch invariance") they change nothing, elsewhere they move
# near-tie tokens exactly as batch-mates do.
NON_OUTPUT_ENGINE_FIELDS = {
    "kv_cache_memory_mb": "how many KV blocks fit, not what they hold",
    "kv_window_pool": "which pool the windowed layers' K/V live in, not their values (tests/test_kv_window_pool.py)",
    "huge_pages": "which pages the LM head's bytes lie on, not their values (tests/test_huge_pages.py)",
    "max_num_seqs": "how many sequences run at once (batch composition)",
    "max_num_batched_tokens": "how prompts are chunked (batch composition)",
    "max_waiting": "how long the queue may grow",
    "enable_prefix_caching": "whether earlier prompts' KV blocks are reused (run-time state)",
    "priority_aging_s": "the order waiting requests are served in",
    "background_max_batched_tokens": "how batch-only steps chunk prompts (batch composition)",
}
_MODEL_FILES = ("*.safetensors", "*.gguf", "*.json", "*.jinja")  # weights, config, tokenizer, chat template


def _digest(obj: Any) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()


def namespace(authorization: str | None) -> str:
    """A tenant id derived from the bearer key (never the key itself); "public" without one."""
    if not authorization:
        return "public"
    return hashlib.sha256(authorization.strip().encode()).hexdigest()[:24]


def _weights_stat(path: Path) -> list[Any]:
    files = [path] if path.is_file() else sorted(f for pattern in _MODEL_FILES for f in path.glob(pattern))
    stats = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        stats.append([f.name, st.st_size, st.st_mtime_ns])
    return stats


def model_fingerprint(
    model_id: str, engine: EngineConfig, salt: str = "", resolved: Mapping[str, Any] | None = None
) -> str:
    """Changes whenever the weights, their precision, the kernels that run them or the decoding settings change.

    `resolved`: what the running engine made of the `auto` settings (`AsyncEngine.output_identity`)."""
    fields = {name: getattr(engine, name, None) for name in OUTPUT_ENGINE_FIELDS}
    material = {"id": model_id, "engine": fields, "resolved": dict(resolved or {}), "salt": salt}
    return _digest({**material, "weights": _weights_stat(engine.resolved_model())})[:32]


def upstream_fingerprint(model: str, deployments: Sequence[tuple[str, str, str]], salt: str = "") -> str:
    """`deployments`: (kind, base_url, model) of each; never their API keys."""
    return _digest({"upstream": model, "deployments": sorted(map(list, deployments)), "salt": salt})[:32]


def _params(params: SamplingParams) -> dict[str, Any]:
    out = asdict(params)
    out.pop("priority", None)  # scheduling only, never changes the output
    out["logit_bias"] = sorted(params.logit_bias.items())
    return out


def _extras(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in NON_OUTPUT_FIELDS}


def exact_key(
    ns: str,
    fingerprint: str,
    endpoint: str,
    body: Mapping[str, Any],
    *,
    params: SamplingParams,
    prompt: object,
    prompt_ids: Sequence[int] | None,
) -> str:
    """The exact-match key: identical only when the engine would see an identical request."""
    material = {
        "ns": ns, "fp": fingerprint, "ep": endpoint, "params": _params(params), "extras": _extras(body),
        "prompt": prompt, "ids": list(prompt_ids or ()),
    }  # fmt: skip
    return _digest(material)


def semantic_scope(
    ns: str,
    fingerprint: str,
    embedder: str,
    endpoint: str,
    *,
    body: Mapping[str, Any],
    params: SamplingParams,
    context: object,
) -> str:
    """Where a semantic match may come from: same tenant, model, embedder (`EmbeddingClient.identity`), parameters
    and earlier messages."""
    material = {
        "ns": ns, "fp": fingerprint, "emb": embedder, "ep": endpoint, "params": _params(params), "extras": _extras(body),
        "ctx": context,
    }  # fmt: skip
    return _digest(material)[:32]
