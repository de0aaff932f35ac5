"""What the gateway knows of an engine: typing.Protocols, nothing concrete.

The embedded engine (`backend.engine.async_engine.AsyncEngine`) satisfies `EngineClient`
structurally; the gateway never imports it (the composition root in
`gateway/__main__.py` does, lazily).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from backend.engine.outputs import EngineStats, RequestOutput
from backend.engine.sampling_params import SamplingParams
from gateway.errors import ServiceUnavailable


class EngineClient(Protocol):
    """A text-generation engine: the embedded one, or later an HTTP backend."""

    model_name: str
    max_model_len: int

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: list[int]) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]: ...

    def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str) -> AsyncGenerator[RequestOutput, None]:
        """Deltas for every choice; raises EngineError subclasses on first iteration.

        Stopping the iteration (aclose or cancellation) aborts the request.
        """
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...


class EmbeddingClient(Protocol):
    """A sentence-embedding model."""

    model_name: str
    dimensions: int

    @property
    def identity(self) -> str:
        """What produces the vectors (model, precision): vectors are comparable only within one identity. Read-only, so
        an embedder may compute it (HttpEmbedder)."""
        ...

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """L2-normalised vectors, one per text, and the number of prompt tokens."""
        ...


class NoEngine:
    """The engine of a gateway that only routes to upstreams (no deployment of kind embedded)."""

    model_name = ""
    max_model_len = 0

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def tokenize(self, text: str) -> list[int]:
        raise ServiceUnavailable("This gateway has no embedded engine.")

    def detokenize(self, token_ids: list[int]) -> str:
        raise ServiceUnavailable("This gateway has no embedded engine.")

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]:
        raise ServiceUnavailable("This gateway has no embedded engine.")

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        raise ServiceUnavailable("This gateway has no embedded engine.")
        yield  # noqa: V201  # an async generator, like the real engine's

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats:
        raise ServiceUnavailable("This gateway has no embedded engine.")
