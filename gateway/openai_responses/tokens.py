"""Input token counts (POST /v1/responses/input_tokens) and `truncation: "auto"`.

Both count the prompt exactly as generation would build it: the chat pipeline's own parsing (the tool
prompt included) and the engine's chat template. A gateway without an embedded engine (routing only)
estimates with the router's counter (gateway/routing/token_count.py) and does not truncate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.context import GatewayContext
from gateway.protocol.requests import parse_chat
from gateway.routing.token_count import load_counter, prompt_tokens


class TokenCounter:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self._estimate: Callable[[str], int] | None = None

    def exact(self, body: dict[str, Any]) -> bool:
        return self.limit(body) > 0

    def limit(self, body: dict[str, Any]) -> int:
        """The context window of the model `body` names (0: not an embedded model's, counts are estimates)."""
        return self.ctx.engine_for(body.get("model")).max_model_len

    def count(self, body: dict[str, Any]) -> int:
        messages = parse_chat({k: v for k, v in body.items() if k != "cache"}).messages
        if self.exact(body):
            return len(self.ctx.engine_for(body.get("model")).apply_chat_template(messages, add_generation_prompt=True))
        if self._estimate is None:
            self._estimate = load_counter(self.ctx.config.routing.router.tokenizer)
        return prompt_tokens(self._estimate, {"messages": messages})

    def truncated(self, body: dict[str, Any], max_output_tokens: int | None) -> dict[str, Any]:
        """The body with the oldest turns dropped until the prompt and the output fit the context window
        (system messages and the last message stay; an assistant turn's tool results go with it)."""
        limit = self.limit(body)
        if not limit:
            return body
        reserve = max_output_tokens or min(256, limit // 4)
        messages = list(body["messages"])
        while self.count({**body, "messages": messages}) + reserve > limit:
            first = next((i for i, m in enumerate(messages[:-1]) if m["role"] != "system"), None)
            if first is None:
                break
            end = first + 1
            if messages[first].get("tool_calls"):
                while end < len(messages) - 1 and messages[end]["role"] == "tool":
                    end += 1
            del messages[first:end]
        return {**body, "messages": messages}
