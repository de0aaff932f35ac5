"""INT4 weight-only quantization (AWQ) for the engine's Llama-family models.

    awq_format.py   group-wise asymmetric INT4 math + the AutoAWQ "GEMM" checkpoint layout (save/read)
    int4_linear.py  Int4Linear: the W4A16 layer the engine swaps in for nn.Linear on AWQ checkpoints
    calibration.py  the shipped calibration / held-out text, tokenized into fixed-length samples
    awq_search.py   the AWQ algorithm for one decoder layer: scale search + folding, clipping search
    awq.py          `python -m backend.quant.awq`: quantize a checkpoint block by block (CLI, progress bar)
"""
