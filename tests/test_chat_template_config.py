"""engine.chat_template: a family's standard template by name, or a Jinja file, given to a tokenizer; a wrong value is
one line naming the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import default_model_path
from backend.errors import ModelLoadError
from backend.model.tokenizer import apply_chat_template, load_tokenizer, set_chat_template


@pytest.fixture
def tokenizer():
    return load_tokenizer(default_model_path())  # SmolLM2: its own template is ChatML with a default system turn


def test_chatml_by_name_ends_turns_at_im_end(tokenizer) -> None:
    ends = set_chat_template(tokenizer, "chatml")
    assert ends == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}])
    assert tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # no default system turn


def test_a_jinja_file(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>")
    assert set_chat_template(tokenizer, str(path)) == []
    assert tokenizer.decode(apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}])) == "[user] hi\n>"


def test_an_unknown_template_names_the_choices(tokenizer) -> None:
    with pytest.raises(ModelLoadError, match=r"chat_template 'mistral': neither a template name \(gemma, chatml\) nor a file"):
        set_chat_template(tokenizer, "mistral")


def test_gemma_keeps_every_system_message_in_order(tokenizer) -> None:
    # Codex sends two developer (system) messages before the user's: both reach the first user turn
    set_chat_template(tokenizer, "gemma")
    second = [{"type": "text", "text": "Second."}]
    messages = [{"role": "system", "content": "First rules."}, {"role": "system", "content": second},
                {"role": "user", "content": "hi"}]
    text = tokenizer.decode(apply_chat_template(tokenizer, messages))
    assert text.endswith("<start_of_turn>user\nFirst rules.\n\nSecond.\n\nhi<end_of_turn>\n<start_of_turn>model\n"), text
