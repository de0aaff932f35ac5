"""SamplingParams: the only way sampling options enter the engine (frozen, validated once)."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.errors import InvalidRequestError


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param=param)


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI's sampling options plus vLLM's common extensions.

    `max_tokens=None` means "until the context window is full". `logprobs=None` returns
    no logprobs; `logprobs=k` returns the chosen token's logprob and the top-k alternatives.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # for completions' echo + logprobs
    # Prompt positions before this one get no logprob (None), so the prefix cache may serve them: the cache
    # verifier scores only a cached answer appended to a prompt whose template prefix is already cached.
    prompt_logprobs_from: int = 0
    include_stop_str_in_output: bool = False
    # Constrained decoding (backend/engine/guided.py): at most one of these; plain data, so the gateway can build it.
    guided_json: str | None = None  # a JSON schema (text) the output must validate against
    guided_json_object: bool = False  # the output is any JSON object
    guided_grammar: str | None = None  # a llguidance Lark grammar (the gateway builds these for tool calls)
    speculate: bool = True  # let the engine speculate for this request when it is configured to
    spec_reference: str | None = None  # text the n-gram proposer may copy from (e.g. a near-miss cached answer)
    # Scheduling (vLLM's extension field): lower = served earlier and preempted later; ages (backend/engine/priority.py).
    priority: int = 0

    def __post_init__(self) -> None:
        _check(1 <= self.n <= 128, "n must be between 1 and 128", "n")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1", "max_tokens")
        _check(self.min_tokens >= 0, "min_tokens must be non-negative", "min_tokens")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens must not exceed max_tokens",
            "min_tokens",
        )
        _check(0.0 <= self.temperature <= 2.0, "temperature must be between 0 and 2", "temperature")
        _check(0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]", "top_p")
        _check(self.top_k >= -1, "top_k must be -1, 0 or positive", "top_k")
        _check(0.0 <= self.min_p <= 1.0, "min_p must be between 0 and 1", "min_p")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]", "presence_penalty")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]", "frequency_penalty")
        _check(0.0 < self.repetition_penalty <= 2.0, "repetition_penalty must be in (0, 2]", "repetition_penalty")
        bias_ok = all(-100.0 <= b <= 100.0 for b in self.logit_bias.values())
        _check(bias_ok, "logit_bias values must be in [-100, 100]", "logit_bias")
        _check(len(self.stop) <= 16 and all(self.stop), "stop must be at most 16 non-empty strings", "stop")
        _check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be between 0 and 20", "logprobs")
        _check(
            self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
            "prompt_logprobs must be between 0 and 20",
            "prompt_logprobs",
        )
        _check(self.prompt_logprobs_from >= 0, "prompt_logprobs_from must not be negative", "prompt_logprobs_from")
        _check(-(2**31) <= self.priority < 2**31, "priority must be a 32-bit integer", "priority")
        modes = (self.guided_json is not None) + self.guided_json_object + (self.guided_grammar is not None)
        _check(modes <= 1, "at most one of guided_json, guided_json_object and guided_grammar", "response_format")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def guided(self) -> bool:
        return self.guided_json is not None or self.guided_json_object or self.guided_grammar is not None

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
