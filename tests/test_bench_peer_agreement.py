"""bench.peer_agreement's float32 copy of a GGUF, which llama-server serves to check that the two compute the same model:
every tensor is gguf-py's dequantization of the original, and every header field is the original's."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from bench.peer_agreement import float_copy


def test_float_copy_holds_the_dequantized_tensors_and_the_same_header(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(tmp_path / "q.gguf", "llama")
    writer.add_block_count(2)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_token_list(["<s>", "a", "b\u00e9"])
    writer.add_token_scores([0.0, -1.5, -2.0])
    weights = rng.standard_normal((8, 64), dtype=np.float32)
    for name, kind in (("q8", gguf.GGMLQuantizationType.Q8_0), ("q5", gguf.GGMLQuantizationType.Q5_0)):
        writer.add_tensor(name, gguf.quants.quantize(weights, kind), raw_dtype=kind)
    writer.add_tensor("norm", weights[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    original = gguf.GGUFReader(tmp_path / "q.gguf")
    copy = gguf.GGUFReader(float_copy(tmp_path / "q.gguf", tmp_path / "f.gguf"))
    assert {k: f.contents() for k, f in copy.fields.items() if not k.startswith("GGUF.")} == \
        {k: f.contents() for k, f in original.fields.items() if not k.startswith("GGUF.")}
    for before, after in zip(original.tensors, copy.tensors, strict=True):
        assert after.name == before.name and after.tensor_type == gguf.GGMLQuantizationType.F32
        expected = gguf.quants.dequantize(before.data, before.tensor_type).reshape(after.data.shape)
        assert np.array_equal(after.data, expected)
        if before.tensor_type != gguf.GGMLQuantizationType.F32:  # the copy is the file's values, not the originals
            assert not np.array_equal(after.data, weights)


def test_one_ulp_changes_what_the_engine_computes_and_restores_it() -> None:
    """Inside `one_ulp` the engine (the GGUF's own bits, the default path) computes other log-probabilities; after it,
    the same ones as before, bit for bit."""
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine
    from backend.engine.outputs import TokenLogprob
    from backend.engine.sampling_params import SamplingParams
    from backend.fetch import fetch_gemma_gguf
    from bench.peer_agreement import one_ulp, run

    engine = LLMEngine(EngineConfig(model=str(fetch_gemma_gguf()), enable_prefix_caching=False))
    prompt = [[2, *engine.tokenizer.encode("The river runs past the old mill and", add_special_tokens=False)]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=1)

    def logprobs() -> list[float]:
        out = run(engine, prompt, params)[0]
        assert all(isinstance(t, TokenLogprob) for t in out)
        return [t.logprob for t in out if isinstance(t, TokenLogprob)]

    before = logprobs()
    with one_ulp(engine):
        nudged = logprobs()
    assert nudged != before
    assert logprobs() == before
