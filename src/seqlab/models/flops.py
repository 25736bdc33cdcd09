r"""Parameter and FLOP accounting for the Transformer families, on the meta device (nothing is allocated).

Parameters are grouped by component: ``embeddings`` (token, position, segment tables), ``attention`` (the
projections of every :class:`MultiheadAttention`), ``mlp`` (channel mixers), ``norms`` (LayerNorm/RMSNorm),
``recurrent`` (RNN, LSTM, GRU, minGRU layers), ``ssm`` (S4D and Mamba mixers), ``conv`` (convolutional encoders; a ViT's patch embedding counts as
an embedding), ``head`` (output projection, MLM head, pooler) and ``other``. A tied head is counted once, under
``embeddings``.

Forward FLOPs per token, counting one multiply-add as 2 FLOPs (Kaplan et al. 2020, arXiv 2001.08361, table 1;
Chowdhery et al. 2022, arXiv 2204.02311, appendix B):

    F_fwd = 2 · N_matmul + 4 · n_layers · t · d_attn

* ``N_matmul``: the weights that multiply activations: every linear/attention projection, the output
  head (also when it is tied to the embedding) and a ViT's patch embedding (a convolution whose stride is its
  kernel is one matmul per patch token); embedding look-ups, biases and norms are not matmuls. For a ViT
  the context is its tokens (197 for ViT-B/16 at 224×224) and the FLOPs are per token. A recurrent
  layer's weights count too (W_ih x_t and W_hh h_{t-1}, once per token); convolutional encoders, whose cost
  is per image, do not.
* ``4 · n_layers · t · d_attn``: per layer, q kᵀ (2 · t · d_attn) and the weighted sum of values
  (2 · t · d_attn) over a context of ``t`` keys, ``d_attn = n_heads · head_dim``. As in PaLM's MFU formula,
  no discount is taken for the causal mask (a causal kernel skips about half of that work).
  For the encoder–decoder, cross-attention adds another such term per decoder layer (counted with t).

Training costs about three times the forward (backward = 2 × forward): 6 · N_matmul + 12 · n_layers · t · d_attn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.linear_attention import LinearAttention
from seqlab.layers.mamba import Mamba
from seqlab.layers.mingru import MinGRU
from seqlab.layers.mlp import MLP, SwiGLU
from seqlab.layers.norms import LayerNorm, RMSNorm
from seqlab.layers.recurrent_base import RNNBase
from seqlab.layers.rnn_attention import AdditiveAttention, LuongAttention
from seqlab.layers.s4d import S4D

__all__ = ["COMPONENTS", "ModelReport", "forward_flops_per_token", "matmul_params", "report"]

COMPONENTS = ("embeddings", "attention", "recurrent", "ssm", "conv", "mlp", "norms", "head", "other")


@dataclass
class ModelReport:
    name: str
    total: int
    by_component: dict[str, int]
    shapes: dict[str, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    """Per component: (parameter name, shape) in module order."""
    matmul_params: int = 0
    context: int = 0
    attention_flops: int = 0
    """4 · n_layers · t · d_attn (see the module docstring), per token."""
    flops_per_token: int = 0
    """Forward FLOPs per token at ``context``: 2 · matmul_params + attention_flops."""


def _component(module: nn.Module, name: str) -> str:
    if isinstance(module, LayerNorm | RMSNorm | nn.LayerNorm):
        return "norms"
    if isinstance(module, MultiheadAttention | AdditiveAttention | LuongAttention | LinearAttention):
        return "attention"
    if isinstance(module, RNNBase | MinGRU):
        return "recurrent"
    if isinstance(module, Mamba | S4D):
        return "ssm"
    if isinstance(module, nn.Conv2d | nn.BatchNorm2d) and "patch_embed" not in name:
        return "conv"
    if isinstance(module, MLP | SwiGLU):
        return "mlp"
    if isinstance(module, nn.Embedding) or "embed" in name.rsplit(".", 1)[-1]:
        return "embeddings"
    if any(k in name for k in ("head", "pooler", "generator")):
        return "head"
    return "other"


def _classify(model: nn.Module) -> dict[int, tuple[str, str, tuple[int, ...]]]:
    """id(parameter) -> (component, name, shape), deciding by the outermost recognised module."""
    out: dict[int, tuple[str, str, tuple[int, ...]]] = {}
    for mname, module in model.named_modules():
        comp = _component(module, mname) if mname else "other"
        if comp == "other":
            continue
        for pname, p in module.named_parameters(prefix=mname):
            if id(p) not in out:
                out[id(p)] = (comp, pname, tuple(p.shape))
    for pname, p in model.named_parameters():  # whatever no recognised module owns
        if id(p) not in out:
            tables = (
                "embed",
                "cls_token",
                "pos",
            )  # position tables and class tokens held by the model itself
            comp = "embeddings" if any(k in pname for k in tables) else "head" if "head" in pname else "other"
            out[id(p)] = (comp, pname, tuple(p.shape))
    return out


def matmul_params(model: nn.Module) -> int:
    """Weights that multiply activations: linear layers (a tied head included) and attention projections."""
    n = 0
    for m in model.modules():
        # a linear layer, or a patch embedding (a convolution whose stride is its kernel: one matmul per patch)
        if isinstance(m, nn.Linear) or (isinstance(m, nn.Conv2d) and m.kernel_size == m.stride):
            n += m.weight.numel()
        elif isinstance(m, RNNBase):  # W_ih x_t and W_hh h_{t-1}: every weight once per token
            n += sum(p.numel() for name, p in m.named_parameters() if name.startswith("weight"))
        elif isinstance(m, MultiheadAttention):
            n += sum(w.numel() for w in m.projection_weights())
    return n


def _attention_layers(model: nn.Module) -> list[MultiheadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiheadAttention)]


def forward_flops_per_token(model: nn.Module, context: int) -> tuple[int, int]:
    """(total forward FLOPs per token, attention-score part) at a context of ``context`` keys."""
    attn = sum(4 * context * m.n_heads * m.head_dim for m in _attention_layers(model))
    return 2 * matmul_params(model) + attn, attn


_CONTEXTS = ("max_seq_len", "n_tokens", "max_src_len")


def _check_context(cfg, context: int) -> None:
    """A context the model can read: within a learned position table; a ViT's own token count."""
    tokens = getattr(cfg, "n_tokens", None)
    if isinstance(tokens, int) and context != tokens:
        raise ValueError(
            f"a ViT reads {tokens} tokens per image (its patches and class token), so its context is {tokens}, "
            f"not {context}: change model.image_size or model.patch_size instead"
        )
    table = getattr(cfg, "max_seq_len", None)
    if getattr(cfg, "position", None) == "learned" and isinstance(table, int) and context > table:
        raise ValueError(
            f"context {context} is longer than the model's {cfg.max_seq_len} learned positions "
            "(model.max_seq_len): it cannot read more"
        )


def report(name_or_model, context: int | None = None, **overrides) -> ModelReport:
    """Counts, shapes by component and forward FLOPs per token of a preset (built on meta) or a model."""
    if isinstance(name_or_model, nn.Module):
        model, name = name_or_model, type(name_or_model).__name__
    else:
        from seqlab.models import create

        name = name_or_model
        model = create(name, device=torch.device("meta"), **overrides)
    cfg = getattr(model, "config", None)
    if context is None:  # the longest the model reads: its positions, a ViT's tokens, a translator's source
        context = next((int(v) for k in _CONTEXTS if (v := getattr(cfg, k, None))), 0)
    _check_context(cfg, context)
    by = dict.fromkeys(COMPONENTS, 0)
    shapes: dict[str, list[tuple[str, tuple[int, ...]]]] = {c: [] for c in COMPONENTS}
    for comp, pname, shape in _classify(model).values():
        by[comp] += int(torch.Size(shape).numel())
        shapes[comp].append((pname, shape))
    flops, attn = forward_flops_per_token(model, context)
    return ModelReport(
        name=name,
        total=sum(by.values()),
        by_component=by,
        shapes=shapes,
        matmul_params=matmul_params(model),
        context=context,
        attention_flops=attn,
        flops_per_token=flops,
    )
