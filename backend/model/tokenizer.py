"""The model's own tokenizer and chat template, through transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from backend.errors import InvalidRequestError


def load_tokenizer(model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(model_dir)


def apply_chat_template(
    tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False
) -> list[int]:
    """Token ids of the chat prompt built by the model's own template. `continue_final_message`: the prompt ends
    inside the final (assistant) message, without its end-of-turn, so the answer continues it (a prefill)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
    try:
        ids = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            tokenize=True,
        )
    except Exception as exc:  # template errors are the caller's (e.g. a role the template rejects)
        raise InvalidRequestError(f"could not apply the chat template: {exc}", param="messages") from exc
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
