"""Hugging Face ``GPT2LMHeadModel`` -> seqlab ``LM`` in GPT-2's shape (``seqlab.models.gpt.gpt_fields``).

    transformer.wte.weight                 -> embed.weight
    transformer.wpe.weight                 -> pos_embed.weight
    transformer.h.{i}.ln_1.{weight,bias}   -> blocks.{i}.norm1.{weight,bias}
    transformer.h.{i}.attn.c_attn.weight   -> blocks.{i}.mixer.in_proj_weight    transposed: (d, 3d) -> (3d, d)
    transformer.h.{i}.attn.c_attn.bias     -> blocks.{i}.mixer.in_proj_bias       [q; k; v] in both
    transformer.h.{i}.attn.c_proj.*        -> blocks.{i}.mixer.out_proj.*        weight transposed
    transformer.h.{i}.ln_2.*               -> blocks.{i}.norm2.*
    transformer.h.{i}.mlp.c_fc.*           -> blocks.{i}.mlp.fc1.*               weight transposed
    transformer.h.{i}.mlp.c_proj.*         -> blocks.{i}.mlp.fc2.*               weight transposed
    transformer.ln_f.*                     -> norm.*
    lm_head.weight                         -> head.weight                        (tied to wte by default)

GPT-2 stores its projections as ``Conv1D`` modules whose weight is (in, out), the transpose of
``nn.Linear``'s (out, in): ``y = x W + b``. Every projection weight is transposed on the way in.
Configurations seqlab's LM cannot express are rejected with the field to change.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from seqlab.models.gpt import gpt_fields
from seqlab.models.lm import LM, LMConfig

__all__ = ["convert_gpt2", "gpt2_config", "load_mapped"]

_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def gpt2_config(hf_config) -> LMConfig:
    """The LMConfig equivalent to a transformers ``GPT2Config``."""
    c = hf_config
    checks = [
        (c.activation_function in _ACT, f"activation_function={c.activation_function!r}"),
        (c.scale_attn_weights, "scale_attn_weights=False"),
        (not c.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx=True"),
        (not getattr(c, "add_cross_attention", False), "add_cross_attention=True"),
    ]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"cannot convert this GPT2Config: seqlab's LM does not support {what}")
    fields = gpt_fields(
        c.n_embd,
        c.n_layer,
        c.n_head,
        c.n_positions,
        vocab_size=c.vocab_size,
        d_ff=c.n_inner,
        mlp=_ACT[c.activation_function],
        norm_eps=c.layer_norm_epsilon,
        tie_weights=bool(getattr(c, "tie_word_embeddings", True)),
        dropout=float(c.resid_pdrop),  # the model trains as HF's would (it comes back in HF's mode)
    )
    if not c.resid_pdrop == c.embd_pdrop == c.attn_pdrop:
        logging.getLogger("seqlab").warning(
            "GPT-2's dropouts differ (resid_pdrop=%s, embd_pdrop=%s, attn_pdrop=%s): seqlab's LM trains with one "
            "rate, resid_pdrop's, for all three (inference is unaffected)",
            c.resid_pdrop,
            c.embd_pdrop,
            c.attn_pdrop,
        )
    return LMConfig(**fields)


@torch.no_grad()
def load_mapped(model: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """Copy ``tensors`` (seqlab names) into ``model``; every parameter must be covered, nothing left over."""
    own = dict(model.named_parameters())  # a tied weight appears once, under its first name
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own) - {"head.weight"})
    if missing or extra:
        raise ValueError(f"weight map incomplete: missing {missing}, unexpected {extra}")
    for name, p in own.items():
        t = tensors[name]
        if t.shape != p.shape:
            raise ValueError(f"{name}: expected shape {tuple(p.shape)}, got {tuple(t.shape)}")
        p.copy_(t.to(p.dtype))
    return model


def convert_gpt2(hf_model: nn.Module) -> LM:
    """seqlab LM with the weights of a transformers ``GPT2LMHeadModel`` (same device, dtype and mode)."""
    config = gpt2_config(hf_model.config)
    sd = hf_model.state_dict()
    ref = sd["transformer.wte.weight"]
    out = {
        "embed.weight": ref,
        "pos_embed.weight": sd["transformer.wpe.weight"],
        "norm.weight": sd["transformer.ln_f.weight"],
        "norm.bias": sd["transformer.ln_f.bias"],
    }
    if not config.tie_weights:
        out["head.weight"] = sd["lm_head.weight"]
    pairs = [
        ("ln_1", "norm1", False),
        ("ln_2", "norm2", False),
        ("attn.c_proj", "mixer.out_proj", True),
        ("mlp.c_fc", "mlp.fc1", True),
        ("mlp.c_proj", "mlp.fc2", True),
    ]
    for i in range(config.n_layers):
        src, dst = f"transformer.h.{i}.", f"blocks.{i}."
        out[dst + "mixer.in_proj_weight"] = sd[src + "attn.c_attn.weight"].t()  # Conv1D (d, 3d) -> (3d, d)
        out[dst + "mixer.in_proj_bias"] = sd[src + "attn.c_attn.bias"]
        for a, b, conv in pairs:
            w = sd[src + a + ".weight"]
            out[dst + b + ".weight"] = w.t() if conv else w  # Conv1D (in, out) -> Linear (out, in)
            out[dst + b + ".bias"] = sd[src + a + ".bias"]
    model = LM(config, device=ref.device, dtype=ref.dtype)
    load_mapped(model, out)
    return model.train(hf_model.training)
