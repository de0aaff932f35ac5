"""A GGUF file's header, read in milliseconds: its architecture, tensor types and tokenizer, before any conversion.

gguf-py's GGUFReader parses every metadata array into Python objects (26 s for Gemma 3's 262,144-token vocabulary on
two cores); startup only needs a few scalars and the tensor table, so this walks the header with `struct` and skips
what it does not need. Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, metadata count
u64; each metadata entry a string key, a u32 value type and the value (arrays: element type u32, count u64, elements);
then per tensor: name, n_dims u32, dims u64 x n_dims, type u32, offset u64 (from the data section, which starts at the
next multiple of general.alignment, default 32). Each tensor's place is kept: a few small ones are config, not weights
(phi3's longrope factors: `f32_tensor`), and the conversion reads every tensor's data from it (`read_tensors`)
instead of building a GGUFReader, whose parse of the vocabulary alone took 8 s for Gemma 3.
"""

from __future__ import annotations

import functools
import mmap
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backend.errors import ModelLoadError

if TYPE_CHECKING:
    import numpy as np
    from gguf import GGMLQuantizationType

# GGUF metadata value types -> struct format of a fixed-size value (8: string, 9: array)
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
F32 = 0  # ggml's type id of float32
# GGUF architecture names the engine serves -> the transformers model type it becomes
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text", "phi3": "phi3"}


class GgufError(ModelLoadError):
    """The file is missing, not a GGUF file, or cut short: the message names the path."""


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    architecture: str
    metadata: dict[str, object]  # scalar and string entries (arrays are placed, not kept: `arrays`, `array`)
    tensor_types: Counter[str] = field(default_factory=Counter)  # ggml type name -> how many tensors
    tensors: dict[str, tuple[int, tuple[int, ...], int]] = field(default_factory=dict)  # name -> (type, dims, file offset)
    arrays: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # key -> (element type, count, file offset)

    @property
    def array_lengths(self) -> dict[str, int]:
        return {key: count for key, (_, count, _) in self.arrays.items()}

    @property
    def model_type(self) -> str | None:
        """The transformers model type this architecture loads as, None when the engine does not serve it."""
        return ARCHITECTURES.get(self.architecture)

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) and value.strip() else None

    def array(self, key: str) -> list[str] | np.ndarray | None:
        """A metadata array's values, read from its place in the file (the vocabulary: its 262,144 strings in a few
        tenths of a second); strings as a list, numbers as an array; None when the header has no such array."""
        import numpy as np

        if key not in self.arrays:
            return None
        elem, count, offset = self.arrays[key]
        with self.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if elem == STRING:
                cur = _Cursor(buf, self.path)
                cur.pos = offset
                return [cur.string() for _ in range(count)]
            if elem not in _FIXED:
                raise GgufError(f"{self.path}: metadata array {key} holds elements of type {elem}")
            dtype = np.dtype("<" + _FIXED[elem])
            return np.frombuffer(buf, dtype=dtype, count=count, offset=offset).copy()

    def f32_tensor(self, name: str) -> np.ndarray | None:
        """A float32 tensor's values (flat), read from its place in the file; None when the file has no such tensor."""
        import numpy as np

        if name not in self.tensors:
            return None
        kind, dims, offset = self.tensors[name]
        if kind != F32:
            raise GgufError(f"{self.path}: tensor {name} is not float32 (ggml type {kind})")
        count = int(np.prod(dims))
        return np.fromfile(self.path, dtype="<f4", count=count, offset=offset).astype(np.float32)


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as gguf-py's GGUFReader hands it over: `data` in the file's float or integer type, or for block types
    the raw bytes (rows, bytes a row); `dims` in GGUF's order, fastest-moving first."""

    name: str
    tensor_type: GGMLQuantizationType
    dims: tuple[int, ...]
    data: np.ndarray


def read_tensors(header: GgufHeader) -> Iterator[GgufTensor]:
    """Every tensor of `header`'s file, in the file's order, its data memory-mapped (read as it is used)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quant_shape_to_byte_shape

    plain = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
             GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
             GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64}
    mapped = np.memmap(header.path, dtype=np.uint8, mode="r")
    for name, (kind, dims, offset) in header.tensors.items():
        ggml_type = GGMLQuantizationType(kind)
        shape = tuple(reversed(dims))
        count = int(np.prod(dims))
        block, size = GGML_QUANT_SIZES[ggml_type]
        raw = mapped[offset : offset + count * size // block]
        if ggml_type in plain:
            data = raw.view(plain[ggml_type]).reshape(shape)
        else:
            data = raw.reshape(quant_shape_to_byte_shape(shape, ggml_type))
        yield GgufTensor(name, ggml_type, dims, data)


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> object:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise GgufError(f"{self.path}: the GGUF header is cut short (corrupt or incomplete file)")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = int(self.take("Q"))  # type: ignore[call-overload]
        if self.pos + n > len(self.buf):
            raise GgufError(f"{self.path}: the GGUF header is cut short (corrupt or incomplete file)")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind == STRING:
            n = self.take("Q")  # read first: `pos += take()` would lose take's step
            assert isinstance(n, int)
            self.pos += n
        elif kind in _FIXED:
            self.pos += struct.calcsize("<" + _FIXED[kind])
        else:
            raise GgufError(f"{self.path}: unknown GGUF metadata type {kind} (corrupt file?)")

    def value(self, kind: int) -> tuple[object, tuple[int, int, int] | None]:
        """(scalar or string, None) or (None, (element type, length, offset of the first element)), the array
        skipped."""
        if kind == ARRAY:
            elem, count = int(self.take("I")), int(self.take("Q"))  # type: ignore[call-overload]
            start = self.pos
            if elem in _FIXED:
                self.pos += count * struct.calcsize("<" + _FIXED[elem])
            else:
                for _ in range(count):
                    self.skip_value(elem)
            return None, (elem, count, start)
        if kind == STRING:
            return self.string(), None
        if kind in _FIXED:
            return self.take(_FIXED[kind]), None
        raise GgufError(f"{self.path}: unknown GGUF metadata type {kind} (corrupt file?)")


def read_header(path: Path) -> GgufHeader:
    """The header of `path`; GgufError (naming the path) when it is missing, not GGUF, or truncated. Read once per
    file version (path, size, mtime): the preflight, the loader's choice of form and the conversion all ask for it,
    and a large vocabulary makes a read cost tenths of a second."""
    if not path.is_file():
        raise GgufError(f"{path}: no such file")
    st = path.stat()
    return _read_header(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_header(path: Path, size: int, mtime_ns: int) -> GgufHeader:  # noqa: V107  # size, mtime_ns: lru_cache's key
    from gguf import GGMLQuantizationType

    with path.open("rb") as f:
        if path.stat().st_size < 24:
            raise GgufError(f"{path}: not a GGUF file (too short)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise GgufError(f"{path}: not a GGUF file (no GGUF magic)")
            cur = _Cursor(buf, path)
            cur.pos = 4
            version, n_tensors, n_kv = int(cur.take("I")), int(cur.take("Q")), int(cur.take("Q"))  # type: ignore[call-overload]
            metadata: dict[str, object] = {}
            arrays: dict[str, tuple[int, int, int]] = {}
            for _ in range(n_kv):
                key = cur.string()
                value, place = cur.value(int(cur.take("I")))  # type: ignore[call-overload]
                if place is None:
                    metadata[key] = value
                else:
                    arrays[key] = place
            types: Counter[str] = Counter()
            places: dict[str, tuple[int, tuple[int, ...], int]] = {}
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = int(cur.take("I"))  # type: ignore[call-overload]
                dims = tuple(int(cur.take("Q")) for _ in range(n_dims))  # type: ignore[call-overload]
                kind, offset = int(cur.take("I")), int(cur.take("Q"))  # type: ignore[call-overload]
                if name in places:
                    raise GgufError(f"{path}: two tensors named {name!r}")
                places[name] = (kind, dims, offset)
                try:
                    types[GGMLQuantizationType(kind).name] += 1
                except ValueError:
                    types[f"type {kind}"] += 1
            align = metadata.get("general.alignment", 32)
            assert isinstance(align, int)
            start = -(-cur.pos // align) * align
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{path}: the GGUF header names no general.architecture")
    tensors = {name: (kind, dims, start + offset) for name, (kind, dims, offset) in places.items()}
    return GgufHeader(path, version, arch, metadata, types, tensors, arrays)
