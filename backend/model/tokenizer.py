"""The model's own tokenizer and chat template, through transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from backend.errors import InvalidRequestError, ModelLoadError
from backend.model.spm_tokenizer import SpmTokenizer, serves
from backend.quant.gguf_blocks import quant_method

# Standard templates by family name: (Jinja source, the end-of-turn tokens that end an answer). Content may be a string
# or a list of text parts (OpenAI's and Anthropic's shapes, flattened the same way).
_CONTENT = "{%- if m['content'] is string -%}{{ m['content'] | trim }}{%- else -%}{%- for p in m['content'] -%}" \
           "{%- if p['type'] == 'text' -%}{{ p['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
CHAT_TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    # Gemma's turn format; system messages (all of them, in order: Codex sends two) are prefixed to the next turn
    # (Gemma has no system role)
    "gemma": (
        "{{ bos_token }}{%- set ns = namespace(prefix='') -%}{%- for m in messages -%}"
        "{%- if m['role'] == 'system' -%}{%- set ns.prefix = ns.prefix + (m['content'] if m['content'] is string else "
        "m['content'] | map(attribute='text') | join('')) + '\n\n' -%}{%- else -%}"
        "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + ns.prefix }}"
        "{%- set ns.prefix = '' -%}" + _CONTENT + "{{ '<end_of_turn>\n' }}{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}",
        ("<end_of_turn>",),
    ),
    "chatml": (
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\n' }}" + _CONTENT + "{{ '<|im_end|>\n' }}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}",
        ("<|im_end|>",),
    ),
}


# What transformers' tokenizer classes (GemmaTokenizer, Qwen2Tokenizer, LlamaTokenizer, ...) keep after building the
# Rust tokenizer from them: Python copies of the vocabulary and the merges, read by nothing after __init__ (encoding,
# decoding, special tokens and get_vocab go through the Rust tokenizer). Gemma 3's 262,144 tokens and 514,906 merges
# held 146 MB of Python objects for the life of the engine.
BUILD_COPIES = ("_vocab", "_merges")


# A GGUF converted by backend.quant (its tokenizer.json written by transformers' own reading of the file)
CONVERTED_GGUF = frozenset({"gguf_blocks", "gguf_grouped"})


def load_tokenizer(model_dir: Path) -> Any:
    """The model's tokenizer. A GGUF with a SentencePiece vocabulary that spm_tokenizer.py serves (Gemma's) gets its proto,
    built from the file at conversion (backend/model/spm_tokenizer.py: 44 MB resident for Gemma 3's vocabulary, where
    the tokenizers library holds ~109). Any other converted GGUF's tokenizer.json was written by transformers from the file's own
    tokenizer: the tokenizers library reads it as it is, and no Python copy of the vocabulary is built at all (Gemma
    3's family class built one and dropped it, BUILD_COPIES, leaving 13 MB more resident: 122 against 109 MB, its Rust
    tables ~96; the same ids, checked in tests/test_gemma3_gguf.py). An HF checkpoint gets its family's class, as
    transformers gives it: some (LlamaTokenizer on an older SentencePiece checkpoint) rebuild their normalizer from code
    and can split a few strings unlike the file's own pipeline."""
    if serves(model_dir):
        return SpmTokenizer(model_dir)
    if quant_method(model_dir) in CONVERTED_GGUF and (model_dir / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for name in BUILD_COPIES:
        vars(tokenizer).pop(name, None)
    return tokenizer


def set_chat_template(tokenizer: Any, spec: str) -> list[int]:
    """Give `tokenizer` the template `spec` names (a family in CHAT_TEMPLATES, or a .jinja file's path); returns the
    ids of its end-of-turn tokens (that the tokenizer knows as single tokens), which end an answer like EOS."""
    if spec in CHAT_TEMPLATES:
        source, ends = CHAT_TEMPLATES[spec]
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"chat_template {spec!r}: neither a template name ({', '.join(CHAT_TEMPLATES)}) nor a file")
        source, ends = path.read_text(), ()
    tokenizer.chat_template = source
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ends]
    return [i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id]


def apply_chat_template(
    tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False
) -> list[int]:
    """Token ids of the chat prompt built by the model's own template. `continue_final_message`: the prompt ends
    inside the final (assistant) message, without its end-of-turn, so the answer continues it (a prefill)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError(
            "this model has no chat template: use /v1/completions, or configure one with engine.chat_template "
            f"(SMOLGATE_CHAT_TEMPLATE): {' or '.join(CHAT_TEMPLATES)} by name, or a .jinja file",
            param="messages",
        )
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
