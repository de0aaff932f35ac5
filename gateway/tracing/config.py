"""TracesConfig: where spans go and what they may hold (gateway/config.py fills it from YAML and the OTEL_* env)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TracesConfig:
    # The OTLP/HTTP traces URL (…/v1/traces); "" = no tracing at all: no tracer provider, no middleware, nothing
    # recorded. OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, sets it.
    endpoint: str = ""
    service_name: str = "smolgate"  # the resource's service.name (OTEL_SERVICE_NAME)
    # Record prompts and completions (gen_ai.input.messages / gen_ai.output.messages). Off by default: traces often
    # go to a shared backend that should not hold users' text.
    content: bool = False
    max_content_chars: int = 16384  # each recorded message text is cut to this many characters

    def __post_init__(self) -> None:
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"traces.endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.max_content_chars < 0:
            raise ValueError("traces.max_content_chars must be >= 0")

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)
