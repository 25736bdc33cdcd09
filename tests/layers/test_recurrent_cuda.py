"""seqlab's RNN, LSTM and GRU on CUDA: the weights laid out as one cuDNN buffer after ``.cuda()`` (no copy and no
warning at every call), the same outputs and gradients as torch.nn's layers on the same weights, and a state dict
that still saves and loads; on the CPU ``flatten_parameters`` leaves everything as it was."""

import warnings

import pytest
import torch
from torch import nn

from seqlab.layers import GRU, LSTM, RNN

KINDS = {
    "lstm": (nn.LSTM, LSTM, {}),
    "lstm_proj": (nn.LSTM, LSTM, {"proj_size": 3}),  # cuDNN's buffer holds W_hr too
    "gru": (nn.GRU, GRU, {}),
    "rnn_relu": (nn.RNN, RNN, {"nonlinearity": "relu"}),
}


def _pair(kind, **kw):
    theirs_cls, ours_cls, extra = KINDS[kind]
    kw = {"input_size": 6, "hidden_size": 8, "num_layers": 2, "batch_first": True, **extra, **kw}
    torch.manual_seed(0)
    theirs = theirs_cls(**kw)
    ours = ours_cls(**kw)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def test_on_the_cpu_flatten_parameters_changes_nothing():
    _, ours = _pair("gru")
    before = {n: (p.data_ptr(), p.clone()) for n, p in ours.named_parameters()}
    ours.flatten_parameters()
    ours.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in ours.parameters())
    for n, p in ours.float().named_parameters():
        torch.testing.assert_close(p, before[n][1], msg=n)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("bidirectional", [False, True])
def test_on_cuda_the_weights_are_one_buffer_and_the_numbers_torch_nn(kind, bidirectional):
    theirs, ours = _pair(kind, bidirectional=bidirectional)
    theirs, ours = theirs.cuda(), ours.cuda()
    storages = {p.untyped_storage().data_ptr() for p in ours.parameters()}
    assert len(storages) == 1, "the weights should be views of one buffer"
    x = torch.randn(4, 7, 6, device="cuda")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not part of single contiguous chunk.*")
        y, _ = ours(x)
        y.square().sum().backward()
    y_ref, _ = theirs(x)
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref)
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    saved = {
        k: v.detach().contiguous().cpu() for k, v in ours.state_dict().items()
    }  # what a checkpoint writes
    _, fresh = _pair(kind, bidirectional=bidirectional)
    fresh.load_state_dict(saved)
    fresh = fresh.cuda()
    torch.testing.assert_close(fresh(x)[0], y)
