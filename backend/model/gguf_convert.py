"""Convert a GGUF file to an HF safetensors directory, once.

transformers de-quantizes GGUF weights (and undoes llama.cpp's q/k permutation) on load,
but refuses `save_pretrained` for a GGUF-loaded model, so we write the state dict, the
config (completed where transformers' mapping drops parts of it: backend/quant/gguf_config.py)
and the tokenizer ourselves. Later loads read safetensors directly (about 1 s).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def drop_gguf_marker(model_dir: Path) -> None:
    """The weights are de-quantized: a `quant_method: gguf` left in config.json would mislead loaders."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    if (config.get("quantization_config") or {}).get("quant_method") == "gguf":
        del config["quantization_config"]
        path.write_text(json.dumps(config, indent=2) + "\n")


def convert_gguf_to_hf(gguf_path: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.quant.gguf_config import complete_config
    from backend.quant.gguf_header import read_header

    print(f"converting {gguf_path.name} to safetensors (one time, under a minute) ...", flush=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
    complete_config(model.config, read_header(gguf_path)).save_pretrained(partial)
    drop_gguf_marker(partial)
    model.generation_config.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    return out
