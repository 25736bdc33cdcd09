"""seqlab ``Encoder`` -> Hugging Face ``BertModel``; seqlab ``ViT`` -> ``ViTModel`` / ``ViTForImageClassification``.

The inverse of ``hf_bert`` and ``hf_vit`` (their docstrings have the name tables, read right to left here):
the stacked ``in_proj_{weight,bias}`` rows [W_q; W_k; W_v] are split into HF's three projections, every other
tensor is renamed.

BERT: every ``EncoderConfig`` is representable. An encoder without segment embeddings (``type_vocab_size=0``)
gets one all-zero token-type row, which adds nothing to any embedding: HF's BERT always adds one.

ViT: HF classifies the normalized class token with a learned position table, so ``pool='mean'`` and
``position='sincos'`` are refused, as are ``bias=False`` (HF's ``qkv_bias`` drops the q, k, v biases only)
and a pooler together with a classification head (``ViTForImageClassification`` has no pooler). A ViT with a
head (``n_classes > 0``) becomes ``ViTForImageClassification``, one without ``ViTModel`` (with its pooler when
``pooler=True``). The names are written in the layout of the installed transformers (4's ``encoder.layer``
or 5's ``layers``) through the renaming the importer uses.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from seqlab.interop.hf_export_lm import build_hf, refuse, transformers_lib
from seqlab.interop.hf_vit import _canonical
from seqlab.models.encoder import Encoder
from seqlab.models.vit import ViT

__all__ = ["bert_state", "export_bert", "export_vit", "vit_state"]

log = logging.getLogger(__name__)

_BERT_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}


def _split_qkv(sd: dict[str, Tensor], src: str, dsts: list[str], bias: bool = True) -> dict[str, Tensor]:
    """``src.in_proj_{weight,bias}`` (3d, d), (3d,) -> three (d, d), (d,) under ``dsts`` (q, k, v)."""
    out = {}
    parts = ("weight", "bias") if bias else ("weight",)
    for part in parts:
        for dst, t in zip(dsts, sd[f"{src}.in_proj_{part}"].chunk(3), strict=True):
            out[f"{dst}.{part}"] = t
    return out


# ---- BERT -----------------------------------------------------------------------------------------------------


def bert_hf_config(model: Encoder):
    """The ``BertConfig`` of a seqlab encoder."""
    c = model.config
    return transformers_lib().BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        intermediate_size=c.ff_width,
        hidden_act=_BERT_ACT[c.activation],
        hidden_dropout_prob=c.dropout,
        attention_probs_dropout_prob=c.dropout,
        max_position_embeddings=c.max_seq_len,
        type_vocab_size=max(c.type_vocab_size, 1),
        layer_norm_eps=c.norm_eps,
        pad_token_id=c.pad_token_id,
    )


def bert_state(model: Encoder) -> dict[str, Tensor]:
    """seqlab Encoder tensors under ``BertModel``'s names."""
    sd = model.state_dict()
    type_rows = sd.get("type_embed.weight", torch.zeros_like(sd["tok_embed.weight"][:1]))  # (types, d)
    out = {
        "embeddings.word_embeddings.weight": sd["tok_embed.weight"],
        "embeddings.position_embeddings.weight": sd["pos_embed.weight"],
        "embeddings.token_type_embeddings.weight": type_rows,
        "embeddings.LayerNorm.weight": sd["embed_norm.weight"],
        "embeddings.LayerNorm.bias": sd["embed_norm.bias"],
    }
    if model.pooler is not None:
        out["pooler.dense.weight"], out["pooler.dense.bias"] = sd["pooler.weight"], sd["pooler.bias"]
    pairs = [
        ("self_attn.out_proj", "attention.output.dense"),
        ("norm1", "attention.output.LayerNorm"),
        ("mlp.fc1", "intermediate.dense"),
        ("mlp.fc2", "output.dense"),
        ("norm2", "output.LayerNorm"),
    ]
    for i in range(model.config.n_layers):
        src, dst = f"layers.{i}.", f"encoder.layer.{i}."
        qkv = [dst + f"attention.self.{p}" for p in ("query", "key", "value")]
        out.update(_split_qkv(sd, src + "self_attn", qkv))
        for a, b in pairs:
            out[dst + b + ".weight"], out[dst + b + ".bias"] = sd[src + a + ".weight"], sd[src + a + ".bias"]
    return out


def export_bert(model: Encoder) -> nn.Module:
    """A ``BertModel`` (with its pooler when the encoder has one) giving the same hidden states."""
    if model.type_embed is None:
        log.info("type_vocab_size=0: BertModel gets one all-zero token-type embedding (it adds nothing)")
    pooler = {"add_pooling_layer": model.pooler is not None}
    return build_hf("BertModel", bert_hf_config(model), bert_state(model), model, kwargs=pooler)


# ---- ViT ------------------------------------------------------------------------------------------------------


def vit_hf_config(model: ViT):
    """The ``ViTConfig`` of a seqlab ViT; a ValueError names every field HF's ViT cannot represent."""
    c = model.config
    refuse(
        "ViTModel / ViTForImageClassification",
        [
            (c.pool == "cls", f"pool={c.pool!r} (HF's ViT classifies the class token: needs 'cls')"),
            (
                c.position == "learned",
                f"position={c.position!r} (HF's ViT has a learned table: needs 'learned')",
            ),
            (c.bias, "bias=False (HF's ViT keeps biases on every projection but q, k, v)"),
            (
                not (c.pooler and c.n_classes),
                "pooler=True with a classification head (ViTForImageClassification has no pooler)",
            ),
        ],
    )
    return transformers_lib().ViTConfig(
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        intermediate_size=model.layers[0].mlp.fc1.out_features,
        hidden_act="gelu",
        hidden_dropout_prob=c.dropout,
        attention_probs_dropout_prob=c.dropout,
        layer_norm_eps=c.norm_eps,
        image_size=c.image_size,
        patch_size=c.patch_size,
        num_channels=c.in_channels,
        qkv_bias=True,
        num_labels=max(c.n_classes, 1),
    )


def vit_state(model: ViT) -> dict[str, Tensor]:
    """seqlab ViT tensors under HF ViT's transformers-5 names, without the classifier's ``vit.`` prefix."""
    sd = model.state_dict()
    out = {
        "embeddings.cls_token": sd["cls_token"],
        "embeddings.position_embeddings": sd["pos_embed"],
        "embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "layernorm.weight": sd["norm.weight"],
        "layernorm.bias": sd["norm.bias"],
    }
    for ours, hf_name in (("pooler", "pooler.dense"), ("head", "classifier")):
        if ours + ".weight" in sd:
            out[hf_name + ".weight"], out[hf_name + ".bias"] = sd[ours + ".weight"], sd[ours + ".bias"]
    pairs = [
        ("norm1", "layernorm_before"),
        ("self_attn.out_proj", "attention.o_proj"),
        ("norm2", "layernorm_after"),
        ("mlp.fc1", "mlp.fc1"),
        ("mlp.fc2", "mlp.fc2"),
    ]
    for i in range(model.config.n_layers):
        src, dst = f"layers.{i}.", f"layers.{i}."
        out.update(_split_qkv(sd, src + "self_attn", [dst + f"attention.{p}_proj" for p in "qkv"]))
        for a, b in pairs:
            out[dst + b + ".weight"], out[dst + b + ".bias"] = sd[src + a + ".weight"], sd[src + a + ".bias"]
    return out


def export_vit(model: ViT) -> nn.Module:
    """``ViTForImageClassification`` (a head) or ``ViTModel`` (none) computing what ``model`` computes."""
    hf_config = vit_hf_config(model)
    if model.config.n_classes:
        return build_hf("ViTForImageClassification", hf_config, vit_state(model), model, rename=_canonical)
    pooler = {"add_pooling_layer": model.config.pooler}
    return build_hf("ViTModel", hf_config, vit_state(model), model, kwargs=pooler, rename=_canonical)
