"""python -m backend.spec.medusa_train: self-distil Medusa heads for the default model on a CPU in minutes.

Self-distillation: the heads learn what the *base model* predicts, not what the text says, because a draft
is accepted when it equals the target's own choice. The training text is the base's own greedy answers to
chat requests about the shipped calibration text (medusa_data.py; `--data passages`: the passages themselves,
chat-formatted, which transfer poorly to chat answers). The frozen base (HF transformers, fp32) runs once
over it; every answer position t keeps its final hidden state h_t (after the final norm) and the base's
greedy next token pred_t. Head i at position t is trained to say pred_{t+i+1}: the token the base will
choose i+1 steps after the token h_t's own logits chose.

Each head's final linear is the base's lm_head, frozen and shared (the Medusa tip: start from the lm_head;
keeping it frozen trains only the small ResBlocks, and the engine then runs all heads as one matmul). Cross
entropy against pred (hard labels: greedy acceptance checks the argmax), later heads weighted 0.8^i as in
Medusa. Acceptance on heldout.txt is printed at the end: per-head top-1 agreement with the base, and the mean
number of leading heads that agree (the draft tokens a greedy verify would accept, teacher-forced), then per
min_confidence threshold the mean draft length proposed and accepted (to choose `medusa_min_confidence`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from backend.config import default_medusa_path, default_model_path
from backend.model.tokenizer import apply_chat_template
from backend.quant.calibration import CALIBRATION, HELDOUT, token_ids
from backend.quant.cpu_gemm import dense_dtype
from backend.spec.medusa import MedusaHeads, save_medusa
from backend.spec.medusa_data import VERSION, cached_answers

PROMPT_TOKENS = 48  # of each passage quoted in the user turn; the rest is the assistant's answer
IGNORE = -100


class CausalLM(Protocol):
    """What training reads of the base: an HF causal LM (which mypy reads as Any: pyproject.toml's transformers)."""

    model: nn.Module  # the decoder: (1, T) ids -> outputs whose last_hidden_state is after the final norm
    lm_head: nn.Linear

    def requires_grad_(self, requires_grad: bool = True) -> object: ...


@dataclass
class Features:
    hidden: torch.Tensor  # (N, hidden) the base's final hidden states
    targets: torch.Tensor  # (N, num_heads) the base's greedy token i+1 positions later, IGNORE past a sample's end


def chat_samples(tokenizer: object, path: Path, chunk_tokens: int) -> list[list[int]]:
    """The text cut into passages of chunk_tokens, each one chat: quote its start, answer with the rest."""
    ids = token_ids(tokenizer, path)
    samples = []
    for start in range(0, max(len(ids) - PROMPT_TOKENS, 1), chunk_tokens):
        window = ids[start : start + chunk_tokens]
        quote, answer = tokenizer.decode(window[:PROMPT_TOKENS]), tokenizer.decode(window[PROMPT_TOKENS:])  # type: ignore[attr-defined]
        messages = [{"role": "user", "content": f"Continue this text:\n{quote}"}, {"role": "assistant", "content": answer}]
        samples.append(apply_chat_template(tokenizer, messages, add_generation_prompt=False))
    return samples


@torch.inference_mode()
def features(model: CausalLM, samples: list[list[int]], num_heads: int, starts: list[int] | None = None) -> Features:
    """Run the frozen base once over every sample (precomputed: training never runs the base again).
    starts: per sample, the first position to learn from (the answer's start; earlier ones are only context)."""
    hidden, targets = [], []
    for n, ids in enumerate(samples):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dense_dtype("cpu") == torch.bfloat16):  # AMX matmuls
            h = model.model(torch.tensor([ids])).last_hidden_state[0].float()  # (T, hidden), after the final norm
        pred = model.lm_head(h).argmax(dim=-1)  # pred[t]: the base's token after position t (fp32, as served)
        t = torch.full((len(ids), num_heads), IGNORE)
        for i in range(num_heads):
            t[: len(ids) - i - 1, i] = pred[i + 1 :]
        first = max((starts[n] if starts else 0) - 1, 0)  # the last prompt position predicts the answer's start
        hidden.append(h[first:])
        targets.append(t[first:])
    return Features(torch.cat(hidden), torch.cat(targets))


def head_loss(heads: MedusaHeads, hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight: the shared lm_head in the CPU's dense dtype (bf16 with AMX: ~3x fp32; the vocab matmul is nearly
    all of a step; fp32 on an AVX2 CPU, which emulates bf16)."""
    z = heads.transform(hidden)  # (num_heads, rows, hidden)
    logits = F.linear(z.to(weight.dtype), weight).float()  # (num_heads, rows, len(vocab))
    weights = [0.8**i for i in range(len(heads))]
    losses = [F.cross_entropy(logits[i], targets[:, i], ignore_index=IGNORE) * w for i, w in enumerate(weights)]
    return sum(losses, torch.zeros((), device=logits.device)) / sum(weights)  # a Tensor start: sum's 0 is an int


def train(heads: MedusaHeads, data: Features, seconds: float, lr: float, *, batch: int, max_steps: int = 10**9,
          seed: int = 0, log_every: int = 20) -> list[float]:
    """Adam on the ResBlocks for `seconds` (or max_steps); returns the loss of every step.

    The softmax runs over the whole vocabulary: restricted to the tokens the base predicts in the data (10x
    cheaper), the heads' argmax over the full vocabulary drifted to untrained tokens (heldout agreement fell).
    """
    weight = heads.lm_heads()[0].weight.detach().to(dense_dtype("cpu"))
    opt = torch.optim.Adam([p for p in heads.parameters() if p.requires_grad], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and len(losses) < max_steps:
        # lr decays linearly with the time left (to 10%): a budget of minutes ends far from converged, and the
        # decay turns the last steps' noise into progress.
        for group in opt.param_groups:
            group["lr"] = lr * max(0.1, min(left / seconds, 1 - len(losses) / max_steps))
        idx = torch.randint(len(data.hidden), (batch,), generator=gen)
        loss = head_loss(heads, data.hidden[idx], data.targets[idx], weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log_every and len(losses) % log_every == 0:
            print(f"step {len(losses)}: loss {sum(losses[-log_every:]) / log_every:.3f}", flush=True)
    return losses


@torch.inference_mode()
def acceptance(heads: MedusaHeads, data: Features, rows: int = 512) -> tuple[list[float], float]:
    """(per-head top-1 agreement with the base, mean leading heads that agree) over positions where all heads count."""
    keep = (data.targets != IGNORE).all(dim=1)
    hidden, targets = data.hidden[keep], data.targets[keep]
    correct = torch.cat([(heads(hidden[i : i + rows]).argmax(dim=-1).t() == targets[i : i + rows])
                         for i in range(0, len(hidden), rows)])  # (N, num_heads)
    leading = correct.int().cumprod(dim=1).sum(dim=1)
    return correct.float().mean(dim=0).tolist(), float(leading.float().mean())


@torch.inference_mode()
def confidence_sweep(heads: MedusaHeads, data: Features, thresholds: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7),
                     rows: int = 512) -> dict[float, tuple[float, float]]:
    """min_confidence -> (mean draft tokens proposed, mean accepted) per position, as MedusaDrafter would draft:
    the leading heads whose top probability reaches the threshold, accepted up to the first disagreement."""
    keep = (data.targets != IGNORE).all(dim=1)
    hidden, targets = data.hidden[keep], data.targets[keep]
    tops = [torch.softmax(heads(hidden[i : i + rows]).float(), -1).max(-1) for i in range(0, len(hidden), rows)]
    prob = torch.cat([p for p, _ in tops], 1).t()  # (N, num_heads)
    correct = torch.cat([t for _, t in tops], 1).t() == targets
    sweep = {}
    for c in thresholds:
        sure = (prob >= c).int().cumprod(dim=1)
        sweep[c] = (float(sure.sum(1).float().mean()), float((sure * correct.int()).cumprod(dim=1).sum(1).float().mean()))
    return sweep


def draft_vocab(data: Features) -> torch.Tensor:
    """The token ids the heads learn to say (medusa.DRAFT_VOCAB): the drafter proposes among these only."""
    targets = data.targets[data.targets != IGNORE]
    vocab: torch.Tensor = torch.unique(targets)  # torch.unique is typed Any
    return vocab


def new_heads(model: CausalLM, num_heads: int, num_layers: int) -> MedusaHeads:
    """Heads whose final linear is the base's lm_head weight (frozen, shared); only the ResBlocks train."""
    model.requires_grad_(False)
    weight = model.lm_head.weight  # (vocab, hidden)
    heads = MedusaHeads(weight.shape[1], weight.shape[0], num_heads, num_layers)
    heads.share_lm_head(weight)
    return heads


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=default_model_path(), help="the base (full-precision HF directory)")
    parser.add_argument("--out", type=Path, default=default_medusa_path(), help="where the heads go (Medusa format)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1, help="ResBlocks per head")
    parser.add_argument("--seconds", type=float, default=180.0, help="training time budget")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=256, help="tokens per passage")
    parser.add_argument("--eval-samples", type=int, default=8, help="heldout passages to measure acceptance on")
    parser.add_argument("--data", choices=["answers", "passages"], default="answers",
                        help="answers: the base's own greedy chat answers about the text (medusa_data.py); passages: "
                             "the text itself, chat-formatted")
    parser.add_argument("--answers", type=int, default=320, help="chat requests to generate answers for")
    parser.add_argument("--answer-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the CPU is shared)")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    train_data, heldout = training_sets(args, model, tokenizer)
    print(f"hidden states: {len(train_data.hidden)} train / {len(heldout.hidden)} heldout positions "
          f"in {time.monotonic() - start:.0f}s", flush=True)
    heads = new_heads(model, args.heads, args.layers)
    heads.draft_vocab = draft_vocab(train_data)
    print(f"draft vocabulary: {len(heads.draft_vocab)} tokens", flush=True)
    report("heldout before", acceptance(heads, heldout))
    losses = train(heads, train_data, args.seconds, args.lr, batch=args.batch)
    print(f"trained {len(losses)} steps, loss {losses[0]:.3f} -> {sum(losses[-20:]) / len(losses[-20:]):.3f}")
    report("heldout after", acceptance(heads, heldout))
    for c, (proposed, accepted) in confidence_sweep(heads, heldout).items():
        print(f"heldout min_confidence {c}: {proposed:.2f} proposed, {accepted:.2f} accepted per draft")
    out: Path = args.out
    save_medusa(heads, out, str(args.model))
    print(f"saved {out} ({time.monotonic() - start:.0f}s in all)")
    return out


def training_sets(args: argparse.Namespace, model: CausalLM, tokenizer: object) -> tuple[Features, Features]:
    """(train, heldout) features: generated answers about calibration.txt / heldout.txt, or the passages."""
    if args.data == "passages":
        return (features(model, chat_samples(tokenizer, CALIBRATION, args.chunk), args.heads),
                features(model, chat_samples(tokenizer, HELDOUT, args.chunk)[: args.eval_samples], args.heads))
    sets = []
    for path, limit in ((CALIBRATION, args.answers), (HELDOUT, args.eval_samples * 2)):
        cache = args.out / "data" / f"{path.stem}-{limit}x{args.answer_tokens}-v{VERSION}.pt"
        samples = cached_answers(cache, args.model, tokenizer, path, limit=limit, max_tokens=args.answer_tokens)
        print(f"{len(samples)} generated answers about {path.name} ({cache})", flush=True)
        sets.append(features(model, [ids for ids, _ in samples], args.heads, [start for _, start in samples]))
    return sets[0], sets[1]


def report(label: str, result: tuple[list[float], float]) -> None:
    per_head = ", ".join(f"{a:.2f}" for a in result[0])
    print(f"{label}: per-head agreement [{per_head}], mean accepted {result[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
