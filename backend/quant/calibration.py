"""The text the quantizer calibrates on and the text the bench measures perplexity on, both shipped in data/.

calibration.txt and heldout.txt are different works (public-domain passages plus short expository pieces
written for this project), so the perplexity the bench reports is never measured on calibration text.
No data set is downloaded at run time.
"""

from __future__ import annotations

from pathlib import Path

import torch

DATA_DIR = Path(__file__).parent / "data"
CALIBRATION = DATA_DIR / "calibration.txt"
HELDOUT = DATA_DIR / "heldout.txt"


def token_ids(tokenizer: object, path: Path) -> list[int]:
    """The whole file as one token stream (paragraphs joined by blank lines, as written)."""
    text = path.read_text(encoding="utf-8")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def calibration_batch(tokenizer: object, n_samples: int, seq_len: int, path: Path = CALIBRATION) -> torch.Tensor:
    """(n, seq_len) token blocks spread evenly over the file; fewer than n_samples when the text is short."""
    ids = token_ids(tokenizer, path)
    n_blocks = len(ids) // seq_len
    if n_blocks == 0:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than one block of {seq_len}")
    picks = torch.linspace(0, n_blocks - 1, min(n_samples, n_blocks)).round().long().unique()
    blocks = torch.tensor(ids[: n_blocks * seq_len]).view(n_blocks, seq_len)
    return blocks[picks]
