"""torch.nn -> seqlab: ``from_torch(module)`` returns the seqlab layer equivalent to a torch.nn one.

    from seqlab.interop import from_torch

    theirs = nn.LSTM(128, 256, num_layers=2)     # torch.nn's default batch_first=False
    ours = from_torch(theirs)                    # seqlab.layers.LSTM(..., batch_first=False), same weights
    ours(x)  # same numbers as theirs(x), plus seqlab's lengths=, step(), init_state() and forward_ref()

The result has the source's sizes, its ``batch_first`` (passed explicitly, since seqlab's default is True),
its device and dtype, its train/eval mode and each parameter's ``requires_grad``; the weights are copied,
not shared. Supported now: nn.RNN, nn.LSTM, nn.GRU and nn.RNNCell, nn.LSTMCell, nn.GRUCell;
nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer (see their converters for
masks and batch layout: seqlab's attention is always batch-first, and converting a ``batch_first=False`` source
warns so). An LSTM's ``proj_size`` (Sak et al. 2014) converts with it.

Converters live in ``CONVERTERS``, a dict from torch.nn type to a function ``module -> seqlab module``;
``register`` adds one for a new type. A subclass of a registered type converts as its nearest registered
base (its parameters are the base's; any behaviour it overrides is not carried over).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch.nn.functional as F
from torch import nn

from seqlab.layers import recurrent
from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.transformer_blocks import Transformer, TransformerDecoderLayer, TransformerEncoderLayer

__all__ = ["CONVERTERS", "from_torch", "register"]

Converter = Callable[[nn.Module], nn.Module]
CONVERTERS: dict[type[nn.Module], Converter] = {}


def register(*types: type[nn.Module]) -> Callable[[Converter], Converter]:
    """Decorator: ``@register(nn.Foo)`` makes the decorated function the converter for ``nn.Foo``."""

    def add(converter: Converter) -> Converter:
        for t in types:
            CONVERTERS[t] = converter
        return converter

    return add


def from_torch(module: nn.Module) -> nn.Module:
    """The seqlab equivalent of ``module``, holding a copy of its weights. See the module docstring."""
    for t in type(module).__mro__:  # the exact type first, then its bases
        if t in CONVERTERS:
            return CONVERTERS[t](module)
    accepted = ", ".join(_type_name(t) for t in CONVERTERS)
    raise TypeError(f"from_torch converts {accepted}; got {_type_name(type(module))}")


def _type_name(t: type) -> str:
    """``torch.nn.LSTM`` rather than ``torch.nn.modules.rnn.LSTM``."""
    module = "torch.nn" if t.__module__.startswith("torch.nn.modules.") else t.__module__
    return f"{module}.{t.__qualname__}"


def _with_weights_of(ours: nn.Module, theirs: nn.Module) -> nn.Module:
    """Copy ``theirs``'s parameters into ``ours`` (strict: every name and shape must match)."""
    ours.load_state_dict(theirs.state_dict())
    frozen = {name for name, q in theirs.named_parameters() if not q.requires_grad}
    for name, p in ours.named_parameters():
        p.requires_grad_(name not in frozen)
    return ours.train(theirs.training)


def _factory(module: nn.Module) -> dict:
    p = next(module.parameters())
    return {"device": p.device, "dtype": p.dtype}


_LAYERS: dict[type[nn.Module], type[nn.Module]] = {
    nn.RNN: recurrent.RNN,
    nn.LSTM: recurrent.LSTM,
    nn.GRU: recurrent.GRU,
}
_CELLS: dict[type[nn.Module], type[nn.Module]] = {
    nn.RNNCell: recurrent.RNNCell,
    nn.LSTMCell: recurrent.LSTMCell,
    nn.GRUCell: recurrent.GRUCell,
}


def _registered_base(module: nn.Module, table: dict[type[nn.Module], type[nn.Module]]) -> type[nn.Module]:
    return next(t for t in type(module).__mro__ if t in table)


@register(*_LAYERS)
def _recurrent_layer(module: nn.RNNBase) -> nn.Module:
    kw = {
        "num_layers": module.num_layers,
        "bias": module.bias,
        "batch_first": module.batch_first,  # explicit: seqlab's default is True, torch.nn's False
        "dropout": module.dropout,
        "bidirectional": module.bidirectional,
        **_factory(module),
    }
    if isinstance(module, nn.RNN):
        kw["nonlinearity"] = module.nonlinearity
    if module.proj_size:  # an LSTM's projection (nn.RNN and nn.GRU refuse one)
        kw["proj_size"] = module.proj_size
    ours = _LAYERS[_registered_base(module, _LAYERS)](module.input_size, module.hidden_size, **kw)
    return _with_weights_of(ours, module)


@register(*_CELLS)
def _recurrent_cell(module: nn.RNNCellBase) -> nn.Module:
    kw = {"bias": module.bias, **_factory(module)}
    if isinstance(module, nn.RNNCell):
        kw["nonlinearity"] = module.nonlinearity
    ours = _CELLS[_registered_base(module, _CELLS)](module.input_size, module.hidden_size, **kw)
    return _with_weights_of(ours, module)


# ----------------------------------------------------------------------------------------------------------
# Attention and Transformer layers. seqlab's attention is batch-first only: the converted module takes
# (b, t, d) whatever the source's batch_first. Masks change polarity at this boundary: torch's boolean
# attn_mask is True where attending is NOT allowed and key_padding_mask True at padding; seqlab's masks are
# True where attending is allowed. ``seqlab.layers.masks.from_torch_mask(attn_mask, key_padding_mask)``
# converts a pair of torch masks into the one seqlab mask.


def _say_batch_first(module: nn.Module, layout: nn.Module) -> None:
    """A UserWarning when ``layout`` (the source, or its attention) is ``batch_first=False``: the converted module
    takes (b, t, d), so the source's (t, b, d) call would run without error and compute something else."""
    if not getattr(layout, "batch_first", True):
        warnings.warn(
            f"{type(module).__name__} has batch_first=False (inputs (t, b, d)); seqlab's attention is batch-first: "
            "call the converted module on (b, t, d), e.g. x.transpose(0, 1), or the same call computes other numbers",
            UserWarning,
            stacklevel=4,
        )


def _load_renamed(
    ours: nn.Module, theirs: nn.Module, rename: dict[str, str] | Callable[[str], str]
) -> nn.Module:
    """Copy ``theirs``'s parameters into ``ours`` under new names (strict): ``rename`` maps name prefixes, or
    is a function of the whole name. Frozen parameters stay frozen, and the train/eval mode is kept."""

    def by_prefix(name: str) -> str:
        for old, new in rename.items():
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    new_name = rename if callable(rename) else by_prefix

    ours.load_state_dict({new_name(k): v for k, v in theirs.state_dict().items()})
    frozen = {new_name(name) for name, q in theirs.named_parameters() if not q.requires_grad}
    for name, p in ours.named_parameters():
        p.requires_grad_(name not in frozen)
    return ours.train(theirs.training)


@register(nn.MultiheadAttention)
def _multihead_attention(module: nn.MultiheadAttention) -> nn.Module:
    """nn.MultiheadAttention -> seqlab MultiheadAttention; the packed in_proj (or, with kdim/vdim, the q, k, v
    projection weights) and out_proj keep their names.

    Call it as ``ours(q, k, v, mask=from_torch_mask(attn_mask, key_padding_mask))``; ours returns per-head
    weights on request, torch's default is their mean over heads.
    """
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError("add_bias_kv and add_zero_attn have no seqlab equivalent; only the defaults convert")
    _say_batch_first(module, module)
    ours = MultiheadAttention(
        module.embed_dim,
        module.num_heads,
        bias=module.in_proj_bias is not None,
        dropout=module.dropout,
        kdim=module.kdim,
        vdim=module.vdim,
        **_factory(module),
    )
    return _with_weights_of(ours, module)


def _activation_name(module: nn.Module) -> str:
    act = module.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or isinstance(act, nn.GELU):
        return "gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu"
    raise ValueError(f"activation {act!r} does not convert; seqlab's blocks take 'relu' or 'gelu'")


def _block_kwargs(module: nn.Module, attn: nn.MultiheadAttention) -> dict:
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError("the layer's attention has kdim/vdim, add_bias_kv or add_zero_attn: not supported")
    return {
        "d_ff": module.linear1.out_features,
        "dropout": module.dropout.p,
        "activation": _activation_name(module),
        "norm_first": module.norm_first,
        "bias": module.linear1.bias is not None,
        "norm_eps": module.norm1.eps,
        **_factory(module),
    }


_MLP_NAMES = {"linear1.": "mlp.fc1.", "linear2.": "mlp.fc2."}


@register(nn.TransformerEncoderLayer)
def _encoder_layer(module: nn.TransformerEncoderLayer) -> nn.Module:
    """-> seqlab TransformerEncoderLayer (non-causal); ``linear1``/``linear2`` become ``mlp.fc1``/``mlp.fc2``.

    Call ``ours(x, mask=from_torch_mask(src_mask, src_key_padding_mask))``.
    """
    sa = module.self_attn
    ours = TransformerEncoderLayer(sa.embed_dim, sa.num_heads, **_block_kwargs(module, sa))
    _say_batch_first(module, sa)
    return _load_renamed(ours, module, _MLP_NAMES)


@register(nn.TransformerDecoderLayer)
def _decoder_layer(module: nn.TransformerDecoderLayer) -> nn.Module:
    """-> seqlab TransformerDecoderLayer with ``causal=False``, torch's behaviour (the causal mask comes as
    ``tgt_mask``); ``multihead_attn`` becomes ``cross_attn``. Call ``ours(x, memory,
    mask=from_torch_mask(tgt_mask, tgt_key_padding_mask), memory_mask=from_torch_mask(memory_mask,
    memory_key_padding_mask))[0]``; set ``ours.self_attn.causal = True`` to drop the explicit causal mask.
    """
    sa = module.self_attn
    ours = TransformerDecoderLayer(sa.embed_dim, sa.num_heads, causal=False, **_block_kwargs(module, sa))
    _say_batch_first(module, sa)
    return _load_renamed(ours, module, {**_MLP_NAMES, "multihead_attn.": "cross_attn."})


def _check_same_settings(module: nn.Transformer, kw: dict, n_heads: int) -> None:
    """seqlab's Transformer takes one setting for every layer and both final norms: a ValueError naming the
    first layer (or norm) of a custom stack whose settings differ from the first encoder layer's."""
    named = [(f"encoder.layers.{i}", layer) for i, layer in enumerate(module.encoder.layers)]
    named += [(f"decoder.layers.{i}", layer) for i, layer in enumerate(module.decoder.layers)]
    for name, layer in named:
        theirs = {**_block_kwargs(layer, layer.self_attn), "n_heads": layer.self_attn.num_heads}
        for key, value in {**kw, "n_heads": n_heads}.items():
            if theirs[key] != value:
                raise ValueError(
                    f"{name} has {key}={theirs[key]!r} but encoder.layers.0 has {value!r}: seqlab's Transformer "
                    "takes one setting for every layer, so this stack does not convert"
                )
    for name in ("encoder.norm", "decoder.norm"):
        norm = module.get_submodule(name)
        if not isinstance(norm, nn.LayerNorm) or norm.eps != kw["norm_eps"]:
            got = f"eps={norm.eps}" if isinstance(norm, nn.LayerNorm) else type(norm).__name__
            raise ValueError(
                f"{name} is {got} but the layers' LayerNorm eps is {kw['norm_eps']}: seqlab's Transformer takes "
                "one LayerNorm eps, so this model does not convert"
            )


@register(nn.Transformer)
def _transformer(module: nn.Transformer) -> nn.Module:
    """nn.Transformer -> seqlab Transformer (``causal=False``: torch takes the causal mask as ``tgt_mask``).

    ``encoder.layers.i`` / ``decoder.layers.i`` become ``encoder_layers.i`` / ``decoder_layers.i`` with the layer
    renames above, ``encoder.norm`` / ``decoder.norm`` become ``encoder_norm`` / ``decoder_norm``. Call
    ``ours(src, tgt, src_mask=..., tgt_mask=from_torch_mask(causal_or_tgt_mask, tgt_key_padding_mask),
    memory_mask=...)``. Custom encoders or decoders (other than stacks of the standard layers) do not convert.
    """
    enc, dec = module.encoder, module.decoder
    if not (isinstance(enc, nn.TransformerEncoder) and isinstance(dec, nn.TransformerDecoder)):
        raise ValueError("only nn.Transformer with its own TransformerEncoder/TransformerDecoder converts")
    if enc.norm is None or dec.norm is None:
        raise ValueError("nn.Transformer without final encoder/decoder norms does not convert")
    first = enc.layers[0]
    sa = first.self_attn
    kw = _block_kwargs(first, sa)
    _check_same_settings(module, kw, sa.num_heads)
    _say_batch_first(module, module)
    ours = Transformer(sa.embed_dim, sa.num_heads, len(enc.layers), len(dec.layers), causal=False, **kw)

    def rename(name: str) -> str:
        for old, new in (
            ("encoder.layers.", "encoder_layers."),
            ("decoder.layers.", "decoder_layers."),
            ("encoder.norm.", "encoder_norm."),
            ("decoder.norm.", "decoder_norm."),
        ):
            if name.startswith(old):
                name = new + name[len(old) :]
        return (
            name.replace(".linear1.", ".mlp.fc1.")
            .replace(".linear2.", ".mlp.fc2.")
            .replace(".multihead_attn.", ".cross_attn.")
        )

    return _load_renamed(ours, module, rename)
