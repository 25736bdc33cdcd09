"""Hugging Face ``ViTModel`` and ``ViTForImageClassification`` -> seqlab ``ViT`` (``seqlab.models.vit``).

    embeddings.cls_token                               -> cls_token                          (1, 1, d)
    embeddings.position_embeddings                     -> pos_embed                          (1, T, d)
    embeddings.patch_embeddings.projection.*           -> patch_embed.proj.*                 Conv2d (d, c, P, P)
    layers.{i}.layernorm_before.*                      -> layers.{i}.norm1.*
    layers.{i}.attention.{q,k,v}_proj.{weight,bias}    -> layers.{i}.self_attn.in_proj_{weight,bias}  stacked
    layers.{i}.attention.o_proj.*                      -> layers.{i}.self_attn.out_proj.*
    layers.{i}.layernorm_after.*                       -> layers.{i}.norm2.*
    layers.{i}.mlp.fc{1,2}.*                           -> layers.{i}.mlp.fc{1,2}.*
    layernorm.*                                        -> norm.*
    pooler.dense.*                                     -> pooler.*                           ViTModel only
    classifier.*                                       -> head.*                             ViTForImageClassification

Those are the names of transformers 5; the older layout (``encoder.layer.{i}.attention.attention.query``,
``attention.output.dense``, ``intermediate.dense``, ``output.dense``), as transformers 4 and old checkpoints
have it, is renamed first, and a ``vit.`` prefix (the classifier's backbone) stripped.

Heads and pooling. ``ViTModel`` becomes a backbone (``n_classes=0``) whose ``pool`` is its pooler, tanh(W
LN(z_L)^0 + b) (``pooler=True``; ``add_pooling_layer=False`` gives none). ``ViTForImageClassification``
builds its ViTModel without the pooler and classifies the normalized class token, logits = W LN(z_L)^0 + b,
which is seqlab's ``pool='cls'`` head; ``num_labels=0`` (an Identity classifier) gives ``n_classes=0``.

``qkv_bias=False``: HF drops the q, k, v biases only (its output projection, MLP and LayerNorms keep theirs),
while seqlab's ``bias`` switch covers every projection. The converted model has ``bias=True`` and the q, k, v
thirds of ``in_proj_bias`` set to zero, so it computes the same function; but those zeros are parameters that
training would move, where HF has none (freeze them, or mask their gradient, to fine-tune HF's model
exactly). The converter logs a warning saying so.

Other images sizes: seqlab resizes the learned positions whenever the patch grid differs from the training
one, by the bicubic interpolation of HF's ``interpolate_pos_encoding=True`` (same method, target size and
``align_corners``; seqlab interpolates in float32, see ``seqlab.layers.patch``). HF refuses other sizes
unless that flag is passed.
"""

from __future__ import annotations

import logging
import re

import torch
from torch import Tensor, nn

from seqlab.interop.hf_gpt2 import load_mapped
from seqlab.models.vit import ViT, ViTConfig

__all__ = ["convert_vit", "map_vit_state", "vit_config"]

log = logging.getLogger(__name__)

_LEGACY = [  # transformers 4 names -> transformers 5 names, applied in this order
    (r"^encoder\.layer\.", "layers."),
    (r"\.attention\.attention\.query\.", ".attention.q_proj."),
    (r"\.attention\.attention\.key\.", ".attention.k_proj."),
    (r"\.attention\.attention\.value\.", ".attention.v_proj."),
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),
]


def _square(value, what: str) -> int:
    """An int from HF's int-or-pair ``image_size``/``patch_size``; seqlab's ViT is square."""
    if isinstance(value, int):
        return value
    h, w = value
    if h != w:
        raise ValueError(f"cannot convert this ViTConfig: {what}={list(value)}; seqlab's ViT is square")
    return int(h)


def vit_config(hf_config, pooler: bool = False, n_classes: int = 0) -> ViTConfig:
    """The ViTConfig equivalent to a transformers ``ViTConfig``, with or without the pooler and a head."""
    c = hf_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    drop, attn_drop = c.hidden_dropout_prob, c.attention_probs_dropout_prob
    checks = [
        (c.hidden_act == "gelu", f"hidden_act={c.hidden_act!r} (the exact erf GELU, 'gelu', only)"),
        (head_dim * c.num_attention_heads == c.hidden_size, f"head_dim={head_dim} != hidden_size / heads"),
        (
            drop == attn_drop,
            f"hidden_dropout_prob={drop} != attention_probs_dropout_prob={attn_drop} (one rate)",
        ),
    ]
    if pooler:
        size, act = getattr(c, "pooler_output_size", c.hidden_size), getattr(c, "pooler_act", "tanh")
        checks.append((size == c.hidden_size, f"pooler_output_size={size} != hidden_size={c.hidden_size}"))
        checks.append((act == "tanh", f"pooler_act={act!r} (tanh only)"))
    for ok, what in checks:
        if not ok:
            raise ValueError(f"cannot convert this ViTConfig: seqlab's ViT does not support {what}")
    return ViTConfig(
        image_size=_square(c.image_size, "image_size"),
        patch_size=_square(c.patch_size, "patch_size"),
        in_channels=c.num_channels,
        n_classes=n_classes,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        pool="cls",
        position="learned",
        dropout=drop,
        norm_eps=c.layer_norm_eps,
        bias=True,  # HF's qkv_bias=False is zero q, k, v biases here (module docstring)
        pooler=pooler,
    )


def _canonical(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """HF names without the ``vit.`` prefix, in the transformers 5 layout."""
    out = {}
    for name, t in sd.items():
        name = name.removeprefix("vit.")
        for pattern, new in _LEGACY:
            name = re.sub(pattern, new, name)
        out[name] = t
    return out


def map_vit_state(sd: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """HF ViT tensors -> seqlab ViT names (q, k, v stacked; absent q, k, v biases as zeros; mask token dropped).

    The map is linear, so it also carries gradients: applied to HF's ``.grad`` by name it gives the gradients
    of the converted parameters.
    """
    sd = _canonical(sd)
    out = {
        "cls_token": sd["embeddings.cls_token"],
        "pos_embed": sd["embeddings.position_embeddings"],
        "patch_embed.proj.weight": sd["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": sd["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": sd["layernorm.weight"],
        "norm.bias": sd["layernorm.bias"],
    }
    for hf_name, ours in (("pooler.dense", "pooler"), ("classifier", "head")):
        if hf_name + ".weight" in sd:
            out[ours + ".weight"], out[ours + ".bias"] = sd[hf_name + ".weight"], sd[hf_name + ".bias"]
    pairs = [
        ("layernorm_before", "norm1"),
        ("attention.o_proj", "self_attn.out_proj"),
        ("layernorm_after", "norm2"),
        ("mlp.fc1", "mlp.fc1"),
        ("mlp.fc2", "mlp.fc2"),
    ]
    for i in range(n_layers):
        src, dst = f"layers.{i}.", f"layers.{i}."
        qkv = [src + f"attention.{p}_proj" for p in "qkv"]
        w = [sd[p + ".weight"] for p in qkv]
        out[dst + "self_attn.in_proj_weight"] = torch.cat(w)  # 3 x (d, d) -> (3d, d), rows [W_q; W_k; W_v]
        b = [sd.get(p + ".bias", torch.zeros_like(w_p[:, 0])) for p, w_p in zip(qkv, w, strict=True)]
        out[dst + "self_attn.in_proj_bias"] = torch.cat(b)  # (3d,)
        for a, c in pairs:
            out[dst + c + ".weight"], out[dst + c + ".bias"] = sd[src + a + ".weight"], sd[src + a + ".bias"]
    return out


def convert_vit(hf_model: nn.Module) -> ViT:
    """seqlab ViT with the weights of a transformers ``ViTModel`` or ``ViTForImageClassification``.

    Same device, dtype and train/eval mode as ``hf_model``; see the module docstring for the heads.
    """
    kind = type(hf_model).__name__
    if kind == "ViTModel":
        pooler, n_classes = getattr(hf_model, "pooler", None) is not None, 0
    elif kind == "ViTForImageClassification":
        pooler, n_classes = False, hf_model.config.num_labels
    else:
        raise ValueError(f"convert_vit takes ViTModel or ViTForImageClassification, got {kind}")
    config = vit_config(hf_model.config, pooler=pooler, n_classes=n_classes)
    if not hf_model.config.qkv_bias:
        log.warning(
            "qkv_bias=False: the converted ViT has zero q, k, v biases (in_proj_bias), which training would "
            "update; HF's model has none. Freeze them to fine-tune the same model."
        )
    sd = hf_model.state_dict()
    ref = next(t for name, t in sd.items() if name.endswith("embeddings.cls_token"))
    model = ViT(config, device=ref.device, dtype=ref.dtype)
    load_mapped(model, map_vit_state(sd, config.n_layers))
    return model.train(hf_model.training)
