"""AWQ for one decoder layer (Lin et al., MLSys'24), on HF transformers' Llama-family modules.

Weights that meet large activations matter most, and scaling a weight's input channel up by s (and the
activation down by s) shrinks its relative rounding error. Per layer there are four scaling groups, each a
preceding op whose output feeds some linears:

    input_layernorm          -> q, k, v      error measured on the self-attention output
    v_proj                   -> o_proj       on o_proj's output (GQA: one v channel feeds n_rep o_proj inputs)
    post_attention_layernorm -> gate, up     on the MLP output
    up_proj                  -> down_proj    on down_proj's output

For each group, s = mean|x|^alpha per input channel with alpha on a grid in [0, 1) (alpha = 0 is plain
round-to-nearest, so the search never does worse than RTN on the calibration data); the alpha whose
quantized output is closest to the full-precision one wins. s is then folded in: the preceding op's output
is divided by s (RMSNorm weight, v_proj / up_proj rows) and the linears' input columns multiplied by it, so
the full-precision function is unchanged and only what gets rounded changes. Last, a clipping search shrinks
each quantization group's range where that lowers the linear's output error (not for q/k: attention
logits are sensitive to clipped outliers, as in AutoAWQ).

The searches evaluate a bf16 copy of the layer where the CPU multiplies bf16 natively (AVX-512 BF16 / AMX:
~3x the fp32 GEMM rate; bf16 rounding is ~0.2% of a weight, the INT4 error being ranked is ~5-10%) and a
float32 copy elsewhere (an AVX2 CPU emulates bf16: the search took 50 s a layer in bf16 there). The folding
itself is applied to the float32 weights that get quantized.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from backend.quant.awq_format import fake_quantize
from backend.quant.cpu_gemm import dense_dtype

N_GRID = 20
MAX_SHRINK = 0.5  # clipping tries ranges 1.0, 0.95, ... 0.55 of each group's max |w|
CLIP_TOKENS = 512  # tokens sampled for the clipping search
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
CAPTURED = ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")  # one input per group


def eval_dtype() -> torch.dtype:
    """The dtype the evaluation copy of a layer computes in (the module docstring says why)."""
    return dense_dtype("cpu")


@dataclass
class ScaleGroup:
    prev: nn.Module  # RMSNorm or nn.Linear whose output feeds `linears`
    linears: list[nn.Linear]  # the float32 layers that get folded and quantized
    evals: list[nn.Linear]  # their copies inside the evaluation layer
    x: torch.Tensor  # (..., C) the linears' input (float32)
    block: Callable[[torch.Tensor], torch.Tensor]  # input -> the output the error is measured on (eval layer)
    n_rep: int = 1  # > 1: prev's channels each feed n_rep groups of input channels (GQA v -> o)


def capture_inputs(layer: nn.Module, hidden: torch.Tensor, pos_emb: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Run the layer once in full precision; return the input of each scaling group's linears and the output."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        layer.get_submodule(name).register_forward_hook(lambda _m, args, _o, n=name: inputs.__setitem__(n, args[0]))
        for name in CAPTURED
    ]
    try:
        out = layer(hidden, attention_mask=None, position_embeddings=pos_emb)
    finally:
        for h in hooks:
            h.remove()
    return inputs, out[0] if isinstance(out, tuple) else out


def scale_groups(layer: nn.Module, evaluation: nn.Module, inputs: dict[str, torch.Tensor],
                 pos_emb: tuple[torch.Tensor, torch.Tensor]) -> list[ScaleGroup]:
    """The four groups; `evaluation` is the (eval_dtype) copy of `layer` whose modules the errors are measured on."""
    attn, mlp, e_attn, e_mlp = layer.self_attn, layer.mlp, evaluation.self_attn, evaluation.mlp
    n_rep = attn.o_proj.in_features // attn.v_proj.out_features
    cos_sin = (pos_emb[0].to(eval_dtype()), pos_emb[1].to(eval_dtype()))

    def attention(x: torch.Tensor) -> torch.Tensor:
        return e_attn(hidden_states=x, position_embeddings=cos_sin, attention_mask=None)[0]

    def linears(module: nn.Module, names: list[str]) -> list[nn.Linear]:
        return [module.get_submodule(n) for n in names]

    qkv, gate_up = ["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"]
    return [
        ScaleGroup(layer.input_layernorm, linears(attn, qkv), linears(e_attn, qkv), inputs["self_attn.q_proj"], attention),
        ScaleGroup(attn.v_proj, [attn.o_proj], [e_attn.o_proj], inputs["self_attn.o_proj"], e_attn.o_proj, n_rep),
        ScaleGroup(layer.post_attention_layernorm, linears(mlp, gate_up), linears(e_mlp, gate_up), inputs["mlp.gate_proj"],
                   e_mlp),
        ScaleGroup(mlp.up_proj, [mlp.down_proj], [e_mlp.down_proj], inputs["mlp.down_proj"], e_mlp.down_proj),
    ]


def sync_evaluation(layer: nn.Module, evaluation: nn.Module) -> None:
    """Copy the float32 projections (after a fold) into the evaluation layer."""
    for name in LINEARS:
        src, dst = layer.get_submodule(name), evaluation.get_submodule(name)
        dst.weight.data = src.weight.data.to(eval_dtype())
        if src.bias is not None:
            dst.bias.data = src.bias.data.to(eval_dtype())


def expand(s: torch.Tensor, n_rep: int, head_dim: int) -> torch.Tensor:
    """prev-channel scales -> linear-input scales. GQA: q head h reads kv head h // n_rep, so o_proj input
    channel (h, d) sees v channel (h // n_rep, d)."""
    if n_rep == 1:
        return s
    return s.view(-1, 1, head_dim).expand(-1, n_rep, head_dim).reshape(-1)


def activation_mean(x: torch.Tensor, n_rep: int, head_dim: int) -> torch.Tensor:
    """mean |x| per prev channel (averaged over the n_rep input channels one channel feeds)."""
    m = x.abs().reshape(-1, x.shape[-1]).float().mean(0)
    return m if n_rep == 1 else m.view(-1, n_rep, head_dim).mean(1).reshape(-1)


@torch.no_grad()
def search_scale(group: ScaleGroup, group_size: int, head_dim: int) -> tuple[torch.Tensor, float]:
    """The grid search: (best per-prev-channel scales, best alpha)."""
    x_mean = activation_mean(group.x, group.n_rep, head_dim)
    dtype = eval_dtype()
    x = group.x.to(dtype)
    ref = group.block(x).float()
    originals = [lin.weight.data for lin in group.linears]
    best: tuple[float, torch.Tensor, float] = (float("inf"), torch.ones_like(x_mean), 0.0)
    for i in range(N_GRID):
        alpha = i / N_GRID
        s = x_mean.pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        s_in = expand(s, group.n_rep, head_dim)
        for lin, w in zip(group.evals, originals, strict=True):
            lin.weight.data = fake_quantize(w * s_in, group_size).div_(s_in).to(dtype)
        err = (group.block(x).float() - ref).pow(2).mean().item()
        if err < best[0]:
            best = (err, s, alpha)
    for lin, w in zip(group.evals, originals, strict=True):
        lin.weight.data = w.to(dtype)
    return best[1], best[2]


@torch.no_grad()
def fold_scale(group: ScaleGroup, s: torch.Tensor, head_dim: int) -> None:
    """prev's output / s, linears' input columns * s: the same function, friendlier to rounding."""
    s_in = expand(s, group.n_rep, head_dim)
    prev = group.prev
    if isinstance(prev, nn.Linear):
        prev.weight.data /= s[:, None]
        if prev.bias is not None:
            prev.bias.data /= s
    else:  # RMSNorm: output = weight * normalized(x)
        prev.weight.data /= s
    for lin in group.linears:
        lin.weight.data *= s_in[None, :]
    group.x = group.x / s_in  # the linears now see the scaled-down activation


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per (output row, group) max |w| to clip to before quantizing: (out, in / group_size)."""
    out_f, in_f = w.shape
    n_groups = in_f // group_size
    x = x.reshape(-1, in_f).float()
    x = x[:: max(1, x.shape[0] // CLIP_TOKENS)][:CLIP_TOKENS]
    xg = x.view(-1, n_groups, group_size).permute(1, 0, 2)  # (groups, tokens, g)
    wg = w.float().view(out_f, n_groups, group_size)
    ref = torch.bmm(xg, wg.permute(1, 2, 0))  # (groups, tokens, out): each group's share of the output
    org_max = wg.abs().amax(-1)  # (out, groups)
    best_err = torch.full_like(org_max, float("inf"))
    best_max = org_max.clone()
    for i in range(int(MAX_SHRINK * N_GRID)):
        max_abs = org_max * (1 - i / N_GRID)
        q = fake_quantize(w.float(), group_size, max_abs).view(out_f, n_groups, group_size)
        err = (torch.bmm(xg, q.permute(1, 2, 0)) - ref).pow(2).mean(1).T  # (out, groups)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_max = torch.where(better, max_abs, best_max)
    return best_max


def awq_layer(layer: nn.Module, hidden: torch.Tensor, pos_emb: tuple[torch.Tensor, torch.Tensor], group_size: int,
              *, head_dim: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[float]]:
    """Scale search + folding + clipping search for one layer, in place.

    Returns (clip ranges per linear name, the layer's full-precision output for the next layer, the alphas)."""
    inputs, out = capture_inputs(layer, hidden, pos_emb)
    evaluation = copy.deepcopy(layer).to(eval_dtype())
    alphas = []
    groups = scale_groups(layer, evaluation, inputs, pos_emb)
    for group in groups:
        s, alpha = search_scale(group, group_size, head_dim)
        fold_scale(group, s, head_dim)
        sync_evaluation(layer, evaluation)
        alphas.append(alpha)
    clips: dict[str, torch.Tensor] = {}
    for group in groups:
        for lin in group.linears:
            name = next(n for n in LINEARS if layer.get_submodule(n) is lin)
            if name not in NO_CLIP:
                clips[name] = search_clip(lin.weight.data, group.x, group_size)
    return clips, out, alphas
