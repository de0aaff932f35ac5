"""Request body -> SamplingParams: every sampling option OpenAI (and vLLM's extensions) define."""

from __future__ import annotations

from dataclasses import replace

from backend.engine.sampling_params import SamplingParams
from gateway.keys.config import KeyPolicy
from gateway.protocol import fields as f
from gateway.protocol.fields import Body

# Keys read here; each endpoint adds its own.
SAMPLING_KEYS = frozenset(
    {
        "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
        # vLLM-style extensions
        "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
        "include_stop_str_in_output", "priority",
    }
)  # fmt: skip


def _or(value: float | int | bool | None, default: float | int | bool) -> float | int | bool:
    return default if value is None else value


def sampling_params(
    body: Body, *, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None
) -> SamplingParams:
    """Build (and so validate) the engine's SamplingParams; a bad value raises InvalidRequestError."""
    return SamplingParams(
        n=int(_or(f.opt_int(body, "n"), 1)),
        max_tokens=max_tokens,
        min_tokens=int(_or(f.opt_int(body, "min_tokens"), 0)),
        temperature=float(_or(f.opt_float(body, "temperature"), 1.0)),
        top_p=float(_or(f.opt_float(body, "top_p"), 1.0)),
        top_k=int(_or(f.opt_int(body, "top_k"), 0)),
        min_p=float(_or(f.opt_float(body, "min_p"), 0.0)),
        seed=f.opt_int(body, "seed"),
        presence_penalty=float(_or(f.opt_float(body, "presence_penalty"), 0.0)),
        frequency_penalty=float(_or(f.opt_float(body, "frequency_penalty"), 0.0)),
        repetition_penalty=float(_or(f.opt_float(body, "repetition_penalty"), 1.0)),
        logit_bias=f.logit_bias(body),
        stop=f.opt_stop(body),
        stop_token_ids=f.opt_int_list(body, "stop_token_ids"),
        ignore_eos=bool(_or(f.opt_bool(body, "ignore_eos"), False)),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        include_stop_str_in_output=bool(_or(f.opt_bool(body, "include_stop_str_in_output"), False)),
        priority=int(_or(f.opt_int(body, "priority", lo=-(2**31), hi=2**31 - 1), 0)),
    )


def with_key_priority(params: SamplingParams, body: Body, policy: KeyPolicy | None) -> SamplingParams:
    """The API key's priority (its `priority`, or `api_key_priorities`) when the request sets none itself; what a
    request may set is checked against the key before (gateway/keys/guard.py)."""
    if body.get("priority") is not None or policy is None or policy.priority == params.priority:
        return params
    return replace(params, priority=policy.priority)
