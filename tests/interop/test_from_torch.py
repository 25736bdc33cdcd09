"""seqlab.interop.from_torch: torch.nn recurrent modules to seqlab's, with their weights and settings."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import seqlab.interop.torch as interop_torch
from seqlab import layers
from seqlab.interop import from_torch

IN, H, T = 3, 5, 6
F64 = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}
LAYERS = [
    (nn.LSTM, layers.LSTM, {}),
    (nn.GRU, layers.GRU, {}),
    (nn.RNN, layers.RNN, {"nonlinearity": "tanh"}),
    (nn.RNN, layers.RNN, {"nonlinearity": "relu"}),
]
CELLS = [
    (nn.LSTMCell, layers.LSTMCell, {}),
    (nn.GRUCell, layers.GRUCell, {}),
    (nn.RNNCell, layers.RNNCell, {"nonlinearity": "tanh"}),
    (nn.RNNCell, layers.RNNCell, {"nonlinearity": "relu"}),
]


def parts(state) -> list[torch.Tensor]:
    return list(state) if isinstance(state, tuple) else [state]


@pytest.mark.parametrize(("theirs_cls", "ours_cls", "extra"), LAYERS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(
    ("num_layers", "bidirectional", "bias"), [(1, False, True), (2, True, False), (3, True, True)]
)
def test_layer_converts_with_same_numbers(
    theirs_cls, ours_cls, extra, batch_first, num_layers, bidirectional, bias
):
    torch.manual_seed(0)
    theirs = theirs_cls(
        IN, H, num_layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional, dtype=F64, **extra
    )
    ours = from_torch(theirs)
    assert type(ours) is ours_cls
    assert ours.batch_first is batch_first  # the source's, not seqlab's default
    assert (ours.num_layers, ours.bidirectional, ours.bias) == (num_layers, bidirectional, bias)
    assert getattr(ours, "nonlinearity", None) == extra.get("nonlinearity")
    assert ours.state_dict().keys() == theirs.state_dict().keys()

    x = torch.randn((2, T, IN) if batch_first else (T, 2, IN), dtype=F64, requires_grad=True)
    y_theirs, s_theirs = theirs(x)
    (g_theirs,) = torch.autograd.grad(y_theirs.square().sum(), x)
    for run in (ours.forward, ours.forward_ref):
        y, s = run(x)
        torch.testing.assert_close(y, y_theirs, **TOL)
        for a, b in zip(parts(s), parts(s_theirs), strict=True):
            torch.testing.assert_close(a, b, **TOL)
        (g,) = torch.autograd.grad(y.square().sum(), x)
        torch.testing.assert_close(g, g_theirs, **TOL)


@pytest.mark.parametrize(("theirs_cls", "ours_cls", "extra"), CELLS)
@pytest.mark.parametrize("bias", [True, False])
def test_cell_converts_with_same_numbers(theirs_cls, ours_cls, extra, bias):
    torch.manual_seed(0)
    theirs = theirs_cls(IN, H, bias=bias, dtype=F64, **extra)
    ours = from_torch(theirs)
    assert type(ours) is ours_cls and ours.bias is bias
    assert getattr(ours, "nonlinearity", None) == extra.get("nonlinearity")
    x = torch.randn(4, IN, dtype=F64)
    h = torch.randn(4, H, dtype=F64)
    state = (h, torch.randn(4, H, dtype=F64)) if theirs_cls is nn.LSTMCell else h
    for a, b in zip(parts(ours(x, state)), parts(theirs(x, state)), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_keeps_device_and_dtype(dtype, device):
    for theirs in (
        nn.GRU(IN, H, 2, device=device, dtype=dtype),
        nn.LSTMCell(IN, H, device=device, dtype=dtype),
    ):
        ours = from_torch(theirs)
        assert {(p.device.type, p.dtype) for p in ours.parameters()} == {(device, dtype)}


def test_keeps_mode_and_frozen_parameters_and_copies_weights():
    theirs = nn.LSTM(IN, H, 2, dropout=0.25).eval()
    theirs.weight_hh_l1.requires_grad_(False)
    ours = from_torch(theirs)
    assert not ours.training and ours.dropout == 0.25
    assert [n for n, p in ours.named_parameters() if not p.requires_grad] == ["weight_hh_l1"]
    before = ours.weight_ih_l0.detach().clone()
    with torch.no_grad():
        theirs.weight_ih_l0.add_(1.0)  # a copy, not shared storage
    torch.testing.assert_close(ours.weight_ih_l0.detach(), before)
    assert from_torch(nn.GRU(IN, H)).training


def test_subclass_converts_as_its_base():
    class MyLSTM(nn.LSTM):
        pass

    theirs = MyLSTM(IN, H, batch_first=True, dtype=F64)
    ours = from_torch(theirs)
    assert type(ours) is layers.LSTM
    x = torch.randn(2, T, IN, dtype=F64)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], **TOL)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_projected_lstm_converts_with_its_projection(bidirectional):
    """LSTMP (proj_size): the W_hr weights come along, outputs and both states equal torch.nn's."""
    torch.manual_seed(0)
    theirs = nn.LSTM(IN, H, num_layers=2, proj_size=2, bidirectional=bidirectional, dtype=F64)
    ours = from_torch(theirs)
    assert ours.proj_size == 2 and not ours.batch_first
    x = torch.randn(T, 4, IN, dtype=F64)
    (y_theirs, s_theirs), (y_ours, s_ours) = theirs(x), ours(x)
    assert y_ours.shape == (T, 4, 2 * (1 + bidirectional))
    torch.testing.assert_close(y_ours, y_theirs, **TOL)
    for a, b in zip(s_ours, s_theirs, strict=True):
        torch.testing.assert_close(a, b, **TOL)


class _NotRecurrent(nn.Module):
    """A module no converter is registered for (nor could one be, since the type is local to this file)."""


@pytest.mark.parametrize(
    ("module", "got"),
    [(nn.Sequential(), "torch.nn.Sequential"), (_NotRecurrent(), f"{__name__}._NotRecurrent")],
)
def test_other_modules_raise_type_error_naming_accepted_types(module, got):
    with pytest.raises(TypeError, match=rf"^from_torch converts .*; got {re.escape(got)}$") as info:
        from_torch(module)
    accepted = set(str(info.value).removeprefix("from_torch converts ").split("; got ")[0].split(", "))
    recurrent = {f"torch.nn.{name}" for name in ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell")}
    assert recurrent <= accepted  # other converters may be registered too


def test_register_adds_a_converter(monkeypatch):
    monkeypatch.setattr(interop_torch, "CONVERTERS", dict(interop_torch.CONVERTERS))  # a scratch registry
    marker = nn.Identity()

    @interop_torch.register(nn.Identity)
    def convert_identity(module):
        return marker

    assert interop_torch.CONVERTERS[nn.Identity] is convert_identity
    assert from_torch(nn.Identity()) is marker
