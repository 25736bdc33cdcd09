"""torch.nn -> seqlab: ``from_torch(module)`` returns the seqlab layer equivalent to a torch.nn one.

    from seqlab.interop import from_torch

    theirs = nn.LSTM(128, 256, num_layers=2)     # torch.nn's default batch_first=False
    ours = from_torch(theirs)                    # seqlab.layers.LSTM(..., batch_first=False), same weights
    ours(x)  # same numbers as theirs(x), plus seqlab's lengths=, step(), init_state() and forward_ref()

The result has the source's sizes, its ``batch_first`` (passed explicitly, since seqlab's default is True),
its device and dtype, its train/eval mode and each parameter's ``requires_grad``; the weights are copied,
not shared. Supported now: nn.RNN, nn.LSTM, nn.GRU and nn.RNNCell, nn.LSTMCell, nn.GRUCell. An LSTM with
``proj_size > 0`` (Sak et al. 2014) is rejected: seqlab's LSTM has no projection.

Converters live in ``CONVERTERS``, a dict from torch.nn type to a function ``module -> seqlab module``;
``register`` adds one for a new type. A subclass of a registered type converts as its nearest registered
base (its parameters are the base's; any behaviour it overrides is not carried over).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from seqlab.layers import recurrent

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
    if getattr(module, "proj_size", 0):
        raise ValueError(
            f"{type(module).__name__} has proj_size={module.proj_size}; seqlab's LSTM has no output projection, "
            "so only proj_size=0 converts"
        )
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
    ours = _LAYERS[_registered_base(module, _LAYERS)](module.input_size, module.hidden_size, **kw)
    return _with_weights_of(ours, module)


@register(*_CELLS)
def _recurrent_cell(module: nn.RNNCellBase) -> nn.Module:
    kw = {"bias": module.bias, **_factory(module)}
    if isinstance(module, nn.RNNCell):
        kw["nonlinearity"] = module.nonlinearity
    ours = _CELLS[_registered_base(module, _CELLS)](module.input_size, module.hidden_size, **kw)
    return _with_weights_of(ours, module)
