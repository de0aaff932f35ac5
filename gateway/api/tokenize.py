"""POST /tokenize and /detokenize in vLLM's shape, for the embedded chat model; key-checked like /v1/ (the
middleware), and a key limited to some models may name only those.

/tokenize: `{model?, prompt, add_special_tokens=true}` (a completion prompt, as /v1/completions tokenizes it) or
`{model?, messages, add_generation_prompt=true, continue_final_message=false}` (the chat template, as
/v1/chat/completions applies it); `return_token_strs` adds each token's text. Answer: `{count, max_model_len,
tokens, token_strs}`. /detokenize: `{model?, tokens}` -> `{prompt}`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.context import GatewayContext
from gateway.errors import InvalidRequest
from gateway.ops.record import record_of
from gateway.protocol import fields as f
from gateway.protocol.jsonio import json_response, read_json
from gateway.protocol.messages import template_messages

_TOKENIZE_KEYS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "continue_final_message",
                  "return_token_strs"}  # fmt: skip
_DETOKENIZE_KEYS = {"model", "tokens"}


class Tokenizer:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def _body(self, request: Request, known: set[str]) -> dict[str, Any]:
        body = await read_json(request, self.ctx.config.max_body_bytes)
        f.reject_unknown(body, known)
        name = f.opt_str(body, "model")
        rec = record_of(request)
        model = self.ctx.catalog.resolve(name, "chat").id if name else self.ctx.engine.model_name
        policy = rec.policy if rec.policy is not None else self.ctx.guard.anonymous
        if not self.ctx.guard.allows(policy, model, self.ctx.catalog.canonical):
            raise self.ctx.guard.not_found(name or model)
        route = self.ctx.config.routing.model(model)
        if route is not None and any(d.kind != "embedded" for d in route.deployments):  # another tokenizer: no guess
            raise InvalidRequest(f"The model `{name}` is served by an upstream: /tokenize and /detokenize serve the "
                                 "embedded engine's model only.", param="model")  # fmt: skip
        rec.model = model
        return body

    async def tokenize(self, request: Request) -> Response:
        body = await self._body(request, _TOKENIZE_KEYS)
        engine = self.ctx.engine
        if "messages" in body:
            if "prompt" in body:
                raise InvalidRequest("Give either 'prompt' or 'messages', not both.", param="prompt")
            messages = template_messages(body.get("messages"))
            add_generation = f.opt_bool(body, "add_generation_prompt")
            continue_final = bool(f.opt_bool(body, "continue_final_message"))
            if continue_final and add_generation:
                raise InvalidRequest("'continue_final_message' and 'add_generation_prompt' cannot both be true.",
                                     param="continue_final_message")  # fmt: skip
            ids = engine.apply_chat_template(messages, not continue_final if add_generation is None else add_generation,
                                             continue_final)  # fmt: skip
        else:
            prompt = f.req_str(body, "prompt") if body.get("prompt") != "" else ""
            ids = engine.tokenize(prompt)
            if f.opt_bool(body, "add_special_tokens") is False:  # the tokenizer's prefix (e.g. <bos>) taken off
                special = engine.tokenize("")
                ids = ids[len(special) :] if ids[: len(special)] == special else ids
        strs = [engine.detokenize([t]) for t in ids] if f.opt_bool(body, "return_token_strs") else None
        return json_response({"count": len(ids), "max_model_len": engine.max_model_len, "tokens": list(ids), "token_strs": strs})

    async def detokenize(self, request: Request) -> Response:
        body = await self._body(request, _DETOKENIZE_KEYS)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            raise InvalidRequest("'tokens' must be a list of token ids (non-negative integers).", param="tokens")
        try:
            text = self.ctx.engine.detokenize(tokens)
        except (IndexError, OverflowError, TypeError, ValueError) as exc:  # an id past the vocabulary
            message = f"'tokens' holds an id this model does not know ({type(exc).__name__})."
            raise InvalidRequest(message, param="tokens") from None
        return json_response({"prompt": text})
