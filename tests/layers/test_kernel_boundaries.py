"""Bad input to the kernels and the scan helpers gets a clear ValueError at the boundary: the function's name,
what was expected and what came; never an error from inside torch, a crash or a silent wrong result.

Each test here failed before its check existed (the audit's findings 3, 5, 11, 13, 14, 16 and 17): an
out-of-bounds read or a segfault in the recurrent kernel, an integer scan truncated to int64, broadcast errors
from torch, ``range()`` or ``torch.zeros`` messages. Valid input keeps its numbers (the last tests of each part).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from seqlab.kernels import activations, selective_scan_kernel
from seqlab.kernels.causal_conv import causal_conv_silu
from seqlab.kernels.layer_norm import layer_norm
from seqlab.kernels.recurrent import load_recurrent_kernel, recurrent_layer, recurrent_layer_ref
from seqlab.layers import (
    GRU,
    LSTM,
    RNN,
    S4D,
    LinearAttention,
    Mamba,
    MinGRU,
    selective_scan,
    selective_scan_ref,
)
from seqlab.layers.checks import check_batch_size
from seqlab.layers.linear_attention import linear_attention_causal, linear_attention_recurrent_ref
from seqlab.layers.mingru import log_space_scan, log_space_scan_ref

needs_compiler = pytest.mark.skipif(
    shutil.which("c++") is None or shutil.which("ninja") is None,
    reason="building seqlab's recurrent kernel needs a C++ compiler and ninja",
)

T, B, IN, H = 3, 4, 2, 5


def _gru_args(**change):
    g = torch.Generator().manual_seed(0)
    args = {
        "x": torch.randn(T, B, IN, generator=g),
        "h0": torch.randn(B, H, generator=g),
        "w_ih": torch.randn(3 * H, IN, generator=g),
        "w_hh": torch.randn(3 * H, H, generator=g),
        "b_ih": torch.randn(3 * H, generator=g),
        "b_hh": torch.randn(3 * H, generator=g),
        "mode": "GRU",
    }
    return {**args, **change}


# ---- recurrent_layer: the Python boundary ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"h0": torch.zeros(2, H)},
            r"recurrent_layer: h0 must be \(b, H\) with x's batch b = 4, got \(2, 5\)",
        ),
        ({"h0": torch.zeros(6, H)}, r"h0 must be \(b, H\) with x's batch b = 4, got \(6, 5\)"),
        ({"w_hh": torch.zeros(3 * H, 6)}, r"w_hh must be \(G, H\) = \(15, 5\) for GRU .* got \(15, 6\)"),
        ({"w_ih": torch.zeros(3 * H, IN + 1)}, r"w_ih must be \(G, in\) = \(15, 2\) .* got \(15, 3\)"),
        ({"b_ih": torch.zeros(3 * H + 1)}, r"b_ih must be \(G,\) = \(15,\) .* got \(16,\)"),
        ({"b_hh": torch.zeros(2 * H)}, r"b_hh must be \(G,\) = \(15,\) .* got \(10,\)"),
        ({"b_hh": torch.zeros(3 * H, dtype=torch.float64)}, r"b_hh must have x's dtype and device"),
        (
            {"mode": "GRU2"},
            r"recurrent_layer: mode must be one of 'RNN_TANH', 'RNN_RELU', 'GRU', 'LSTM', got 'GRU2'",
        ),
        ({"mode": "LSTM"}, r"recurrent_layer: the LSTM's state must be a pair \(h0, c0\), got \(4, 5\)"),
        ({"lengths": torch.tensor([3.0, 1, 2, 3])}, r"lengths must be integers of shape \(b,\) = \(4,\)"),
        ({"lengths": torch.tensor([3, 1])}, r"lengths must be integers of shape \(b,\) = \(4,\), got \(2,\)"),
        (
            {"lengths": torch.tensor([3, 1, 0, 3])},
            r"every length must lie in \[1, t = 3\], got \[3, 1, 0, 3\]",
        ),
        ({"lengths": torch.tensor([True] * 4)}, r"lengths must be integers"),
        (
            {"mode": "LSTM", "h0": (torch.zeros(B, H), torch.zeros(B, H + 1))},
            r"recurrent_layer: c0 must be \(b, H\) = \(4, 5\), got \(4, 6\)",
        ),
        (
            {"mode": "LSTM", "h0": (torch.zeros(B, H), torch.zeros(B, H))},
            r"w_ih must be \(G, in\) = \(20, 2\) for LSTM with H = 5 .* got \(15, 2\)",
        ),
        (
            {"x": torch.zeros(T, B, IN, dtype=torch.int64)},
            r"x must be float32 or float64 on the CPU, got torch\.int64",
        ),
    ],
)
def test_recurrent_layer_refuses_what_its_kernel_cannot_read(change, message):
    # before: garbage from an out-of-bounds read (h0 of batch 2), silently dropped rows (batch 6), torch's
    # "mat1 and mat2 shapes cannot be multiplied", KeyError: 'LSTM'
    with pytest.raises(ValueError, match=message):
        recurrent_layer(**_gru_args(**change))


@pytest.mark.parametrize("missing", ["b_ih", "b_hh"])
def test_recurrent_layer_with_one_bias_is_refused_not_a_segfault(missing):
    # before: b_ih without b_hh dereferenced an empty optional in recurrent.cpp (SIGSEGV)
    with pytest.raises(ValueError, match=r"give both biases b_ih and b_hh or neither"):
        recurrent_layer(**_gru_args(**{missing: None}))


# ---- recurrent.cpp: the same checks in the extension itself ---------------------------------------------------


def _kernel_forward(args: dict):
    kernel = load_recurrent_kernel()
    if kernel is None:
        pytest.skip("seqlab's recurrent kernel could not be built")
    mode = {"RNN_TANH": 0, "RNN_RELU": 1, "GRU": 2, "LSTM": 3}.get(args["mode"], args["mode"])
    keys = ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh")
    w_hr = {"w_hr": args["w_hr"]} if "w_hr" in args else {}
    return kernel.forward(*(args[k] for k in keys), mode, False, args.get("c0"), args.get("lengths"), **w_hr)


@needs_compiler
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"h0": torch.zeros(2, H)}, r"h0 must be \(b, H\) with x's batch b = 4, got \[2, 5\]"),
        ({"h0": torch.zeros(6, H)}, r"h0 must be \(b, H\) with x's batch b = 4"),
        ({"w_hh": torch.zeros(3 * H, 6)}, r"w_hh must be \(G, H\) = \(15, 5\), got \[15, 6\]"),
        ({"w_ih": torch.zeros(3 * H)}, r"w_ih must be \(G, in\) = \(15, 2\), got \[15\]"),
        ({"b_hh": torch.zeros(3 * H + 1)}, r"the biases must be \(G,\) = \(15,\), got \[16\]"),
        ({"b_ih": torch.zeros(3 * H, dtype=torch.float64)}, r"must share one dtype"),
        ({"mode": 4}, r"mode must be 0 \(tanh\), 1 \(relu\), 2 \(GRU\) or 3 \(LSTM\), got 4"),
        ({"c0": torch.zeros(B, H)}, r"the LSTM takes a cell state c0 and the other modes none"),
        (
            {
                "mode": 3,
                "w_ih": torch.zeros(4 * H, IN),
                "w_hh": torch.zeros(4 * H, H),
                "b_ih": None,
                "b_hh": None,
            },
            r"the LSTM takes a cell state c0 and the other modes none",
        ),
        (
            {
                "mode": 3,
                "w_ih": torch.zeros(4 * H, IN),
                "w_hh": torch.zeros(4 * H, H),
                "c0": torch.zeros(B, 1),
            },
            r"c0 must be \(b, H\) = \(4, 5\), got \[4, 1\]",
        ),
        (
            {"lengths": torch.tensor([3, 1, 2, 3], dtype=torch.int32)},
            r"lengths must be a contiguous int64 CPU",
        ),
        ({"lengths": torch.tensor([3, 1, 2])}, r"lengths must be .* \(b,\) = \(4,\), got Long \[3\]"),
        ({"lengths": torch.tensor([3, 0, 2, 3])}, r"every length must lie in \[1, t = 3\], got 0"),
        ({"lengths": torch.tensor([3, 4, 2, 3])}, r"every length must lie in \[1, t = 3\], got 4"),
        ({"lengths": torch.tensor([3, 1, 2, 2])}, r"lengths must be sorted longest first"),
        ({"w_hr": torch.zeros(2, H)}, r"only the LSTM takes a projection w_hr"),
        (
            {
                "mode": 3,
                "w_ih": torch.zeros(4 * H, IN),
                "w_hh": torch.zeros(4 * H, H),
                "c0": torch.zeros(B, H),
                "b_ih": None,
                "b_hh": None,
                "w_hr": torch.zeros(3, H),
            },
            r"w_hr must be \(P, H\) with P = h0's width 5, got \[3, 5\]",
        ),
        (
            {
                "mode": 3,
                "h0": torch.zeros(B, 2),
                "w_ih": torch.zeros(4 * H, IN),
                "w_hh": torch.zeros(4 * H, H),
                "c0": torch.zeros(B, H),
                "b_ih": None,
                "b_hh": None,
                "w_hr": torch.zeros(2, H),
            },
            r"w_hh must be \(G, P\) = \(20, 2\), got \[20, 5\]",
        ),
    ],
)
def test_the_cpp_entry_checks_its_arguments_on_its_own(change, message):
    with pytest.raises(RuntimeError, match=message):
        _kernel_forward(_gru_args(**change))


@needs_compiler
def test_the_cpp_entry_refuses_one_bias_without_crashing():
    # in a child process: before the check, this call killed the interpreter
    code = (
        "import torch\n"
        "from seqlab.kernels.recurrent import load_recurrent_kernel\n"
        "k = load_recurrent_kernel()\n"
        "x, h0, w_ih, w_hh, b = torch.randn(3, 4, 2), torch.randn(4, 5), torch.randn(15, 2), torch.randn(15, 5), "
        "torch.randn(15)\n"
        "try:\n"
        "    k.forward(x, h0, w_ih, w_hh, b, None, 2, False, None, None)\n"
        "except RuntimeError as e:\n"
        "    print('refused:', str(e).splitlines()[0])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "refused: give both biases b_ih and b_hh or neither" in run.stdout


@needs_compiler
@pytest.mark.parametrize(("mode", "gates"), [("GRU", 3), ("RNN_TANH", 1), ("RNN_RELU", 1), ("LSTM", 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_valid_recurrent_layer_calls_keep_the_reference_numbers(mode, gates, bias):
    g = torch.Generator().manual_seed(1)
    x, h0 = torch.randn(T, B, IN, generator=g, dtype=torch.float64), torch.randn(B, H, generator=g).double()
    w_ih = torch.randn(gates * H, IN, generator=g, dtype=torch.float64)
    w_hh = torch.randn(gates * H, H, generator=g, dtype=torch.float64)
    biases = (
        [torch.randn(gates * H, generator=g, dtype=torch.float64) for _ in range(2)] if bias else [None] * 2
    )
    if load_recurrent_kernel() is None:
        pytest.skip("seqlab's recurrent kernel could not be built")
    if mode == "LSTM":
        h0 = (h0, torch.randn(B, H, generator=g, dtype=torch.float64))
    out, h_n = recurrent_layer(x, h0, w_ih, w_hh, *biases, mode)
    ref, ref_n = recurrent_layer_ref(x, h0, w_ih, w_hh, *biases, mode)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(h_n, ref_n)  # the LSTM's (h_n, c_n) pair compared as one


# ---- the selective scan -----------------------------------------------------------------------------------------


def _scan_inputs(b=2, t=5, d=4, n=3):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, t, d, generator=g),
        torch.rand(b, t, d, generator=g),
        -torch.rand(d, n, generator=g),
        torch.randn(b, t, n, generator=g),
        torch.randn(b, t, n, generator=g),
    )


def test_the_kernel_refuses_an_integer_u_instead_of_truncating_y():
    # before: no error, y came back as int64 (the float result truncated towards zero)
    u, delta, A, B, C = _scan_inputs()
    with pytest.raises(
        ValueError, match=r"selective_scan_kernel: u must be a floating tensor .* got torch\.int64"
    ):
        selective_scan_kernel(u.long(), delta, A, B, C)


SCANS = {
    "selective_scan": lambda *a, **k: selective_scan(*a, **k),
    "selective_scan_chunked": lambda *a, **k: selective_scan(*a, impl="chunked", **k),
    "selective_scan_ref": lambda *a, **k: selective_scan_ref(*a, **k),
    "selective_scan_kernel": lambda *a, **k: selective_scan_kernel(*a, **k),
}


@pytest.mark.parametrize("scan", list(SCANS))
@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("D", (3,), r"D must be \(d,\) = \(4,\) \(or broadcast to u's shape \(2, 5, 4\)\), got \(3,\)"),
        ("z", (2, 5, 5), r"z must be shaped like u, \(b, t, d\) = \(2, 5, 4\) .*got \(2, 5, 5\)"),
        ("z", (3, 5, 4), r"z must be shaped like u, \(b, t, d\) = \(2, 5, 4\) .*got \(3, 5, 4\)"),
        (
            "delta_bias",
            (5,),
            r"delta_bias must be \(d,\) = \(4,\) \(or broadcast to delta's shape .*got \(5,\)",
        ),
    ],
)
def test_the_scans_name_a_wrong_D_z_or_delta_bias(scan, name, shape, message):
    # before: "The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 2"
    owner = "selective_scan" if scan == "selective_scan_chunked" else scan
    with pytest.raises(ValueError, match=rf"{owner}: {message}"):
        SCANS[scan](*_scan_inputs(), **{name: torch.randn(*shape)})


def test_the_scans_refuse_an_integer_D():
    with pytest.raises(
        ValueError, match=r"selective_scan_ref: D must be a floating tensor .* got torch\.int64"
    ):
        selective_scan_ref(*_scan_inputs(), D=torch.ones(4, dtype=torch.int64))


@pytest.mark.parametrize(("name", "shape"), [("D", (1,)), ("z", (1, 1, 4)), ("delta_bias", (1, 4))])
def test_broadcast_D_z_and_bias_still_run_where_they_did(name, shape):
    # the reference and the chunked scan broadcast these; the fused kernel takes the exact shapes only
    extra = {name: torch.randn(*shape)}
    want = selective_scan_ref(*_scan_inputs(), **extra)
    torch.testing.assert_close(selective_scan(*_scan_inputs(), **extra), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(
        ValueError, match=rf"selective_scan_kernel cannot take these inputs: {name} has shape"
    ):
        selective_scan_kernel(*_scan_inputs(), **extra)


# ---- linear_attention_causal and log_space_scan ---------------------------------------------------------------


def _qkv(b=1, h=2, t=5, k=4, e=3):
    g = torch.Generator().manual_seed(0)
    return (
        torch.rand(b, h, t, k, generator=g),
        torch.rand(b, h, t, k, generator=g),
        torch.randn(b, h, t, e, generator=g),
    )


def test_linear_attention_causal_refuses_chunk_size_zero():
    # before: "range() arg 3 must not be zero"
    with pytest.raises(
        ValueError, match=r"linear_attention_causal: chunk_size must be a positive integer, got 0"
    ):
        linear_attention_causal(*_qkv(), chunk_size=0)


def test_linear_attention_causal_names_mismatched_q_k_v_and_state():
    q, k, v = _qkv()
    # before: "Expected size for first two dimensions of batch2 tensor to be: [2, 4] but got: [2, 3]."
    with pytest.raises(
        ValueError, match=r"expects k of q's shape \(b, h, t, k\) = \(1, 2, 5, 4\), got \(1, 2, 5, 3\)"
    ):
        linear_attention_causal(q, k[..., :3], v)
    with pytest.raises(
        ValueError, match=r"expects v of shape \(b, h, t, e\) = \(1, 2, 5, e\), got \(1, 2, 4, 3\)"
    ):
        linear_attention_causal(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match=r"expects q of shape \(b, h, t, k\), got \(2, 5, 4\)"):
        linear_attention_causal(q[0], k, v)
    state = (torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4))  # S with e = 4, v has e = 3
    with pytest.raises(
        ValueError, match=r"state S must be \(b, h, k, e\) = \(1, 2, 4, 3\), got \(1, 2, 4, 4\)"
    ):
        linear_attention_causal(q, k, v, state)


def test_linear_attention_causal_still_equals_the_recurrence():
    q, k, v = _qkv()
    s0 = (torch.rand(1, 2, 4, 3), torch.rand(1, 2, 4))
    y, (S, z) = linear_attention_causal(q, k, v, s0, chunk_size=2)
    y_ref, (S_ref, z_ref) = linear_attention_recurrent_ref(q, k, v, s0)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(S, S_ref)
    torch.testing.assert_close(z, z_ref)
    empty, (S0, z0) = linear_attention_causal(q[:, :, :0], k[:, :, :0], v[:, :, :0], s0)
    assert empty.shape == (1, 2, 0, 3) and S0 is s0[0] and z0 is s0[1]


@pytest.mark.parametrize("scan", [log_space_scan, log_space_scan_ref])
def test_log_space_scan_names_a_wrong_h0_or_length(scan):
    name = scan.__name__
    log_a, log_b, h0 = -torch.rand(2, 5, 3), torch.randn(2, 5, 3), torch.randn(2, 3)
    # before: "The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0"
    with pytest.raises(ValueError, match=rf"{name} expects h0 of shape \(b, e\) = \(2, 3\), got \(3, 3\)"):
        scan(log_a, log_b, torch.randn(3, 3))
    # before: "shape '[2, 1, 5, 3]' is invalid for input of size 24"
    with pytest.raises(
        ValueError, match=rf"{name} expects log_b of log_a's shape \(b, t, e\) = \(2, 5, 3\), got \(2, 4, 3\)"
    ):
        scan(log_a, log_b[:, :4], h0)
    with pytest.raises(ValueError, match=rf"{name}: chunk_size must be a positive integer, got 0"):
        scan(log_a, log_b, h0, chunk_size=0)
    torch.testing.assert_close(log_space_scan(log_a, log_b, h0, 2), log_space_scan_ref(log_a, log_b, h0))


# ---- direct kernel calls -----------------------------------------------------------------------------------------


def test_causal_conv_silu_blames_an_integer_x_not_the_bias():
    x = torch.ones(2, 5, 3, dtype=torch.long)
    # before: "causal_conv_silu: the bias must have x's dtype and device (torch.int64, cpu), got torch.float32"
    with pytest.raises(
        ValueError, match=r"causal_conv_silu: x must be a floating tensor .* got torch\.int64"
    ):
        causal_conv_silu(x, torch.zeros(2, 3, 3), torch.randn(4, 3), torch.randn(3))


def test_layer_norm_refuses_an_integer_x_and_a_nonpositive_eps():
    w, b = torch.ones(8), torch.zeros(8)
    # before: "mixed dtype (CPU): all inputs must share same datatype."
    with pytest.raises(ValueError, match=r"layer_norm: x must be a floating tensor .* got torch\.int64"):
        layer_norm(torch.ones(4, 8, dtype=torch.long), w, b, 1e-5)
    for eps in (-1.0, 0.0, float("nan")):  # before: -1.0 gave NaN silently
        with pytest.raises(ValueError, match=r"layer_norm: eps must be a positive finite number, got"):
            layer_norm(torch.ones(4, 8), w, b, eps)
    x = torch.randn(4, 8)
    torch.testing.assert_close(layer_norm(x, w, b, 1e-5), torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5))


@pytest.mark.parametrize("fn", [activations.gelu, activations.gelu_tanh])
def test_gelu_refuses_an_integer_x(fn):
    # before: NotImplementedError: "GeluKernelImpl" not implemented for 'Long'
    with pytest.raises(ValueError, match=rf"{fn.__name__}: x must be a floating tensor, got torch\.int64"):
        fn(torch.arange(4))


# ---- init_state(batch_size) -------------------------------------------------------------------------------------

MIXERS = {
    "LSTM": lambda: LSTM(4, 4),
    "GRU": lambda: GRU(4, 4),
    "RNN": lambda: RNN(4, 4),
    "MinGRU": lambda: MinGRU(8),
    "LinearAttention": lambda: LinearAttention(8, n_heads=2),
    "S4D": lambda: S4D(8, d_state=4),
    "Mamba": lambda: Mamba(8, d_state=4),
}


@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("batch_size", [-1, 1.5, True, "2"])
def test_init_state_refuses_a_batch_size_that_is_not_a_count(name, batch_size):
    # before: torch.zeros' "Dimension size must be non-negative" or "argument 'size' failed to unpack"
    with pytest.raises(ValueError, match=rf"^{name}\.init_state: batch_size must be an integer >= 0, got "):
        MIXERS[name]().init_state(batch_size)


@pytest.mark.parametrize("name", list(MIXERS))
def test_init_state_still_takes_zero_and_more(name):
    layer = MIXERS[name]()
    for b in (0, 3):
        state = layer.init_state(b)
        parts = state if isinstance(state, tuple) else (state,)
        assert all(p.shape[1 if name in ("LSTM", "GRU", "RNN") else 0] == b for p in parts)


def test_check_batch_size_words_it_as_lm_init_state():
    check_batch_size("Layer", 0)
    with pytest.raises(
        ValueError, match=r"^Layer\.init_state: batch_size must be an integer >= 0, got 1\.5$"
    ):
        check_batch_size("Layer", 1.5)
