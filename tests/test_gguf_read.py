"""How a conversion reads a GGUF file: every tensor from the header's table (`read_tensors`), in gguf-py's GGUFReader
form, without GGUFReader's parse of the metadata arrays; and the readers transformers builds for the config and the
tokenizer shared within one conversion (`shared_gguf_readers`), the class put back after it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from backend.quant.gguf_blocks import shared_gguf_readers
from backend.quant.gguf_header import read_header, read_tensors

T = gguf.GGMLQuantizationType


def write_gguf(path: Path, alignment: int = 32) -> Path:
    """A small file with float, integer and block-quantized tensors, and a vocabulary array."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    if alignment != 32:
        writer.add_custom_alignment(alignment)
    writer.add_token_list([f"t{i}" for i in range(300)])
    w = rng.standard_normal((4, 256), dtype=np.float32)
    writer.add_tensor("f32", w[0])
    writer.add_tensor("f64", w[1, :7].astype(np.float64))
    writer.add_tensor("i8", rng.integers(-128, 128, (3, 5), dtype=np.int8))
    writer.add_tensor("i32", rng.integers(-(2**31), 2**31, (2, 3), dtype=np.int32))
    writer.add_tensor("f16", w.astype(np.float16))
    writer.add_tensor("bf16", gguf.quants.quantize(w, T.BF16), raw_dtype=T.BF16)
    for kind in (T.Q8_0, T.Q5_0):
        writer.add_tensor(kind.name, gguf.quants.quantize(w, kind), raw_dtype=kind)
    for kind in (T.Q4_K, T.Q6_K):  # (gguf-py does not quantize to K-quants: any bytes are blocks of them)
        shape = gguf.quant_shape_to_byte_shape(w.shape, kind)
        writer.add_tensor(kind.name, rng.integers(0, 256, shape, dtype=np.uint8), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [32, 64])
def test_tensors_read_from_the_header_are_gguf_readers(tmp_path: Path, alignment: int) -> None:
    path = write_gguf(tmp_path / "m.gguf", alignment)
    theirs = gguf.GGUFReader(path).tensors
    ours = list(read_tensors(read_header(path)))
    names = ["f32", "f64", "i8", "i32", "f16", "bf16", "Q8_0", "Q5_0", "Q4_K", "Q6_K"]
    assert [t.name for t in ours] == [t.name for t in theirs] == names
    for a, b in zip(ours, theirs, strict=True):
        assert a.tensor_type == b.tensor_type and list(a.dims) == b.shape.tolist()
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and np.array_equal(a.data, b.data), a.name
        if a.tensor_type not in (T.F64, T.I8, T.I32):  # (gguf-py dequantizes float and block types)
            values = [gguf.quants.dequantize(t.data, t.tensor_type) for t in (a, b)]
            assert np.array_equal(*values, equal_nan=True)


def test_one_reader_a_file_within_a_conversion(tmp_path: Path) -> None:
    one, two = write_gguf(tmp_path / "a.gguf"), write_gguf(tmp_path / "b.gguf")
    original = gguf.GGUFReader
    with shared_gguf_readers():
        from gguf import GGUFReader  # as transformers imports it, at call time

        first = GGUFReader(one)
        assert GGUFReader(str(one)) is first and GGUFReader(two) is not first
        assert len(first.fields["tokenizer.ggml.tokens"].data) == 300
    assert gguf.GGUFReader is original
    with pytest.raises(RuntimeError), shared_gguf_readers():
        raise RuntimeError("a failed conversion")
    assert gguf.GGUFReader is original  # put back on the way out, whatever happened
