"""A GGUF's SentencePiece vocabulary served by sentencepiece (backend/model/spm_tokenizer.py): the same ids and text as
transformers' reading of the same file (Gemma 3 270M's Q4_K_M, 262,144 pieces), special tokens, byte fallback, the
chat template and constrained decoding included."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.fetch import fetch_gemma_gguf
from backend.model.spm_tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    SPM_META,
    SPM_MODEL,
    UNKNOWN,
    SpmTokenizer,
    declined,
    save_spm,
    serves,
    written,
)
from backend.model.tokenizer import BUILD_COPIES, CHAT_TEMPLATES, apply_chat_template, load_tokenizer
from backend.model.weights import resolve_model_dir, with_spm
from backend.quant.calibration import HELDOUT
from backend.quant.gguf_header import read_header
from tests.engine_helpers import run_to_completion, token_ids

PAIRS = Path(__file__).parent / "data" / "cache_pairs"
EDGES = [
    "", " ", "  leading", "trailing   ", "a\n\n\n\nb", "\t\ttabs\t", "x" * 500, "Hello world!  How are   you?",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<unused5> <pad> <bos><eos> <unk>",
    "<start_of_turn", "emoji 🤖👍🏽 and a family 👨‍👩‍👧", "\u00a0no-break\u2028line", "\x00\x01 control bytes",
    "é vs e\u0301", "ﬁ ligature", "def f(x):\n    return x**2  # comment\n", "<table><tr><td>1</td></tr></table>",
    "  <b>bold</b>", "日本語のテキスト", "\U0001f9ff\U0001fae8 rare", "\u2581 already escaped \u2581\u2581",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model_dir(fetch_gemma_gguf(), gguf_blocks=True)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> object:
    """transformers' reading of the same file (the tokenizer.json it wrote at conversion), through the tokenizers
    library."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def ours(model_dir: Path) -> SpmTokenizer:
    tokenizer = load_tokenizer(model_dir)
    assert isinstance(tokenizer, SpmTokenizer)
    return tokenizer


def texts() -> list[str]:
    rng = random.Random(0)
    alphabet = "abcXYZ019 .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`\t\n  éüß日本語🤖\u2581"
    noise = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(400)]
    lines = [line for path in sorted(PAIRS.glob("*.tsv")) for line in path.read_text().splitlines()[:200]]
    return EDGES + HELDOUT.read_text().split("\n\n") + lines + noise


def test_ids_are_transformers_ids(ours: SpmTokenizer, reference: object) -> None:
    checked = texts()
    assert len(checked) > 3000
    for text in checked:
        assert ours.encode(text) == reference.encode(text), repr(text)  # type: ignore[attr-defined]
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    assert ours.encode("Hi")[0] == ours.bos_token_id == 2  # the file's add_bos_token


def test_text_is_transformers_text(ours: SpmTokenizer, reference: object) -> None:
    """Every id decodes as transformers decodes it, special tokens kept or skipped, and so do runs of ids that end inside
    a character (the detokenizer waits on the U+FFFD they end with)."""
    everything = [i for i in range(len(ours)) if not ours.sp.is_byte(i)]
    for start in range(0, len(everything), 4096):
        ids = everything[start : start + 4096]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)  # type: ignore[attr-defined]
    for text in [*EDGES, "\U000f0041\U0001fae8", "ŉ ǅ ᾈ"]:
        ids = ours.encode(text, add_special_tokens=False)
        for end in range(len(ids) + 1):
            theirs = reference.decode(ids[:end])  # type: ignore[attr-defined]
            if theirs.endswith("\ufffd"):  # inside a character: both wait (test_invalid_bytes_cost_only_themselves)
                assert ours.decode(ids[:end]).endswith("\ufffd")
            else:
                assert ours.decode(ids[:end]) == theirs
    bytes_used = ours.encode("\U000f0041", add_special_tokens=False)  # private use: byte pieces
    assert all(ours.sp.is_byte(i) for i in bytes_used) and ours.decode(bytes_used[:1]) == "\ufffd"


def test_invalid_bytes_cost_only_themselves(ours: SpmTokenizer, reference: object) -> None:
    """Where byte pieces do not make valid UTF-8, each invalid byte becomes U+FFFD and the valid ones stay (as llama.cpp
    reads them); transformers' decoder turns the whole run of byte pieces into U+FFFD. A model that samples such a run
    loses only the bad bytes, and a run that is a valid character decodes the same either way."""
    def byte(value: int) -> int:
        found = ours.convert_tokens_to_ids(f"<0x{value:02X}>")
        assert found is not None
        return found

    assert ours.decode([byte(0xE6), byte(0x41)]) == "\ufffdA" and reference.decode([byte(0xE6), byte(0x41)]) == "\ufffd" * 2  # type: ignore[attr-defined]
    assert ours.decode([byte(0xC3), byte(0xA9), byte(0xFF)]) == "é\ufffd"
    for text in ("é", "日", "\U0001f9ff"):
        ids = [byte(b) for b in text.encode()]
        assert ours.decode(ids) == reference.decode(ids) == text  # type: ignore[attr-defined]
        assert ours.decode(ids[:-1]).endswith("\ufffd")  # incomplete: the detokenizer waits


def test_special_ids_and_pieces(ours: SpmTokenizer, reference: object) -> None:
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "bos_token", "eos_token"):
        assert getattr(ours, name) == getattr(reference, name), name
    assert len(ours) == len(reference) == 262144  # type: ignore[arg-type]
    for token in ("<end_of_turn>", "<start_of_turn>", "<bos>", "  ", "\t\t", "\n\n", "▁the", "not-a-piece-at-all"):
        assert ours.convert_tokens_to_ids(token) == reference.convert_tokens_to_ids(token.replace("  ", "▁▁")), token  # type: ignore[attr-defined]


@pytest.mark.parametrize("continue_final", [False, True])
def test_the_chat_template_renders_as_transformers_renders_it(ours: SpmTokenizer, reference: object,
                                                              continue_final: bool) -> None:
    source = CHAT_TEMPLATES["gemma"][0]
    ours.chat_template = reference.chat_template = source  # type: ignore[attr-defined]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi  there!\n"},
                {"role": "assistant", "content": "Hello.", "tool_calls": None},
                {"role": "user", "content": [{"type": "text", "text": "Bye <end_of_turn>"}]}]
    if continue_final:
        messages.append({"role": "assistant", "content": "Bye"})
    assert apply_chat_template(ours, messages, continue_final_message=continue_final) == \
        apply_chat_template(reference, messages, continue_final_message=continue_final)


def test_a_folder_converted_before_gets_the_proto_without_converting_again(model_dir: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A converted folder from before the proto was written (no gguf_tokenizer.*) gets it at the next start; without
    it the tokenizer is transformers' tokenizer.json through the tokenizers library, with no Python copies kept."""
    gguf = fetch_gemma_gguf()
    monkeypatch.setenv("SMOLGATE_CACHE", str(tmp_path))
    folder = resolve_model_dir(gguf, gguf_blocks=True)  # converted into the empty cache: the proto written with it
    assert (folder / SPM_MODEL).read_bytes() == (model_dir / SPM_MODEL).read_bytes()
    assert json.loads((folder / SPM_META).read_text()) == json.loads((model_dir / SPM_META).read_text())
    for name in (SPM_MODEL, SPM_META):
        (folder / name).unlink()
    from transformers import AutoTokenizer

    plain = load_tokenizer(folder)
    assert not isinstance(plain, SpmTokenizer) and not any(name in vars(plain) for name in BUILD_COPIES)
    assert all(name in vars(AutoTokenizer.from_pretrained(folder)) for name in BUILD_COPIES)  # what it avoids
    assert plain.encode(EDGES[8]) == load_tokenizer(model_dir).encode(EDGES[8])
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_dir(gguf, gguf_blocks=True) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    assert isinstance(load_tokenizer(folder), SpmTokenizer)
    shutil.rmtree(folder)


def test_constrained_decoding_reads_the_vocabulary(ours: SpmTokenizer) -> None:
    """llguidance's view of the vocabulary: a byte piece its byte, a control token never text; and a JSON schema
    constrains the real model's greedy output to a valid instance."""
    tokens = ours.token_bytes()
    assert tokens[ours.convert_tokens_to_ids("<0x41>")] == b"A" and tokens[106].startswith(b"\xff")
    assert tokens[ours.convert_tokens_to_ids("▁the")] == b" the" and tokens[138] == b"  "
    engine = LLMEngine(EngineConfig(model=str(fetch_gemma_gguf()), chat_template="gemma", enable_prefix_caching=False))
    assert isinstance(engine.tokenizer, SpmTokenizer)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "year": {"type": "integer"}},
              "required": ["city", "year"], "additionalProperties": False}
    params = SamplingParams(temperature=0, max_tokens=48, guided_json=json.dumps(schema))
    ids = apply_chat_template(engine.tokenizer, [{"role": "user", "content": "Where and when were the 1992 Olympics?"}])
    out = run_to_completion(engine, {0: [("r", ids, params)]})["r"]
    value = json.loads(engine.tokenizer.decode(token_ids(out), skip_special_tokens=True))
    assert set(value) == {"city", "year"} and isinstance(value["year"], int) and isinstance(value["city"], str)


def tiny_gguf(path: Path, *, model: str = "llama", space_prefix: bool | None = False, unknown_type: bool = False,
              scores_in_order: bool = True, template: str | None = None) -> Path:
    """A GGUF with only a header: a SentencePiece vocabulary of 256 byte pieces, four controls and a few words."""
    from gguf import GGUFWriter

    words = ["\u2581a", "b", "\u2581ab", "\u2581abb", "c"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)] + words
    types = [CONTROL] * 4 + [BYTE] * 256 + [NORMAL] * len(words)
    scores = [0.0] * 260 + [-float(i) for i in range(len(words))]
    if unknown_type:
        types[-1] = UNKNOWN
    if not scores_in_order:
        scores[-2], scores[-1] = scores[-1], scores[-2]
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    if space_prefix is not None:
        writer.add_add_space_prefix(space_prefix)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("variant", "reason"), [
    ({"space_prefix": None}, "a leading space added"),  # llama.cpp's default: Llama 2, Mistral, Phi-3
    ({"space_prefix": True}, "a leading space added"),
    ({"unknown_type": True}, "pieces of type unknown"),
    ({"scores_in_order": False}, "scores out of id order"),
    ({"model": "gpt2"}, "not SentencePiece's"),
])
def test_a_vocabulary_it_does_not_serve_keeps_transformers_tokenizer(tmp_path: Path, variant: dict, reason: str) -> None:
    """Where transformers', llama.cpp's and SentencePiece's readings could differ, the file keeps transformers'
    tokenizer.json, and the folder says why, so that the check is not made again at every start."""
    header = read_header(tiny_gguf(tmp_path / "v.gguf", **variant))
    assert declined(header)
    assert not save_spm(header, tmp_path) and not serves(tmp_path) and written(tmp_path)
    assert reason in json.loads((tmp_path / SPM_META).read_text())["declined"]
    assert not (tmp_path / SPM_MODEL).exists()


def test_a_served_vocabulary_keeps_the_files_template_and_a_new_format_is_written_again(tmp_path: Path) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    header = read_header(tiny_gguf(tmp_path / "t.gguf", template=template))
    assert declined(header) is None and save_spm(header, tmp_path) and serves(tmp_path)
    tokenizer = SpmTokenizer(tmp_path)
    assert tokenizer.chat_template == template
    assert tokenizer.encode(" ab abb") == [2, 262, 263]  # <bos>, "\u2581ab", "\u2581abb": merged by score
    assert tokenizer.encode("ab") == [2, 4 + ord("a"), 261]  # no "a" piece without a space: its byte
    assert tokenizer.decode([2, 262, 263], skip_special_tokens=True) == " ab abb"
    assert apply_chat_template(tokenizer, [{"role": "user", "content": " ab"}]) == [262]
    meta = json.loads((tmp_path / SPM_META).read_text())
    (tmp_path / SPM_META).write_text(json.dumps({**meta, "format": 0}))  # written by another version
    assert not written(tmp_path) and not serves(tmp_path)
    assert with_spm(header, tmp_path) == tmp_path and serves(tmp_path)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no file left aside
