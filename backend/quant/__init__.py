"""INT4 weight-only quantization (AWQ) for the engine's Llama-family models.

    config.py       quantization_config as config.json states it (read by the loader, no kernel imports)
    awq_format.py   group-wise asymmetric INT4 math + the AutoAWQ "GEMM" checkpoint layout (save/read)
    int4_linear.py  Int4Linear: the W4A16 layer the engine swaps in for nn.Linear on AWQ checkpoints
    lm_head.py      the lm_head's serving copy (int8 rows for decode, bf16 for batches)
    convert.py      the loader's two hooks: swap the projections in, repack them after loading
    calibration.py  the shipped calibration / held-out text, tokenized into fixed-length blocks
    awq_search.py   the AWQ algorithm for one decoder layer: scale search + folding, clipping search
    awq.py          `python -m backend.quant.awq`: quantize a checkpoint block by block (CLI, progress bar)
"""
