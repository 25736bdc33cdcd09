"""Hugging Face ``LlamaForCausalLM`` -> seqlab ``LM`` in its Llama shape (RoPE attention mixer).

    model.embed_tokens.weight                       -> embed.weight
    model.layers.{i}.input_layernorm.weight         -> blocks.{i}.norm1.weight           (RMSNorm)
    model.layers.{i}.self_attn.{q,k,v}_proj.weight  -> blocks.{i}.mixer.in_proj_weight   stacked [q; k; v]
    model.layers.{i}.self_attn.o_proj.weight        -> blocks.{i}.mixer.out_proj.weight
    model.layers.{i}.post_attention_layernorm.weight-> blocks.{i}.norm2.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight -> blocks.{i}.mlp.{gate,up,down}.weight   (SwiGLU)
    model.norm.weight                               -> norm.weight
    lm_head.weight                                  -> head.weight                       (untied unless tied)

HF Llama's rotary embedding rotates the halves of each head (``rotate_half``), which is seqlab's
``RotaryEmbedding(interleaved=False)``; its q/k weights are already laid out for that. RoPE scaling
variants (linear, dynamic, llama3, yarn) are rejected: only the default rotary is implemented.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from seqlab.interop.hf_gpt2 import load_mapped
from seqlab.models.lm import LM, LMConfig

__all__ = ["convert_llama", "llama_config"]


def _rope_theta(c) -> tuple[float, str]:
    params = getattr(c, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    kind = params.get("rope_type", (getattr(c, "rope_scaling", None) or {}).get("rope_type", "default"))
    return float(theta), kind


def llama_config(hf_config) -> LMConfig:
    """The LMConfig equivalent to a transformers ``LlamaConfig``."""
    c = hf_config
    theta, kind = _rope_theta(c)
    attn_bias, mlp_bias = bool(getattr(c, "attention_bias", False)), bool(getattr(c, "mlp_bias", False))
    checks = [
        (c.hidden_act == "silu", f"hidden_act={c.hidden_act!r} (SwiGLU uses SiLU)"),
        (kind == "default", f"rope_type={kind!r} (only the default rotary embedding)"),
    ]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"cannot convert this LlamaConfig: seqlab's LM does not support {what}")
    if getattr(c, "attention_dropout", 0.0):
        logging.getLogger("seqlab").warning(
            "LlamaConfig.attention_dropout=%s is not carried over: seqlab's LM has one dropout rate, for its "
            "embeddings and residual branches too; set LMConfig.dropout yourself to train with dropout "
            "(inference is unaffected)",
            c.attention_dropout,
        )
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    mixer = {
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "head_dim": None if head_dim * c.num_attention_heads == c.hidden_size else head_dim,
        "bias": attn_bias,
        "rope": True,
        "rope_base": theta,
    }
    return LMConfig(
        mixer="attention",
        mixer_config=mixer,
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        d_ff=c.intermediate_size,
        mlp="swiglu",
        norm="rmsnorm",
        norm_eps=c.rms_norm_eps,
        bias=mlp_bias,  # the LM's switch for its MLP (RMSNorm has no bias); the attention's is the mixer's
        tie_weights=bool(getattr(c, "tie_word_embeddings", False)),
        init="gpt2",
    )


def convert_llama(hf_model: nn.Module) -> LM:
    """seqlab LM with the weights of a transformers ``LlamaForCausalLM`` (same device, dtype and mode)."""
    config = llama_config(hf_model.config)
    sd = hf_model.state_dict()
    ref = sd["model.embed_tokens.weight"]
    out = {"embed.weight": ref, "norm.weight": sd["model.norm.weight"]}
    if not config.tie_weights:
        out["head.weight"] = sd["lm_head.weight"]
    for i in range(config.n_layers):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        attn = src + "self_attn."
        out[dst + "mixer.in_proj_weight"] = torch.cat([sd[attn + f"{p}_proj.weight"] for p in "qkv"])
        out[dst + "mixer.out_proj.weight"] = sd[attn + "o_proj.weight"]
        out[dst + "norm1.weight"] = sd[src + "input_layernorm.weight"]
        out[dst + "norm2.weight"] = sd[src + "post_attention_layernorm.weight"]
        for p in ("gate", "up", "down"):
            out[dst + f"mlp.{p}.weight"] = sd[src + f"mlp.{p}_proj.weight"]
        if config.mixer_config["bias"]:  # attention_bias
            out[dst + "mixer.in_proj_bias"] = torch.cat([sd[attn + f"{p}_proj.bias"] for p in "qkv"])
            out[dst + "mixer.out_proj.bias"] = sd[attn + "o_proj.bias"]
        if config.bias:  # mlp_bias
            for p in ("gate", "up", "down"):
                out[dst + f"mlp.{p}.bias"] = sd[src + f"mlp.{p}_proj.bias"]
    model = LM(config, device=ref.device, dtype=ref.dtype)
    load_mapped(model, out)
    return model.train(hf_model.training)
