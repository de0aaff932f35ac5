"""The API key's scheduling priority on a request's SamplingParams."""

from __future__ import annotations

from dataclasses import replace

from backend.engine.sampling_params import SamplingParams
from gateway.keys.config import KeyPolicy
from gateway.protocol.fields import Body


def with_key_priority(params: SamplingParams, body: Body, policy: KeyPolicy | None) -> SamplingParams:
    """The API key's priority (its `priority`, or `api_key_priorities`) when the request sets none itself; what a
    request may set is checked against the key before (gateway/keys/guard.py)."""
    if body.get("priority") is not None or policy is None or policy.priority == params.priority:
        return params
    return replace(params, priority=policy.priority)
