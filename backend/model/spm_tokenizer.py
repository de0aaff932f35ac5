"""A GGUF's SentencePiece vocabulary (`tokenizer.ggml.model: llama`, as Gemma's files hold it: `declined` says which)
tokenized by Google's sentencepiece library, from the file's own pieces, scores and types.

Why not the tokenizers library, which reads the tokenizer.json transformers writes from the same file: that file is
a BPE model whose merges transformers derives from the scores (514,906 of them for Gemma 3's 262,144 pieces), and the
library holds the vocabulary and the merges in hash maps both ways, ~109 MB resident for Gemma 3, against 44 MB here
(the library's code included). A server that holds a 241 MB file in its own bits should not spend two fifths of that
again on its tokenizer.

The proto is the file's vocabulary as llama.cpp tokenizes it: BPE over the pieces' scores, byte fallback, spaces as
U+2581, no normalization. Control tokens (<start_of_turn>, <bos>, ...) and user-defined ones (runs of spaces, tabs,
newlines, HTML tags) are matched whole in the text, as transformers' tokenizer and llama.cpp's server (special tokens
parsed) do: the proto marks both user-defined (SentencePiece matches only those in text), with a user-defined piece's
spaces written as U+2581 (the text is matched after spaces become U+2581). Which ids are control, and the special ids,
are kept beside the proto (`SPM_META`, with the file's chat template): they decide what `skip_special_tokens` drops.
tests/test_spm_tokenizer.py checks ids and text against transformers' reading of the same file. One difference, kept
on purpose: byte pieces that do not make valid UTF-8 cost only the invalid bytes (each a U+FFFD, as llama.cpp reads
them), where transformers' decoder turns the whole run of byte pieces into U+FFFD.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backend.quant.gguf_header import GgufHeader

SPM_MODEL = "gguf_tokenizer.model"  # the SentencePiece proto built from the GGUF (names no HF checkpoint ships)
SPM_META = "gguf_tokenizer.json"
SPM_FORMAT = 1  # what the files hold; a folder written with another is written again
# GGUF's token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"
log = logging.getLogger(__name__)


def declined(header: GgufHeader) -> str | None:
    """Why this module does not serve the file's vocabulary (None: it does). It serves what it is checked on, where
    transformers' reading, llama.cpp's and SentencePiece's agree: a SentencePiece vocabulary (`llama`) with scores and
    types, no leading space added (`add_space_prefix: false`, as Gemma's files say: where a file adds one, SentencePiece
    adds it once before the whole text and transformers and llama.cpp after each special token), no piece of type
    unknown (transformers spells those out, llama.cpp matches them), and the normal pieces' scores falling in id order
    (transformers builds some families' merges from the order, SentencePiece and llama.cpp merge by score). Any other
    vocabulary keeps transformers' tokenizer.json; its vocabularies are 32k-150k pieces, where that costs 10-30 MB."""
    meta = header.metadata
    if meta.get("tokenizer.ggml.model") != "llama":
        return f"tokenizer model {meta.get('tokenizer.ggml.model')!r}, not SentencePiece's"
    if not all(key in header.arrays for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")):
        return "no scores or token types"
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        return "a leading space added (add_space_prefix)"
    scores, types = header.array("tokenizer.ggml.scores"), header.array("tokenizer.ggml.token_type")
    assert isinstance(scores, np.ndarray) and isinstance(types, np.ndarray)
    if bool((types == UNKNOWN).any()):
        return "pieces of type unknown"
    if not bool((np.diff(scores[types == NORMAL]) < 0).all()):
        return "scores out of id order"
    return None


def model_proto(header: GgufHeader) -> tuple[bytes, dict[str, Any]]:
    """The SentencePiece proto of `header`'s vocabulary (one `declined` passes) and the metadata kept beside it."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    pieces = header.array("tokenizer.ggml.tokens")
    scores, types = header.array("tokenizer.ggml.scores"), header.array("tokenizer.ggml.token_type")
    assert isinstance(pieces, list) and isinstance(scores, np.ndarray) and isinstance(types, np.ndarray)
    meta = header.metadata
    # SentencePiece wants one piece of type UNKNOWN, and matches no such piece in text; the file's own <unk> is a control
    # token, matched in text as transformers and llama.cpp match it. So the proto's unknown piece is one more, past the
    # vocabulary, that byte fallback never produces; bos/eos/pad have no role either (`encode` adds them as the file's
    # add_bos/add_eos say); no leading space is added (`declined`)
    trainer = pb.TrainerSpec(model_type=pb.TrainerSpec.BPE, byte_fallback=True, vocab_size=len(pieces) + 1,
                             unk_id=len(pieces), bos_id=-1, eos_id=-1, pad_id=-1)
    normalizer = pb.NormalizerSpec(name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
                                   escape_whitespaces=True)
    m = pb.ModelProto(trainer_spec=trainer, normalizer_spec=normalizer)
    kind = pb.ModelProto.SentencePiece
    as_proto = {NORMAL: kind.NORMAL, CONTROL: kind.USER_DEFINED, USER_DEFINED: kind.USER_DEFINED, UNUSED: kind.UNUSED,
                BYTE: kind.BYTE}
    for piece, score, t in zip(pieces, scores.tolist(), types.tolist(), strict=True):
        p = m.pieces.add()
        p.piece = piece.replace(" ", SPACE) if t == USER_DEFINED else piece
        p.score = score
        p.type = as_proto.get(t, kind.NORMAL)
    extra = m.pieces.add()
    extra.piece, extra.score, extra.type = "<smolgate-unknown>", 0.0, kind.UNKNOWN
    special = {name: meta.get(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "unknown", "padding")}
    kept = {
        "control": [i for i, t in enumerate(types.tolist()) if t == CONTROL],
        "user_defined": [i for i, t in enumerate(types.tolist()) if t == USER_DEFINED],
        "bos_token_id": special["bos"], "eos_token_id": special["eos"], "unk_token_id": special["unknown"],
        "pad_token_id": special["padding"],
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": header.chat_template,
    }
    return m.SerializeToString(), kept


def save_spm(header: GgufHeader, out: Path) -> bool:
    """Write the proto and its metadata into `out` where this module serves the file's vocabulary (`declined`), else
    metadata that says why not; True when the proto was written. Each file is written under a name of its own and
    renamed, the metadata last: a folder with the metadata has both whole, whichever process wrote them."""
    import sentencepiece

    reason = declined(header)
    files: list[tuple[str, bytes]] = []
    if reason is None:
        proto, meta = model_proto(header)
        try:
            sentencepiece.SentencePieceProcessor(model_proto=proto)
        except RuntimeError as exc:  # duplicate or empty pieces, byte pieces missing: transformers' reading instead
            reason = f"SentencePiece refused it: {exc}"
        else:
            files.append((SPM_MODEL, proto))
    if reason is not None:
        log.info("%s: the tokenizer stays transformers' tokenizer.json: %s", header.path.name, reason)
        meta = {"declined": reason}
    files.append((SPM_META, json.dumps({"format": SPM_FORMAT, **meta}).encode()))
    for name, data in files:
        fd, aside = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(aside, out / name)
    return reason is None


def _written_meta(model_dir: Path) -> dict[str, Any] | None:
    """The metadata this version (`SPM_FORMAT`) wrote into `model_dir`, or None."""
    path = model_dir / SPM_META
    meta = json.loads(path.read_text()) if path.is_file() else None
    return meta if isinstance(meta, dict) and meta.get("format") == SPM_FORMAT else None


def serves(model_dir: Path) -> bool:
    """Whether `model_dir` holds this module's tokenizer, written by this version (`SPM_FORMAT`)."""
    meta = _written_meta(model_dir)
    return meta is not None and "declined" not in meta and (model_dir / SPM_MODEL).is_file()


def written(model_dir: Path) -> bool:
    """Whether `model_dir` holds this version's answer for its vocabulary: the proto, or why there is none."""
    return _written_meta(model_dir) is not None


class SpmTokenizer:
    """What the engine asks of a tokenizer (transformers' names and semantics): encode, decode, the special ids, the
    chat template, and llguidance's view for constrained decoding."""

    def __init__(self, model_dir: Path) -> None:
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_MODEL))
        meta = json.loads((model_dir / SPM_META).read_text())
        self.control = frozenset(meta["control"])
        self.user_defined = frozenset(meta["user_defined"])
        self.bos_token_id: int | None = meta["bos_token_id"]
        self.eos_token_id: int | None = meta["eos_token_id"]
        self.unk_token_id: int | None = meta["unk_token_id"]
        self.pad_token_id: int | None = meta["pad_token_id"]
        self.add_bos, self.add_eos = meta["add_bos_token"], meta["add_eos_token"]
        self.chat_template: str | None = meta["chat_template"]  # the file's own (tokenizer.chat_template), if any

    def __len__(self) -> int:
        return int(self.sp.get_piece_size()) - 1  # the proto's own unknown piece is past the vocabulary

    def _token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.convert_ids_to_tokens(token_id)

    @property
    def bos_token(self) -> str | None:
        return self._token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self._token(self.eos_token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.sp.encode(text)
        if add_special_tokens:
            if self.add_bos and self.bos_token_id is not None:
                ids.insert(0, self.bos_token_id)
            if self.add_eos and self.eos_token_id is not None:
                ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.control]
        return str(self.sp.decode(list(ids)))

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """A piece's id (a user-defined piece by its text, spaces and all); the unknown id for one not in the
        vocabulary."""
        found = int(self.sp.piece_to_id(token.replace(" ", SPACE)))
        return self.unk_token_id if found >= len(self) else found

    def convert_ids_to_tokens(self, token_id: int) -> str:
        piece = str(self.sp.id_to_piece(token_id))
        return piece.replace(SPACE, " ") if token_id in self.user_defined else piece

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, tokenize: bool = True) -> list[int] | str:
        """The template rendered by transformers' renderer (the same Jinja environment and special-token variables
        as its tokenizers), then encoded without added special tokens (the template writes them)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]  # as transformers normalizes them
        names = {"bos_token": self.bos_token, "eos_token": self.eos_token, "unk_token": self._token(self.unk_token_id),
                 "pad_token": self._token(self.pad_token_id)}
        rendered, _ = render_jinja_template(
            [chat], chat_template=self.chat_template, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **{k: v for k, v in names.items() if v is not None})
        text: str = rendered[0]
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def token_bytes(self) -> list[bytes]:
        """Each id's bytes as llguidance reads a vocabulary: a byte piece its byte, a control token its text after
        0xFF (never produced by text), everything else its text with U+2581 as a space."""
        out: list[bytes] = []
        for i in range(len(self)):
            piece = str(self.sp.id_to_piece(i))
            if self.sp.is_byte(i):
                out.append(bytes([int(piece[3:5], 16)]))  # <0xNN>
            elif i in self.control:
                out.append(b"\xff" + piece.encode())
            else:
                out.append(piece.replace(SPACE, " ").encode())
        return out

    def guidance(self, n_vocab: int) -> Any:
        """llguidance's tokenizer over this vocabulary, `n_vocab` ids (the model's rows; ids past the vocabulary are
        never allowed)."""
        import llguidance

        tokens = self.token_bytes() + [b""] * max(0, n_vocab - len(self))
        encode: Callable[[str], list[int]] = lambda text: self.encode(text, add_special_tokens=False)  # noqa: E731
        wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokens, encode, self))
        return llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=self.eos_token_id)


class _Vocabulary:
    """The shape llguidance.TokenizerWrapper reads: token bytes, eos/bos ids, special ids, and a call that encodes."""

    def __init__(self, tokens: list[bytes], encode: Callable[[str], list[int]], tokenizer: SpmTokenizer) -> None:
        self.tokens, self._encode = tokens, encode
        self.eos_token_id, self.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
        self.special_token_ids = sorted(tokenizer.control)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            raise TypeError("text, not bytes")  # TokenizerWrapper then passes str
        return self._encode(text)
