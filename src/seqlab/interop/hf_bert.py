"""Hugging Face ``BertModel`` -> seqlab ``Encoder``, from a live transformers model or from a checkpoint folder.

    embeddings.word_embeddings.weight                 -> tok_embed.weight
    embeddings.position_embeddings.weight             -> pos_embed.weight
    embeddings.token_type_embeddings.weight           -> type_embed.weight
    embeddings.LayerNorm.{weight,bias}                -> embed_norm.{weight,bias}       (gamma/beta in old files)
    encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}
                                                      -> layers.{i}.self_attn.in_proj_{weight,bias}  stacked
    encoder.layer.{i}.attention.output.dense.*        -> layers.{i}.self_attn.out_proj.*
    encoder.layer.{i}.attention.output.LayerNorm.*    -> layers.{i}.norm1.*
    encoder.layer.{i}.intermediate.dense.*            -> layers.{i}.mlp.fc1.*
    encoder.layer.{i}.output.dense.*                  -> layers.{i}.mlp.fc2.*
    encoder.layer.{i}.output.LayerNorm.*              -> layers.{i}.norm2.*
    pooler.dense.*                                    -> pooler.*

A ``bert.`` prefix (checkpoints of BertFor... models) is stripped. :func:`load_bert_folder` reads
``config.json`` and ``model.safetensors`` directly, so loading needs neither transformers nor the network.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import Tensor, nn

from seqlab.interop.hf_gpt2 import load_mapped
from seqlab.models.encoder import Encoder, EncoderConfig

__all__ = ["bert_config", "convert_bert", "load_bert_folder", "map_bert_state"]

_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def bert_config(hf: dict, pooler: bool = True) -> EncoderConfig:
    """EncoderConfig from a BertConfig as a dict (``config.json`` or ``BertConfig.to_dict()``).

    Other families that share BERT's weight names are refused by their ``model_type`` (RoBERTa numbers its
    positions from padding_idx + 1, so its weights would load and give other numbers), and so are BERT
    decoders (``is_decoder``: a causal mask; ``add_cross_attention``: weights seqlab's encoder has no place
    for). Dropout: seqlab's encoder has one rate, ``hidden_dropout_prob``; a different attention rate is said."""
    kind = hf.get("model_type", "bert")
    if kind != "bert":
        raise ValueError(f"expected a BERT config (model_type 'bert'), got model_type={kind!r}")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(
                f"cannot convert this BERT config: {flag}=True (a decoder); seqlab's Encoder is bidirectional, "
                "without cross-attention"
            )
    act = hf.get("hidden_act", "gelu")
    pos = hf.get("position_embedding_type", "absolute")
    if act not in _ACT or pos != "absolute":
        raise ValueError(
            f"cannot convert this BERT config: hidden_act={act!r}, position_embedding_type={pos!r}; "
            f"seqlab's encoder supports {sorted(_ACT)} with absolute positions"
        )
    drop, attn_drop = hf.get("hidden_dropout_prob", 0.1), hf.get("attention_probs_dropout_prob", 0.1)
    if drop != attn_drop:
        logging.getLogger("seqlab").warning(
            "BERT's attention_probs_dropout_prob=%s differs from hidden_dropout_prob=%s: seqlab's encoder "
            "trains with one rate, %s, for both (inference is unaffected)",
            attn_drop,
            drop,
            drop,
        )
    return EncoderConfig(
        vocab_size=hf["vocab_size"],
        max_seq_len=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2),
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        d_model=hf["hidden_size"],
        d_ff=hf["intermediate_size"],
        activation=_ACT[act],
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        dropout=hf.get("hidden_dropout_prob", 0.1),
        pooler=pooler,
        pad_token_id=hf.get("pad_token_id") or 0,
    )


def map_bert_state(sd: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """HF BERT parameter names -> seqlab Encoder names (buffers such as position_ids are dropped)."""
    sd = {k.removeprefix("bert."): v for k, v in sd.items()}
    sd = {
        k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
        for k, v in sd.items()
    }
    out = {
        "tok_embed.weight": sd["embeddings.word_embeddings.weight"],
        "pos_embed.weight": sd["embeddings.position_embeddings.weight"],
        "embed_norm.weight": sd["embeddings.LayerNorm.weight"],
        "embed_norm.bias": sd["embeddings.LayerNorm.bias"],
    }
    if "embeddings.token_type_embeddings.weight" in sd:
        out["type_embed.weight"] = sd["embeddings.token_type_embeddings.weight"]
    if "pooler.dense.weight" in sd:
        out["pooler.weight"], out["pooler.bias"] = sd["pooler.dense.weight"], sd["pooler.dense.bias"]
    pairs = [
        ("attention.output.dense", "self_attn.out_proj"),
        ("attention.output.LayerNorm", "norm1"),
        ("intermediate.dense", "mlp.fc1"),
        ("output.dense", "mlp.fc2"),
        ("output.LayerNorm", "norm2"),
    ]
    for i in range(n_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        qkv = [src + f"attention.self.{p}" for p in ("query", "key", "value")]
        out[dst + "self_attn.in_proj_weight"] = torch.cat([sd[p + ".weight"] for p in qkv])  # (3d, d)
        out[dst + "self_attn.in_proj_bias"] = torch.cat([sd[p + ".bias"] for p in qkv])
        for a, b in pairs:
            out[dst + b + ".weight"], out[dst + b + ".bias"] = sd[src + a + ".weight"], sd[src + a + ".bias"]
    return out


def convert_bert(hf_model: nn.Module) -> Encoder:
    """seqlab Encoder with the weights of a transformers ``BertModel`` (same device, dtype and mode)."""
    sd = hf_model.state_dict()
    config = bert_config(hf_model.config.to_dict(), pooler=getattr(hf_model, "pooler", None) is not None)
    ref = sd["embeddings.word_embeddings.weight"]
    model = Encoder(config, device=ref.device, dtype=ref.dtype)
    load_mapped(model, map_bert_state(sd, config.n_layers))
    return model.train(hf_model.training)


def load_bert_folder(path: str | Path, device=None, dtype=None) -> Encoder:
    """An Encoder from a BERT checkpoint folder: ``config.json`` + ``model.safetensors``; returned in eval mode."""
    from safetensors.torch import load_file

    path = Path(path)
    for f in ("config.json", "model.safetensors"):
        if not (path / f).is_file():
            raise FileNotFoundError(f"{path} has no {f}: expected a Hugging Face BERT checkpoint folder")
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    sd = load_file(str(path / "model.safetensors"))
    has_pooler = any(k.removeprefix("bert.").startswith("pooler.") for k in sd)
    config = bert_config(hf, pooler=has_pooler)
    model = Encoder(config, device=device, dtype=dtype)
    load_mapped(model, map_bert_state(sd, config.n_layers))
    return model.eval()
