"""MiniLM's top layers fine-tuned for the learned matcher (backend/embed/tuned.py): the fine-tune is deterministic and
moves only its layers, the shipped int8 file reads back within half a step, the embedder that loads it separates
paraphrases from look-alikes the encoder never saw better than stock MiniLM, and a matcher refuses an encoder file
that is not the one its heads were trained on, and the learned modes refuse an embedder without that file."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from backend.config import default_embedding_model_path
from backend.embed import tuned
from backend.embed.embeddings import Embedder, for_cache
from gateway.cache import train
from gateway.cache.config import CacheConfig
from gateway.cache.matcher import ENCODER_PATH, MatcherModel
from gateway.cache.service import build_matcher
from gateway.config import GatewayConfig, apply_env
from gateway.ops.access_log import make_logger

TINY = [tuned.Triplet("how do i boil an egg", "what's the way to boil eggs", ("how do i poach an egg",)),
        tuned.Triplet("how tall is everest", "everest height", ("how old is everest",)),
        tuned.Triplet("who wrote hamlet", "who is the author of hamlet", ()),
        tuned.Triplet("what is the population of canada", "how many people live in canada", ("population of mexico",)),
        tuned.Triplet("how do i change a flat tire", "steps to replace a flat tyre", ("how do i inflate a tire",)),
        tuned.Triplet("best way to learn french", "how should i learn french", ("best way to learn german",)),
        tuned.Triplet("why is the sky blue", "what makes the sky blue", ("why is the sea blue",)),
        tuned.Triplet("how long to boil pasta", "pasta boiling time", ("how long to bake pasta",))]  # fmt: skip


def test_fine_tuning_is_deterministic_and_moves_only_its_layers() -> None:
    cfg = tuned.TuneConfig(frozen=5, epochs=1, batch=4)
    one = tuned.fine_tune(default_embedding_model_path(), TINY, cfg, log=lambda _: None)
    two = tuned.fine_tune(default_embedding_model_path(), TINY, cfg, log=lambda _: None)
    first, second = one.weights, two.weights
    assert first.keys() == second.keys() and all(k.startswith("encoder.layer.5.") for k in first)
    assert all(torch.equal(first[k], second[k]) for k in first) and one.base == two.base
    bert = AutoModel.from_pretrained(str(default_embedding_model_path()))
    own = bert.state_dict()
    moved = [k for k in first if not torch.equal(first[k], own[k])]
    assert "encoder.layer.5.attention.self.query.weight" in moved and len(moved) >= len(first) // 2
    assert one.base == tuned.base_of(bert, first) and one.base["num_hidden_layers"] == "6"
    with pytest.raises(ValueError, match="at least one batch"):
        tuned.fine_tune(default_embedding_model_path(), TINY[:3], cfg, log=lambda _: None)


def test_layers_go_only_into_the_model_they_were_tuned_from(tmp_path: Path) -> None:
    """Another checkpoint of the same shape (here MiniLM with one lower weight nudged) is refused by name, and so is a
    file with weights other than encoder layers."""
    bert = AutoModel.from_pretrained(str(default_embedding_model_path()))
    tuned.apply(bert, ENCODER_PATH)  # the shipped file, into the model it was tuned from
    other = AutoModel.from_pretrained(str(default_embedding_model_path()))
    with torch.no_grad():
        other.encoder.layer[0].output.dense.bias[0] += 1e-3
    with pytest.raises(ValueError, match="tuned from another model"):
        tuned.apply(other, ENCODER_PATH)
    weights = {"embeddings.LayerNorm.bias": torch.zeros(384)}
    tuned.save(tuned.TunedLayers(weights, tuned.base_of(bert, weights)), tmp_path / "foreign.safetensors")
    with pytest.raises(ValueError, match="not encoder layers"):
        tuned.apply(bert, tmp_path / "foreign.safetensors")


def test_the_encoder_is_tuned_on_the_training_side_only() -> None:
    """Every anchor is a cached question of the training side of a tuning set, and no text is a held-out question."""
    held = train.held_out_questions()
    triplets = train.encoder_triplets(train.TUNING)
    assert len(triplets) > 5000 and all(train.side(a) == "train" for a, _, _ in triplets)
    assert not [t for a, b, alikes in triplets for t in (a, b, *alikes) if train.norm(t) in held]


def test_the_int8_file_reads_back_within_half_a_step_per_row(tmp_path: Path) -> None:
    torch.manual_seed(0)
    weights = {"encoder.layer.5.output.dense.weight": torch.randn(384, 1536),
               "encoder.layer.5.output.dense.bias": torch.randn(384)}
    bert = AutoModel.from_pretrained(str(default_embedding_model_path()))
    layers = tuned.TunedLayers(weights, tuned.base_of(bert, weights))
    tuned.save(layers, tmp_path / "top.safetensors")
    tuned.save(layers, tmp_path / "same.safetensors")  # the same bytes each time: matcher.json records their digest
    assert (tmp_path / "top.safetensors").read_bytes() == (tmp_path / "same.safetensors").read_bytes()
    back = tuned.load(tmp_path / "top.safetensors")
    w, b = weights["encoder.layer.5.output.dense.weight"], back["encoder.layer.5.output.dense.weight"]
    step = w.abs().amax(dim=1, keepdim=True) / 127
    assert back.keys() == weights.keys() and bool(((w - b).abs() <= step / 2 + 1e-7).all())
    assert torch.equal(back["encoder.layer.5.output.dense.bias"], weights["encoder.layer.5.output.dense.bias"])
    # quantizing what was read back per row again gives the same int8 values (as the int8 encoder does)
    tuned.save(tuned.TunedLayers(back, {}), tmp_path / "again.safetensors")
    name = "encoder.layer.5.output.dense.weight"
    assert torch.equal(load_file(str(tmp_path / "again.safetensors"))[name], load_file(str(tmp_path / "top.safetensors"))[name])


def _auc(pos: np.ndarray, neg: np.ndarray) -> float:
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def test_the_shipped_encoder_ranks_unseen_paraphrases_above_look_alikes_better_than_stock() -> None:
    """The labelled pairs of the calibration side of six tuning sets (the fine-tune never anchored on their cached
    questions; a few of their questions occur in other files' training pairs): a paraphrase pair's cosine beats a
    look-alike pair's more often with the shipped layers than without."""
    pairs = [p for name in ("dev", "independent_g", "tune_o", "tune_p", "tune_q", "tune_s") for p in train.tuning_pairs(name)
             if train.side(p.cached) == "cal"]  # fmt: skip
    base, dtype = Embedder(batch_size=64), CacheConfig().embedding_dtype
    aucs = []
    for embedder in (for_cache(base, dtype), for_cache(base, dtype, ENCODER_PATH)):
        a = np.asarray(embedder.embed_sync([p.cached for p in pairs])[0])
        b = np.asarray(embedder.embed_sync([p.query for p in pairs])[0])
        cos = (a * b).sum(axis=1)
        label = np.array([p.label == "paraphrase" for p in pairs])
        aucs.append(_auc(cos[label], cos[~label]))
    assert len(pairs) > 300 and aucs[1] > aucs[0] + 0.03, aucs


def test_a_matcher_refuses_an_encoder_file_that_is_not_its_own(tmp_path: Path) -> None:
    model = json.loads((ENCODER_PATH.with_name("matcher.json")).read_text())
    assert model["encoder"]["file"] == ENCODER_PATH.name
    (tmp_path / "matcher.json").write_text(json.dumps(model))
    with pytest.raises(ValueError, match="missing or another file"):
        MatcherModel.load(tmp_path / "matcher.json")  # no encoder file beside it
    shutil.copy(ENCODER_PATH, tmp_path / ENCODER_PATH.name)
    assert MatcherModel.load(tmp_path / "matcher.json").encoder == tmp_path / ENCODER_PATH.name
    (tmp_path / ENCODER_PATH.name).write_bytes(ENCODER_PATH.read_bytes()[:-1] + b" ")
    with pytest.raises(ValueError, match="missing or another file"):
        MatcherModel.load(tmp_path / "matcher.json")


def test_the_learned_modes_refuse_an_embedder_without_the_matchers_layers() -> None:
    cfg = apply_env(GatewayConfig(), {"SMOLGATE_CACHE_SEMANTIC_MATCH": "learned", "SMOLGATE_CACHE_SEMANTIC": "true"}).cache
    base = Embedder(batch_size=8)
    with pytest.raises(ValueError, match="fine-tuned layers"):
        build_matcher(cfg, for_cache(base, cfg.embedding_dtype), make_logger(io.StringIO()))
    tuned_embedder = for_cache(base, cfg.embedding_dtype, ENCODER_PATH)
    assert tuned_embedder.identity.startswith(f"{base.path.name}+{MatcherModel.load().encoder_digest}/")
    assert build_matcher(cfg, tuned_embedder, make_logger(io.StringIO())) is not None


def test_a_missing_encoder_file_stops_startup_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: the shipped matcher.json without its encoder file beside it (a partial copy of the package)."""
    from gateway.__main__ import build_embedders

    (tmp_path / "matcher.json").write_text(ENCODER_PATH.with_name("matcher.json").read_text())
    load = MatcherModel.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(MatcherModel, "load", classmethod(lambda cls, path=tmp_path / "matcher.json": load(cls, path)))
    cfg = apply_env(GatewayConfig(), {"SMOLGATE_CACHE_SEMANTIC_MATCH": "learned", "SMOLGATE_CACHE_SEMANTIC": "true"})
    with pytest.raises(SystemExit, match=r"^configuration error: the semantic cache's embedder: matcher\.json was trained on"):
        build_embedders(cfg, None)
