"""A sentence encoder's top layers fine-tuned for one task, and the small file that ships them.

The semantic cache's learned matcher (gateway/cache/matcher.py) reads all-MiniLM-L6-v2's token states. Stock MiniLM
puts a question near its look-alikes ("... boil an egg" / "... poach an egg") and away from a reworded paraphrase in
another style ("population canada" / "how many people live in canada"), and no head over its states undoes that. So
its top layers are fine-tuned on the tuning pairs as a bi-encoder (`fine_tune`): each cached question (the anchor)
must find its paraphrase among the batch's other paraphrases and one hard negative per anchor (a written or generated
look-alike of it), by the cross-entropy over scaled cosines of the mean-pooled states, in both directions
(sentence-transformers' MultipleNegativesRankingLoss with hard negatives). The lower layers and the embedding tables
stay stock: their states are computed once under no_grad, and the word table the matcher reads out of context is
unchanged.

The tuned layers ship as one safetensors file (`save` / `load`): every matrix in int8 with one float32 scale per
row (symmetric), vectors in float32, and the base model's shape in the file's metadata (`apply` refuses another
model): 3.6 MB for MiniLM's top two layers. `load` gives float32 tensors; the int8 encoder (backend/embed/minilm.py)
quantizes them again per row, which gives back the same int8 values.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

SCALE = ".row_scale"  # suffix of a matrix's per-row scales in the file
# what must match between the model the layers were tuned from and the one they are applied to (file metadata)
BASE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
PREFIX = "encoder.layer."  # the only weights a file may hold


@dataclass(frozen=True)
class Triplet:
    anchor: str  # the cached question
    positive: str  # a question with the same answer
    negatives: tuple[str, ...]  # look-alikes that ask something else (one drawn per step; none: another anchor)


@dataclass(frozen=True)
class TuneConfig:
    frozen: int = 4  # layers below this stay stock
    epochs: int = 2
    batch: int = 48
    lr: float = 6e-5  # times a linear warm-up over the first 10% of steps times a linear decay to 0 (peak 0.9 lr)
    weight_decay: float = 0.01
    scale: float = 20.0  # cosine -> logit
    seed: int = 0


def _extended(mask: torch.Tensor) -> torch.Tensor:
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min


def _run(layers: Sequence[torch.nn.Module], h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ext = _extended(mask)
    for layer in layers:
        out = layer(h, attention_mask=ext)
        h = out[0] if isinstance(out, tuple) else out
    return h


def _pooled(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask[..., None].float()
    return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)


@dataclass(frozen=True)
class TunedLayers:
    weights: dict[str, torch.Tensor]  # state-dict keys of the BertModel, `encoder.layer.{i}.` for i >= frozen
    base: dict[str, str]  # the model they were tuned from (`base_of`): the file's metadata


def fine_tune(model_path: Path, triplets: Sequence[Triplet], cfg: TuneConfig = TuneConfig(),
              log: Callable[[str], None] = print) -> TunedLayers:  # fmt: skip
    """The fine-tuned layers and the model they belong to.
    Deterministic for the same inputs, torch build and thread count (fixed seeds, one sample order). Needs at least
    one batch of triplets."""
    if len(triplets) < cfg.batch:
        raise ValueError(f"{len(triplets)} triplets: fine-tuning needs at least one batch ({cfg.batch})")
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tok = AutoTokenizer.from_pretrained(str(model_path))
    bert: PreTrainedModel = AutoModel.from_pretrained(str(model_path), dtype=torch.float32, attn_implementation="eager")
    bert.eval()  # no dropout: MiniLM's is 0.1; without it the same data gives the same weights, and it tunes as well
    lower, upper = bert.encoder.layer[: cfg.frozen], bert.encoder.layer[cfg.frozen :]
    for p in bert.parameters():
        p.requires_grad_(False)
    params = [p for layer in upper for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = len(triplets) // cfg.batch
    steps = max(cfg.epochs * per_epoch, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(0.0, 1 - s / steps))
    order = list(triplets)
    for epoch in range(cfg.epochs):
        rng.shuffle(order)
        for start in range(0, per_epoch * cfg.batch, cfg.batch):
            batch = order[start : start + cfg.batch]
            anchors = [t.anchor for t in batch]
            # an anchor with no look-alike gets another anchor of the batch as its hard negative
            hard = [rng.choice(t.negatives) if t.negatives else rng.choice([a for a in anchors if a != t.anchor] or anchors)
                    for t in batch]  # fmt: skip
            texts = anchors + [t.positive for t in batch] + hard
            enc = tok(texts, padding=True, return_tensors="pt")
            with torch.no_grad():
                h = _run(lower, bert.embeddings(input_ids=enc.input_ids), enc.attention_mask)
            v = _pooled(_run(upper, h, enc.attention_mask), enc.attention_mask)
            a, pos, neg = v[: cfg.batch], v[cfg.batch : 2 * cfg.batch], v[2 * cfg.batch :]
            # another row of the same anchor has a right positive too: not a negative
            same = torch.tensor([[x == y and i != j for j, y in enumerate(anchors)] for i, x in enumerate(anchors)])
            target = torch.arange(len(batch))
            forward = (cfg.scale * a @ torch.cat([pos, neg]).T).masked_fill(torch.cat([same, torch.zeros_like(same)], 1), -1e4)
            backward = (cfg.scale * pos @ a.T).masked_fill(same, -1e4)
            loss = F.cross_entropy(forward, target) + F.cross_entropy(backward, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        log(f"encoder epoch {epoch + 1}/{cfg.epochs}: last loss {loss.item():.3f}")
    prefixes = tuple(f"encoder.layer.{i}." for i in range(cfg.frozen, len(bert.encoder.layer)))
    weights = {k: v.detach().clone() for k, v in bert.state_dict().items() if k.startswith(prefixes)}
    return TunedLayers(weights, base_of(bert, weights))


def base_of(bert: PreTrainedModel, tuned: Iterable[str]) -> dict[str, str]:
    """What the tuned layers need of the model they go into: its shape, and a digest of every weight they do not
    replace (another checkpoint of the same shape, e.g. paraphrase-MiniLM-L6-v2, has other lower layers)."""
    replaced = set(tuned)
    digest = hashlib.sha256()
    for name, w in sorted(bert.state_dict().items()):
        if name not in replaced:
            digest.update(name.encode())
            digest.update(w.detach().float().contiguous().numpy().tobytes())
    return {**{field: str(getattr(bert.config, field, "")) for field in BASE_FIELDS}, "kept": digest.hexdigest()[:16]}


def save(layers: TunedLayers, path: Path) -> None:
    """Matrices as int8 with a float32 scale per row (symmetric, amax / 127), everything else float32; the base
    model's record as metadata."""
    out: dict[str, torch.Tensor] = {}
    for name, w in sorted(layers.weights.items()):
        if w.dim() == 2:
            scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            out[name] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            out[name + SCALE] = scale.float()
        else:
            out[name] = w.float().contiguous()
    # one metadata entry, its keys sorted: safetensors writes a metadata map in no fixed order, and the file's bytes
    # (its digest, which matcher.json records) must not change from run to run
    save_file(out, str(path), metadata={"base": json.dumps(layers.base, sort_keys=True)})


def load(path: Path) -> dict[str, torch.Tensor]:
    """The weights `save` wrote, in float32 (state-dict keys)."""
    raw = load_file(str(path))
    return {k: (v.float() * raw[k + SCALE][:, None] if k + SCALE in raw else v.float())
            for k, v in raw.items() if not k.endswith(SCALE)}  # fmt: skip


def apply(bert: PreTrainedModel, path: Path) -> None:
    """Replaces `bert`'s layers with the tuned ones in `path`: the file must have been tuned from a model of this
    shape, and hold encoder layers of it only."""
    weights = load(path)
    with safe_open(str(path), framework="pt") as f:
        recorded = json.loads((f.metadata() or {}).get("base", "{}"))
    if recorded != base_of(bert, weights):
        raise ValueError(f"{path.name} was tuned from another model ({recorded or 'unrecorded'}); this one is "
                         f"{base_of(bert, weights)}")  # fmt: skip
    own = bert.state_dict()
    foreign = sorted(k for k in weights if not k.startswith(PREFIX) or k not in own or weights[k].shape != own[k].shape)
    if foreign:
        raise ValueError(f"{path.name}: not encoder layers of this model: {foreign[:3]}")
    bert.load_state_dict(weights, strict=False)
