"""Medusa heads (Cai et al. 2024): extra decoding heads on the target's last hidden state propose the next tokens.

The LM head turns the final hidden state h_t (after the final norm) at position t into the token t+1;
Medusa head i turns the same h_t into a guess for token t+2+i. So after every target forward, the hidden
state of the row whose logits produced a sequence's newest token (the sampled token, or the bonus token of
a verification) yields k guesses for the tokens after it: one cheap batched call, no draft model, no KV.
The guesses are a point mass (argmax), verified like copied n-grams (`verify_sampled(..., q=None)`), so
greedy output stays token-identical and sampled output keeps the target's distribution whatever the heads say.

Format (FasterDecoding/Medusa, Medusa-1): a directory with config.json (medusa_num_heads, medusa_num_layers,
base_model_name_or_path) and medusa_lm_head.safetensors or medusa_lm_head.pt, the state dict of an
nn.ModuleList of heads, each nn.Sequential(*[ResBlock] * num_layers, nn.Linear(hidden, vocab, bias=False)):
keys `0.0.linear.weight`, `0.0.linear.bias`, `0.1.weight`, ... (the ResBlock repeats the *same* module, as
in the reference code). Heads whose final linears are all equal (ours: the base lm_head, frozen in
training) run as one matmul over the stacked heads, so proposing costs about one LM-head row per head
with the weights read once; with our optional draft_vocab.json only the rows of the trained-for tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from backend.config import EngineConfig, default_medusa_path
from backend.engine.request import Sequence

WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
# Optional, ours (not in the Medusa format): the token ids the heads were trained to say. Proposing then scores
# only these rows of the shared lm_head (a few thousand instead of 49k: the heads' call cost ~35 ms a step on one
# thread with the full vocabulary, a third of a decode step); a guess outside them would be a trained-for miss.
DRAFT_VOCAB = "draft_vocab.json"
DEFAULT_MIN_CONFIDENCE = 0.5  # as EngineConfig.medusa_min_confidence; bench/README.md ("Medusa heads")


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # starts as (nearly) the identity, so a head starts as the LM head
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.act(self.linear(x))  # a Module call is typed Any
        return x + h


class MedusaHeads(nn.ModuleList):
    """forward(h): (rows, hidden) final hidden states -> (num_heads, rows, vocab) logits; head i guesses t+2+i."""

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int = 1) -> None:
        super().__init__(
            nn.Sequential(*[ResBlock(hidden)] * num_layers, nn.Linear(hidden, vocab, bias=False)) for _ in range(num_heads)
        )
        self.num_layers = num_layers
        self.shared_lm_head = False  # set by share_lm_head() / after loading when all final linears are equal
        self.draft_vocab: torch.Tensor | None = None  # DRAFT_VOCAB: the token ids proposals are chosen among

    def sequentials(self) -> list[nn.Sequential]:
        # a ModuleList yields plain Modules; ours holds only the Sequentials __init__ builds (load_state_dict keeps them)
        return [cast(nn.Sequential, head) for head in self]

    def lm_heads(self) -> list[nn.Linear]:
        return [cast(nn.Linear, head[-1]) for head in self.sequentials()]  # each head ends in its linear (__init__)

    def share_lm_head(self, weight: torch.Tensor | None = None) -> None:
        """Point every head's final linear at one weight (default: head 0's), if all are equal (or one is given)."""
        if weight is None:
            first = self.lm_heads()[0].weight
            if not all(torch.equal(first, h.weight) for h in self.lm_heads()[1:]):
                return
            weight = first
        for linear in self.lm_heads():
            linear.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.shared_lm_head = True

    def transform(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """(num_heads, rows, hidden): the heads' ResBlocks, before the final linear."""
        return torch.stack([head[:-1](hidden) for head in self.sequentials()[:num_heads]])

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """num_heads: only the first ones (a draft of k < len(self) tokens needs no more vocab-sized rows)."""
        z = self.transform(hidden, num_heads)
        if self.shared_lm_head:  # one GEMM: the vocab-sized weight is read once for all heads
            return F.linear(z, self.lm_heads()[0].weight)
        return torch.stack([linear(z_i) for linear, z_i in zip(self.lm_heads()[:num_heads], z, strict=True)])


def save_medusa(heads: MedusaHeads, path: Path, base_model: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write `path` in the Medusa format (safetensors; bf16 halves the file, proposals need no more precision)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": len(heads), "medusa_num_layers": heads.num_layers, "base_model_name_or_path": base_model}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().to("cpu", dtype, copy=True).contiguous() for k, v in heads.state_dict().items()}  # no shared storage
    save_file(state, str(path / WEIGHTS[0]))
    if heads.draft_vocab is not None:
        (path / DRAFT_VOCAB).write_text(json.dumps(heads.draft_vocab.tolist()))


def load_medusa(path: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> MedusaHeads:
    """Heads from a Medusa-format directory (ours or trained elsewhere)."""
    config = json.loads((path / "config.json").read_text())
    files = [path / name for name in WEIGHTS if (path / name).exists()]
    if not files:
        raise FileNotFoundError(f"{path} has no {' or '.join(WEIGHTS)}")
    if files[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(files[0]))
    else:
        state = torch.load(files[0], map_location="cpu", weights_only=True)
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    vocab, hidden = state[f"0.{num_layers}.weight"].shape
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers)
    heads.load_state_dict(state)
    heads.to(device, dtype).eval().requires_grad_(False)
    heads.share_lm_head()
    if (path / DRAFT_VOCAB).exists():
        heads.draft_vocab = torch.tensor(json.loads((path / DRAFT_VOCAB).read_text()), dtype=torch.long, device=device)
    return heads


def load_medusa_heads(
    config: EngineConfig, vocab_size: int, hidden_size: int, dtype: torch.dtype, *, device: str
) -> MedusaHeads | None:
    """The configured heads (default: the self-distilled ones), or None unless speculative_method is medusa."""
    if config.speculative_method != "medusa" or not config.num_speculative_tokens:
        return None
    if config.tensor_parallel_size > 1 or config.pipeline_parallel_size > 1:
        raise ValueError("medusa speculation needs the whole model on one rank (tensor/pipeline_parallel_size 1)")
    path = Path(config.speculative_model).expanduser() if config.speculative_model else default_medusa_path()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no Medusa heads at {path}: train them with `python -m backend.spec.medusa_train`")
    heads = load_medusa(path, dtype, device)
    vocab, hidden = heads.lm_heads()[0].weight.shape
    if (vocab, hidden) != (vocab_size, hidden_size):
        raise ValueError(f"Medusa heads at {path} are {hidden}->{vocab}, the target {hidden_size}->{vocab_size}")
    return heads


class MedusaDrafter:
    """Keeps each sequence's newest hidden state and turns it into a draft before the next step."""

    def __init__(self, heads: MedusaHeads, min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> None:
        self.heads = heads
        # Drafts stop at the first head whose guess is less likely than this (0 = always all k): an unsure guess
        # mostly costs a verified position. Decided from the heads alone, so the draft is still a point mass.
        self.min_confidence = min_confidence
        self._vocab = heads.draft_vocab if heads.shared_lm_head else None  # proposals among these ids (None: all)
        self._vocab_weight = None if self._vocab is None else heads.lm_heads()[0].weight[self._vocab].contiguous()
        self._hidden: dict[Sequence, tuple[int, torch.Tensor]] = {}  # seq -> (num_tokens it belongs to, (hidden,))

    def remember(self, seq: Sequence, hidden: torch.Tensor, num_tokens: int) -> None:
        """hidden: the row whose logits produced the token that makes seq num_tokens long."""
        self._hidden[seq] = (num_tokens, hidden.clone())  # a clone: not a view keeping the step's tensor alive

    def forget_finished(self, running: list[Sequence]) -> None:
        alive = set(running)
        self._hidden = {s: h for s, h in self._hidden.items() if s in alive}

    @torch.inference_mode()
    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[Sequence, list[int]]:
        """wanted: (seq, at most k tokens). One batched head call over the seqs with a current hidden state."""
        ready = [(s, k) for s, k in wanted if s in self._hidden and self._hidden[s][0] == s.num_tokens]
        if not ready:
            return {}
        k = min(max(k for _, k in ready), len(self.heads))
        hidden = torch.stack([self._hidden[s][1] for s, _ in ready])
        if self._vocab_weight is None:
            logits: torch.Tensor = self.heads(hidden, k)  # (k, seqs, vocab)
        else:  # the draft vocabulary's rows only (its softmax, too: a slightly higher confidence)
            logits = F.linear(self.heads.transform(hidden, k), self._vocab_weight)
        probs, tokens = torch.softmax(logits.float(), dim=-1).max(dim=-1)  # (k, seqs)
        if self._vocab is not None:
            tokens = self._vocab[tokens]
        sure = (probs >= self.min_confidence).int().cumprod(dim=0).sum(dim=0).tolist()  # leading confident heads
        drafts = tokens.t().tolist()
        return {s: drafts[j][: min(n, sure[j])] for j, (s, n) in enumerate(ready)}
