"""seqlab's fused CPU kernel for GRU, RNN and LSTM (seqlab.kernels.recurrent) against torch.nn, and its fallback.

torch.nn's own GRU, RNN and LSTM are the reference: the same weights through ``load_state_dict``, float64, and every
output, final state and gradient compared. The kernel is compiled on the first test that needs it (about 30 s
on 2 cores, then cached in ~/.cache/seqlab/kernels).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from test_recurrent import torch_forward  # the same folder (pytest puts it on sys.path)
from torch import nn

from seqlab.kernels import recurrent as kernel_module
from seqlab.kernels.recurrent import GATES, load_recurrent_kernel, recurrent_layer, recurrent_layer_ref
from seqlab.layers import GRU, LSTM, RNN, recurrent_base
from seqlab.layers.recurrent_base import RNNBase

IN, H = 3, 4
KINDS = {  # name -> (seqlab class, torch.nn class, extra constructor arguments)
    "gru": (GRU, nn.GRU, {}),
    "rnn_tanh": (RNN, nn.RNN, {"nonlinearity": "tanh"}),
    "rnn_relu": (RNN, nn.RNN, {"nonlinearity": "relu"}),
    "lstm": (LSTM, nn.LSTM, {}),
    "lstm_proj": (LSTM, nn.LSTM, {}),  # with proj_size = hidden_size // 2 (extra_args)
}
_CXX = os.environ.get("CXX", "c++")
needs_compiler = pytest.mark.skipif(
    shutil.which(_CXX) is None or shutil.which("ninja") is None,
    reason=f"building seqlab's recurrent kernel needs a C++ compiler ({_CXX}) and ninja on PATH",
)


def extra_args(kind: str, hidden_size: int) -> dict:
    """KINDS' constructor arguments for ``kind``, the projected LSTM's proj_size half its hidden size."""
    return {**KINDS[kind][2], **({"proj_size": hidden_size // 2} if kind == "lstm_proj" else {})}


def make_pair(kind: str, hidden_size: int = H, **kw) -> tuple[nn.Module, nn.Module]:
    ours_cls, theirs_cls, _ = KINDS[kind]
    extra = extra_args(kind, hidden_size)
    theirs = theirs_cls(IN, hidden_size, batch_first=True, dtype=torch.float64, **extra, **kw)
    ours = ours_cls(IN, hidden_size, dtype=torch.float64, **extra, **kw)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def make_state(
    kind: str, *shape: int, dtype=torch.float64
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A random initial state of ``shape`` (..., H): h, or the LSTM's (h, c) (the projected LSTM's h H // 2 wide)."""
    if kind == "lstm_proj":
        return torch.randn(*shape[:-1], shape[-1] // 2, dtype=dtype), torch.randn(*shape, dtype=dtype)
    if kind == "lstm":
        return torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)
    return torch.randn(*shape, dtype=dtype)


def outputs_and_grads(layer, x: torch.Tensor, h0, params: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Output, final state (h_n, and the LSTM's c_n), and the gradients of a random projection of them w.r.t.
    everything. ``h0``: None, a tensor, or the LSTM's pair (h0, c0). ``layer`` may be a function of (x, state)
    over the parameters of ``params``."""
    params = layer if params is None else params
    x = x.detach().requires_grad_()
    names = ("h", "c") if isinstance(h0, tuple) else ("h",)
    state = (
        () if h0 is None else tuple(s.detach().requires_grad_() for s in (h0 if len(names) > 1 else (h0,)))
    )
    out, s_n = layer(x, None if h0 is None else state if len(state) > 1 else state[0])
    finals = s_n if isinstance(s_n, tuple) else (s_n,)
    g = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
    for f in finals:
        loss = loss + (f * torch.randn(f.shape, generator=g, dtype=f.dtype)).sum()
    inputs = {
        "x": x,
        **{f"{n}0": s for n, s in zip(names, state, strict=False)},
        **dict(params.named_parameters()),
    }
    grads = torch.autograd.grad(loss, list(inputs.values()))
    finals = {f"{n}_n": f for n, f in zip(("h", "c"), finals, strict=False)}
    return {"out": out, **finals, **{f"d{k}": v for k, v in zip(inputs, grads, strict=True)}}


def assert_same(got: dict, want: dict, **tol) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], **tol, msg=lambda m, k=key: f"{k}: {m}")


def kernel_outputs_and_grads(layer: nn.Module, x: torch.Tensor, h0: torch.Tensor, threads: int) -> dict:
    """``outputs_and_grads`` of a seqlab layer on its kernel (asserted), with torch on ``threads`` threads."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert layer.why_not_kernel(x) is None
        return outputs_and_grads(layer, x, h0)
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def count_kernel_calls(monkeypatch) -> list[int]:
    """Counts the layer's calls into seqlab's kernel, one per layer and direction."""
    calls = []

    def counting(*args, **kw):
        calls.append(1)
        return recurrent_layer(*args, **kw)

    monkeypatch.setattr(recurrent_base, "recurrent_layer", counting)
    return calls


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    ("num_layers", "bidirectional", "bias", "b", "t", "with_state"),
    [
        (1, False, True, 3, 5, True),
        (1, False, True, 2, 4, False),
        (2, False, True, 3, 4, True),
        (2, True, True, 2, 3, False),
        (1, True, False, 2, 5, True),
        (1, False, True, 1, 1, True),  # b = 1, t = 1
        (2, False, False, 1, 6, False),
    ],
)
def test_kernel_matches_torch_nn_in_float64(
    kind, num_layers, bidirectional, bias, b, t, with_state, count_kernel_calls
):
    ours, theirs = make_pair(kind, num_layers=num_layers, bidirectional=bidirectional, bias=bias)
    x = torch.randn(b, t, IN, dtype=torch.float64)
    h0 = make_state(kind, num_layers * (1 + bidirectional), b, H) if with_state else None
    assert ours.why_not_kernel(x) is None
    assert_same(outputs_and_grads(ours, x, h0), outputs_and_grads(theirs, x, h0), atol=1e-10, rtol=1e-10)
    assert len(count_kernel_calls) == num_layers * (1 + bidirectional)


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("hidden_size", [H, 37])  # 37: the vectorized gate loops and their scalar tails
def test_kernel_matches_torch_nn_in_float32_time_major(kind, hidden_size, count_kernel_calls):
    ours, theirs = make_pair(kind, hidden_size, num_layers=2)
    ours, theirs = ours.float(), theirs.float()
    ours.batch_first = theirs.batch_first = False
    x, h0 = torch.randn(7, 3, IN), make_state(kind, 2, 3, hidden_size, dtype=torch.float32)  # (t, b, in)
    assert_same(outputs_and_grads(ours, x, h0), outputs_and_grads(theirs, x, h0), atol=1e-5, rtol=1e-4)
    assert count_kernel_calls


def flat_layer(mode: str, reverse: bool = False, lengths: torch.Tensor | None = None):
    """recurrent_layer over flat tensor arguments and outputs, as gradcheck takes them: the LSTM's state is two
    arguments (h0, c0) and two outputs (h_n, c_n)."""

    def run(x, *rest):
        if mode != "LSTM":
            return recurrent_layer(x, *rest, mode, reverse, lengths)
        out, (h_n, c_n) = recurrent_layer(x, rest[:2], *rest[2:], mode, reverse, lengths)
        return out, h_n, c_n

    return run


def arg(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@needs_compiler
@pytest.mark.parametrize("mode", ["GRU", "RNN_TANH", "RNN_RELU", "LSTM"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lengths", [None, [3, 1]])
def test_gradcheck(mode, reverse, bias, lengths):
    assert load_recurrent_kernel() is not None
    g = GATES[mode]
    t, b = 3, 2
    biases = (arg(g * H), arg(g * H)) if bias else (None, None)
    states = (arg(b, H), arg(b, H)) if mode == "LSTM" else (arg(b, H),)
    args = (arg(t, b, IN), *states, arg(g * H, IN), arg(g * H, H), *biases)
    lengths = None if lengths is None else torch.tensor(lengths)
    assert torch.autograd.gradcheck(flat_layer(mode, reverse, lengths), args)


@needs_compiler
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("lengths", [None, [3, 1]])
def test_projected_lstm_gradcheck_and_double_backward(reverse, lengths):
    """The LSTM with a projection w_hr (P, H): h0 and out P wide, c0 H wide, w_hh (4H, P); every gradient, w_hr's
    included, by finite differences, and the second derivatives through the reference."""
    P, t, b = 3, 3, 2
    lengths = None if lengths is None else torch.tensor(lengths)

    def run(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr):
        out, (h_n, c_n) = recurrent_layer(x, (h0, c0), w_ih, w_hh, b_ih, b_hh, "LSTM", reverse, lengths, w_hr)
        return out, h_n, c_n

    args = (
        arg(t, b, IN),
        arg(b, P),
        arg(b, H),
        arg(4 * H, IN),
        arg(4 * H, P),
        arg(4 * H),
        arg(4 * H),
        arg(P, H),
    )
    assert torch.autograd.gradcheck(run, args)
    assert torch.autograd.gradgradcheck(run, args)


def test_projection_arguments_are_checked_by_name():
    x, h, c = torch.randn(3, 2, IN), torch.randn(2, 2), torch.randn(2, H)
    w_ih, w_hh, w_hr = torch.randn(4 * H, IN), torch.randn(4 * H, 2), torch.randn(2, H)
    with pytest.raises(ValueError, match=r"only the LSTM takes a projection w_hr, got one for GRU"):
        recurrent_layer(x, h, torch.randn(3 * H, IN), torch.randn(3 * H, 2), None, None, "GRU", w_hr=w_hr)
    with pytest.raises(ValueError, match=r"w_hr must be \(P, H\) with P = h0's width 2, got \(3, 4\)"):
        recurrent_layer(x, (h, c), w_ih, w_hh, None, None, "LSTM", w_hr=torch.randn(3, H))
    with pytest.raises(ValueError, match=r"c0 must be \(b, H\) = \(2, 4\), got \(2, 2\)"):
        recurrent_layer(x, (h, h), w_ih, w_hh, None, None, "LSTM", w_hr=w_hr)
    with pytest.raises(ValueError, match=r"w_hh must be \(G, P\) = \(16, 2\) for LSTM with H = 4, P = 2"):
        recurrent_layer(x, (h, c), w_ih, torch.randn(4 * H, H), None, None, "LSTM", w_hr=w_hr)
    with pytest.raises(ValueError, match=r"w_hr must have x's dtype"):
        recurrent_layer(x, (h, c), w_ih, w_hh, None, None, "LSTM", w_hr=w_hr.double())


DOUBLE = {"GRU": (GRU, nn.GRU), "RNN_TANH": (RNN, nn.RNN), "LSTM": (LSTM, nn.LSTM)}


@needs_compiler
@pytest.mark.parametrize("mode", list(DOUBLE))
def test_double_backward_is_exact(mode):
    """create_graph=True (a gradient penalty) differentiates the reference: gradgradcheck, and the same second
    derivatives as torch.nn's layer."""
    g = GATES[mode]
    states = (arg(2, H), arg(2, H)) if mode == "LSTM" else (arg(2, H),)
    args = (arg(3, 2, IN), *states, arg(g * H, IN), arg(g * H, H), arg(g * H), arg(g * H))
    assert torch.autograd.gradgradcheck(flat_layer(mode), args)
    assert torch.autograd.gradgradcheck(
        flat_layer(mode, True, torch.tensor([2, 3])), args
    )  # padded, reversed
    ours = DOUBLE[mode][0](IN, H, num_layers=2, batch_first=True).double()
    theirs = DOUBLE[mode][1](IN, H, num_layers=2, batch_first=True).double()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, IN, dtype=torch.float64)
    penalties = []
    for layer in (ours, theirs):
        xi = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(layer(xi)[0].pow(2).sum(), xi, create_graph=True)
        penalties.append(torch.autograd.grad(gx.pow(2).sum(), list(layer.parameters())))
    for a, b in zip(*penalties, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@needs_compiler
@pytest.mark.parametrize("mode", ["GRU", "RNN_TANH", "RNN_RELU", "LSTM"])
@pytest.mark.parametrize(
    ("dtype", "hidden_size", "tol"), [(torch.float64, 5, 1e-10), (torch.float32, 40, 1e-5)]
)
def test_kernel_matches_its_ref(mode, dtype, hidden_size, tol):
    g = GATES[mode]
    t, b = 6, 3
    torch.manual_seed(0)
    states = [torch.randn(b, hidden_size) for _ in range(2 if mode == "LSTM" else 1)]
    args = [torch.randn(t, b, IN), *states, torch.randn(g * hidden_size, IN) / 2]
    args += [torch.randn(g * hidden_size, hidden_size) / hidden_size**0.5, torch.randn(g * hidden_size)]
    args = [a.to(dtype).requires_grad_() for a in (*args, torch.randn(g * hidden_size))]
    x, *rest = args
    if mode == "LSTM":
        rest = [tuple(rest[:2]), *rest[2:]]
    for reverse, lengths in (
        (False, None),
        (True, None),
        (False, torch.tensor([6, 2, 4])),
        (True, torch.tensor([1, 6, 3])),
    ):
        got, want = (
            flat(recurrent_layer(x, *rest, mode, reverse, lengths)),
            flat(recurrent_layer_ref(x, *rest, mode, reverse, lengths)),
        )
        grads = [
            torch.autograd.grad(out[0].sum() + sum(s.square().sum() for s in out[1:]), args)
            for out in (got, want)
        ]
        for mine, ref in zip([*got, *grads[0]], [*want, *grads[1]], strict=True):
            # rounding scales with the terms summed, not with their (possibly cancelling) sum: the tolerance is
            # relative to each tensor's largest entry (a float32 ReLU gradient near 0.07 among entries up to 800
            # differed by one rounding of the large terms on an AMD EPYC)
            scale = ref.detach().abs().max().clamp(min=1).item()
            torch.testing.assert_close(mine, ref, atol=tol * scale, rtol=tol)


@needs_compiler
def test_only_the_final_state_used_and_input_without_grad():
    ours, theirs = make_pair("gru")
    x = torch.randn(2, 5, IN, dtype=torch.float64)  # no requires_grad: the kernel skips dx
    (ours(x)[1].sum()).backward()
    (theirs(x)[1].sum()).backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-10, rtol=1e-10, msg=name)


def flat(result) -> tuple[torch.Tensor, ...]:
    """(out, h_n) or the LSTM's (out, (h_n, c_n)) as one flat tuple."""
    out, state = result
    return (out, *state) if isinstance(state, tuple) else (out, state)


def padded_outputs_and_grads(layer: nn.Module, x: torch.Tensor, h0, lengths: torch.Tensor) -> dict:
    """``outputs_and_grads`` of a right-padded batch: torch.nn's layer through pack_padded_sequence (its own
    packed kernel), seqlab's with ``lengths``."""
    if isinstance(layer, RNNBase):
        return outputs_and_grads(lambda x, s: layer(x, s, lengths=lengths), x, h0, params=layer)
    return outputs_and_grads(lambda x, s: torch_forward(layer, x, s, lengths), x, h0, params=layer)


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    ("num_layers", "bidirectional", "with_state", "lengths"),
    [
        (1, False, True, [5, 2, 4]),
        (2, True, False, [3, 5, 1]),
        (2, True, True, [1, 1, 5]),
        (1, True, True, [5, 5, 5]),  # lengths that pad nothing
    ],
)
def test_padded_batches_run_the_kernel_as_torch_nn_packs_them(
    kind, num_layers, bidirectional, with_state, lengths, count_kernel_calls
):
    """Right padding in the kernel: the state held at padded steps (so the reverse direction starts at each row's
    own end), zero outputs there, the gradient passing held steps; the same numbers as torch.nn on the packed
    sequence in float64, outputs, final states and every gradient."""
    ours, theirs = make_pair(kind, num_layers=num_layers, bidirectional=bidirectional)
    lengths = torch.tensor(lengths)
    x = torch.randn(3, 5, IN, dtype=torch.float64)
    h0 = make_state(kind, num_layers * (1 + bidirectional), 3, H) if with_state else None
    assert ours.why_not_kernel(x, lengths) is None
    got = padded_outputs_and_grads(ours, x, h0, lengths)
    assert_same(got, padded_outputs_and_grads(theirs, x, h0, lengths), atol=1e-10, rtol=1e-10)
    assert len(count_kernel_calls) == num_layers * (1 + bidirectional)
    pad = torch.arange(5)[None, :] >= lengths[:, None]  # (b, t)
    assert (got["out"][pad] == 0).all()


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hidden_size", [5, 40, 240])
def test_padded_float32_batches_on_every_step_path(kind, threads, hidden_size):
    """Padding through each step product (the small ones, brgemm, MKL on two threads), where a padded row's
    carried dL/dh is kept across a product that overwrites the others: float32 against torch.nn's packed kernel."""
    ours, theirs = (m.float() for m in make_pair(kind, hidden_size, bidirectional=True))
    lengths = torch.tensor([12, 3, 7])
    x, h0 = torch.randn(3, 12, IN), make_state(kind, 2, 3, hidden_size, dtype=torch.float32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = padded_outputs_and_grads(ours, x, h0, lengths)
    finally:
        torch.set_num_threads(before)
    assert_same(got, padded_outputs_and_grads(theirs, x, h0, lengths), atol=1e-5, rtol=1e-5)


@needs_compiler
def test_padding_never_reaches_a_number_even_as_nan():
    for kind in KINDS:
        ours, _ = make_pair(kind, bidirectional=True)
        lengths = torch.tensor([4, 2])
        x = torch.randn(2, 4, IN, dtype=torch.float64)
        dirty = x.clone()
        dirty[1, 2:] = float("nan")
        clean = padded_outputs_and_grads(ours, x, None, lengths)
        got = padded_outputs_and_grads(ours, dirty, None, lengths)
        assert_same(got, clean)  # outputs, states and every gradient, dL/dx zero at the padding
        assert torch.equal(got["dx"][1, 2:], torch.zeros(2, IN, dtype=torch.float64))


def test_what_keeps_torch_nn_kernels():
    layer, _ = make_pair("gru")
    assert "float32 or float64" in layer.why_not_kernel(torch.randn(2, 4, IN).half())


@needs_compiler
def test_the_lstm_under_cpu_autocast_runs_as_torch_nn_does():
    """torch's CPU autocast runs torch.nn.LSTM in bfloat16 (its GRU and RNN stay float32): seqlab's LSTM then takes
    torch.nn's kernel too, so its output dtype and values are torch.nn's under autocast."""
    ours, theirs = (m.float() for m in make_pair("lstm"))
    x = torch.randn(2, 5, IN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "autocast" in ours.why_not_kernel(x)
        got, want = ours(x)[0], theirs(x)[0]
        gru = make_pair("gru")[0].float()
        assert gru.why_not_kernel(x) is None and gru(x)[0].dtype == torch.float32
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    assert ours.why_not_kernel(x) is None  # outside autocast: seqlab's kernel


def test_failed_build_warns_once_and_falls_back_to_torch_nn(monkeypatch, failed_build):
    failed_build(kernel_module.EXTENSION)
    monkeypatch.setattr("seqlab.layers.fastpath._logged", set())
    x = torch.randn(2, 5, IN, dtype=torch.float64)
    with failed_build.warns_once("recurrent kernel"):
        for kind in KINDS:
            ours, theirs = make_pair(kind, num_layers=2)
            assert "could not be built" in ours.why_not_kernel(x)
            assert_same(outputs_and_grads(ours, x, None), outputs_and_grads(theirs, x, None))
    assert kernel_module.build_info() == {"error": "RuntimeError: error: c++: command not found"}


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("batch", "hidden_size"), [(2, 16), (8, 160)])
def test_small_and_large_steps_match_torch_nn(kind, threads, batch, hidden_size):
    """A step's product runs as plain loops up to 163,840 (5 x 2^15) multiply-adds and through MKL past that:
    b 2, H 16 is below the limit, b 8, H 160 above it (the RNN's 8 x 160 x 160 = 204,800)."""
    ours, theirs = make_pair(kind, hidden_size, bidirectional=True)
    x, h0 = torch.randn(batch, 9, IN, dtype=torch.float64), make_state(kind, 2, batch, hidden_size)
    got = kernel_outputs_and_grads(ours, x, h0, threads)
    assert_same(got, outputs_and_grads(theirs, x, h0), atol=1e-10, rtol=1e-10)


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hidden_size", [5, 16, 40, 47, 240])
def test_float32_steps_match_torch_nn(kind, threads, hidden_size):
    """The steps' float32 products against torch.nn in float32. The small ones (AVX-512: each row's sums in
    registers, blocks of up to 128 columns, a masked last vector): the GRU's 15, 48, 120 and 141 gate columns and
    the RNN's 5 to 47 cover one to nine vectors with and without a partial last one, and two blocks (141); the
    backward's product has H columns. H 240 is past the small limit (the RNN's 3 x 240 x 240 = 172,800): oneDNN's
    brgemm on one thread (AVX-512), MKL on two."""
    ours, theirs = (m.float() for m in make_pair(kind, hidden_size))
    x, h0 = torch.randn(3, 12, IN), make_state(kind, 1, 3, hidden_size, dtype=torch.float32)
    got = kernel_outputs_and_grads(ours, x, h0, threads)
    assert_same(got, outputs_and_grads(theirs, x, h0), atol=1e-5, rtol=1e-5)


@needs_compiler
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("threads", [1, 2])
def test_whole_sequence_products_and_fused_bias_sums_match_torch_nn(kind, threads):
    """Past 2^25 multiply-adds the input projection and the input gradient run as oneDNN brgemm calls on blocks of
    64 rows (float32 with AVX-512): b 8, t 131 is 1,048 rows, 16 blocks and a last one of 24; 96 inputs and the
    GRU's 384 gate columns (H 128) or the RNN's 384 make 38.6M. Beside these larger steps the bias gradients are
    summed step by step in the backward loop (the GRU's r and z columns shared by both biases). Both directions:
    the backward direction walks the steps the other way. Against torch.nn in float32; it fails with a block's bias
    or rows dropped or a bias sum taken from the wrong columns."""
    ours_cls, theirs_cls, _ = KINDS[kind]
    hidden = {"gru": 128, "lstm": 96, "lstm_proj": 96}.get(kind, 384)  # 384 gate columns
    extra = extra_args(kind, hidden)
    theirs = theirs_cls(96, hidden, batch_first=True, bidirectional=True, **extra)
    ours = ours_cls(96, hidden, bidirectional=True, **extra)
    ours.load_state_dict(theirs.state_dict())
    torch.manual_seed(0)
    x, h0 = torch.randn(8, 131, 96), make_state(kind, 2, 8, hidden, dtype=torch.float32)
    got = kernel_outputs_and_grads(ours, x, h0, threads)
    assert_same(got, outputs_and_grads(theirs, x, h0), atol=1e-4, rtol=1e-4)


@needs_compiler
@pytest.mark.parametrize("kind", ["gru", "rnn_tanh", "lstm"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("reverse", [False, True])
def test_weight_gradients_through_brgemm_at_uneven_sizes(kind, threads, reverse):
    """Past 2^25 multiply-adds dW_ih and dW_hh are brgemm products of a transposed copy of x (or of the previous
    states) and the gate gradients: 8 x 8 tiles in registers with edges element by element, the rows in chunks of
    256. b 7, t 133 is 931 rows (a partial tile of 3, a chunk of 163), 91 inputs and 141, 101 or 403 hidden units
    leave partial tiles of 3 and 5 columns; the previous states are h0 then out[:-1] forwards, out[1:] then h0
    backwards. Against torch.nn in float32 (the reverse direction of a bidirectional layer)."""
    ours_cls, theirs_cls, extra = KINDS[kind]
    hidden = {"gru": 141, "lstm": 101}.get(kind, 403)  # G 423, 404, 403: 931 x 91 x G past 2^25
    theirs = theirs_cls(91, hidden, batch_first=True, bidirectional=reverse, **extra)
    ours = ours_cls(91, hidden, bidirectional=reverse, **extra)
    ours.load_state_dict(theirs.state_dict())
    torch.manual_seed(0)
    x, h0 = torch.randn(7, 133, 91), make_state(kind, 1 + reverse, 7, hidden, dtype=torch.float32)
    got = kernel_outputs_and_grads(ours, x, h0, threads)
    assert_same(got, outputs_and_grads(theirs, x, h0), atol=1e-4, rtol=1e-4)


LAYOUTS = {  # name -> (the leaf's shape, the (t, b, n) = (131, 8, 96) view of it that the layer takes)
    "batch-first": ((8, 131, 96), lambda leaf: leaf.transpose(0, 1)),
    "every other step": ((8, 262, 96), lambda leaf: leaf[:, ::2].transpose(0, 1)),
    "one row expanded": ((1, 131, 96), lambda leaf: leaf.expand(8, 131, 96).transpose(0, 1)),
    "every other feature": ((131, 8, 192), lambda leaf: leaf[..., ::2]),
}


@needs_compiler
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_input_gradient_in_any_input_layout(layout):
    """dL/dx through brgemm (past 2^25 multiply-adds: t 131, b 8, 96 inputs, the GRU's 384 gate columns) is written
    in the input's own layout where that is dense (a batch-first view), contiguous otherwise (a sliced or expanded
    input, one whose features are not contiguous): every one against the reference loop, values and gradients."""
    shape, view = LAYOUTS[layout]
    g = torch.Generator().manual_seed(3)
    leaf = torch.randn(shape, generator=g).requires_grad_()
    h0, w_ih, w_hh = (
        torch.randn(8, 128, generator=g),
        torch.randn(384, 96, generator=g) / 10,
        torch.randn(384, 128, generator=g) / 10,
    )
    b_ih, b_hh = torch.randn(384, generator=g), torch.randn(384, generator=g)

    def run(layer):
        out, h_n = layer(view(leaf), h0, w_ih, w_hh, b_ih, b_hh, "GRU")
        return out, torch.autograd.grad(out.square().sum() + h_n.sum(), [leaf])[0]

    (out, dx), (ref, ref_dx) = run(recurrent_layer), run(recurrent_layer_ref)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx, ref_dx, atol=1e-4, rtol=1e-4)


@needs_compiler
def test_a_strided_bias_in_the_small_steps():
    """b_hh as a view of every other element (not contiguous): the small steps read a contiguous copy they keep."""
    torch.manual_seed(0)
    h, g = 6, 18
    x, h0 = torch.randn(5, 2, IN, dtype=torch.float64), torch.randn(2, h, dtype=torch.float64)
    w_ih, w_hh = torch.randn(g, IN, dtype=torch.float64), torch.randn(g, h, dtype=torch.float64) / 3
    b_ih, b_hh = torch.randn(g, dtype=torch.float64), torch.randn(2 * g, dtype=torch.float64)[::2]
    assert not b_hh.is_contiguous()
    out, h_n = recurrent_layer(x, h0, w_ih, w_hh, b_ih, b_hh, "GRU")
    ref, ref_n = recurrent_layer_ref(x, h0, w_ih, w_hh, b_ih, b_hh, "GRU")
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(h_n, ref_n, atol=1e-12, rtol=1e-12)
