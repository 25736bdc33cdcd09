"""cuDNN's single weight buffer for seqlab's recurrent layers on CUDA.

cuDNN's RNN kernels take every layer's and direction's weights from one contiguous buffer. torch.nn's RNNs keep
their parameters as views of such a buffer (``flatten_parameters``); a layer whose weights are separate tensors
has them copied into a fresh buffer at every call, with a UserWarning each time. seqlab's RNN, LSTM and GRU hold
torch.nn's parameters in torch.nn's order (``weight_ih_l{k}``, ``weight_hh_l{k}``, then the two biases and an LSTM's
``weight_hr_l{k}``, per layer and direction), so torch's own flattening op lays them out the same way.
"""

from __future__ import annotations

import torch

__all__ = ["flatten_cudnn_weights"]


def flatten_cudnn_weights(rnn) -> None:
    """Make ``rnn``'s weights (an ``RNNBase``: ``_flat_weights`` in torch.nn's order, ``mode`` one of 'LSTM', 'GRU',
    'RNN_TANH', 'RNN_RELU') views of one cuDNN buffer, in place, values unchanged; nothing unless they are all
    CUDA tensors of one dtype that cuDNN takes, and none alias another."""
    weights = rnn._flat_weights
    first = weights[0]
    if any(
        not w.is_cuda or w.dtype != first.dtype or not torch.backends.cudnn.is_acceptable(w) for w in weights
    ):
        return
    if len({w.data_ptr() for w in weights}) != len(weights):  # aliased weights keep the copying path
        return
    import torch.backends.cudnn.rnn as cudnn_rnn

    with torch.cuda.device_of(first), torch.no_grad():
        if torch._use_cudnn_rnn_flatten_weight():
            torch._cudnn_rnn_flatten_weight(
                weights,
                (4 if rnn.bias else 2) + (1 if rnn.proj_size else 0),  # weights per layer and direction
                rnn.input_size,
                cudnn_rnn.get_cudnn_mode(rnn.mode),
                rnn.hidden_size,
                rnn.proj_size,  # the LSTM's W_hr (0: none)
                rnn.num_layers,
                rnn.batch_first,
                rnn.bidirectional,
            )
