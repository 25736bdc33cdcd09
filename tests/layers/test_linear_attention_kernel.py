"""seqlab.kernels.linear_attention (linear_attention.cpp): causal linear attention's recurrence in C++ against the
recurrence in torch ops (values, the returned state, gradients for q, k, v and a carried state, second
derivatives), on the layer's strided layout, with several threads; the layer's three paths; the input checks."""

import os
import shutil

import pytest
import torch

from seqlab.kernels.linear_attention import (
    EXTENSION,
    linear_attention_recurrent,
    linear_attention_recurrent_ref,
)
from seqlab.layers.linear_attention import LinearAttention

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")
F64 = torch.float64


def inputs(b=2, h=3, t=37, k=5, e=7, dtype=F64, seed=0, state=True):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s, pos=True: (  # noqa: E731  features are positive (elu + 1)
        (torch.rand(*s, generator=g, dtype=dtype) + 0.1) if pos else torch.randn(*s, generator=g, dtype=dtype)
    ).requires_grad_()
    q, kk, v = make(b, h, t, k), make(b, h, t, k), make(b, h, t, e, pos=False)
    return q, kk, v, ((make(b, h, k, e), make(b, h, k)) if state else None)


def loss_and_grads(out, wanted, weights, use=("y", "S", "z")):
    y, (S, z) = out
    parts = {"y": (y * weights[0]).sum(), "S": (S * weights[1]).sum(), "z": (z * weights[2]).sum()}
    return torch.autograd.grad(sum(parts[u] for u in use), wanted, allow_unused=True, materialize_grads=True)


@needs_compiler
@pytest.mark.parametrize(("dtype", "tol"), [(F64, 1e-12), (torch.float32, 3e-5)])
@pytest.mark.parametrize("state", [True, False])
@pytest.mark.parametrize("use", [("y", "S", "z"), ("y",), ("S",), ("y", "z")])
def test_values_state_and_gradients_match_the_recurrence(dtype, tol, state, use):
    q, k, v, s0 = inputs(dtype=dtype, state=state)
    out, ref = linear_attention_recurrent(q, k, v, s0), linear_attention_recurrent_ref(q, k, v, s0)
    assert "LinearAttention" in type(out[0].grad_fn).__name__  # the kernel ran
    for got, want in zip((out[0], *out[1]), (ref[0], *ref[1]), strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    wanted = [q, k, v, *(s0 or ())]
    weights = [torch.randn_like(x) for x in (ref[0], *ref[1])]
    for got, want in zip(
        loss_and_grads(out, wanted, weights, use), loss_and_grads(ref, wanted, weights, use), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * 10)


@needs_compiler
@pytest.mark.parametrize(("k", "e"), [(3, 2), (5, 7), (12, 12), (16, 9), (9, 16), (18, 18), (20, 3), (1, 1)])
def test_float32_heads_of_every_width_match_the_recurrence(k, e):
    """With AVX-512, float32 heads up to 16 wide keep their state in registers (one template per 4, 8, 12, 16
    rows), wider ones run the padded-memory loops: each against the recurrence, the state and every gradient."""
    q, kk, v, s0 = inputs(2, 3, 29, k, e, dtype=torch.float32)
    out, ref = linear_attention_recurrent(q, kk, v, s0), linear_attention_recurrent_ref(q, kk, v, s0)
    for got, want in zip((out[0], *out[1]), (ref[0], *ref[1]), strict=True):
        torch.testing.assert_close(got, want, rtol=3e-5, atol=3e-5)
    wanted = [q, kk, v, *s0]
    weights = [torch.randn_like(x) for x in (ref[0], *ref[1])]
    for got, want in zip(
        loss_and_grads(out, wanted, weights), loss_and_grads(ref, wanted, weights), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=3e-5, atol=3e-4)


@needs_compiler
def test_gradcheck_and_second_derivatives():
    q, k, v, s0 = inputs(1, 2, 6, 3, 4)
    f = lambda q, k, v, S, z: linear_attention_recurrent(q, k, v, (S, z))[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, *s0))
    assert torch.autograd.gradgradcheck(f, (q, k, v, *s0))  # create_graph: through the reference


@needs_compiler
def test_the_layers_strided_layout_is_read_in_place_and_y_comes_out_batch_major():
    """The layer's q, k, v are views of one (b, t, 3, h, k) projection: rows 3hk apart, read where they are;
    y is laid out (b, t, h, e), so the output projection's reshape is free."""
    torch.manual_seed(0)
    qkv = torch.rand(2, 11, 3, 4, 6, dtype=F64).permute(2, 0, 3, 1, 4)  # (3, b, h, t, k)
    q, k, v = qkv[0], qkv[1], qkv[2]
    y, _ = linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(y, linear_attention_recurrent_ref(q, k, v)[0], rtol=1e-12, atol=1e-12)
    assert y.transpose(1, 2).is_contiguous()


@needs_compiler
def test_threads_give_the_same_numbers():
    q, k, v, s0 = inputs(3, 4, 50, 8, 8)
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            y, (S, z) = linear_attention_recurrent(q, k, v, s0)
            results.append((y, S, z, *torch.autograd.grad(y.sum() + S.sum(), [q, k, v, *s0])))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


# ---- the layer's paths ---------------------------------------------------------------------------------------


def _layer_outputs(m, x, s0, mask, disable=None):
    before = os.environ.get("SEQLAB_DISABLE_KERNELS")
    if disable:
        os.environ["SEQLAB_DISABLE_KERNELS"] = disable
    try:
        y, (S, z) = m(x, s0, mask)
        grads = torch.autograd.grad((y.square().sum() + S.sum() + z.sum()), [x, *m.parameters()])
    finally:
        os.environ.pop("SEQLAB_DISABLE_KERNELS", None)
        if before is not None:
            os.environ["SEQLAB_DISABLE_KERNELS"] = before
    return [y, S, z, *grads]


@needs_compiler
@pytest.mark.parametrize("masked", [False, True])
def test_the_layer_kernel_chunked_form_and_reference_agree(masked, monkeypatch):
    torch.manual_seed(0)
    m = LinearAttention(16, 2, chunk_size=3).double()
    x = torch.randn(3, 10, 16, dtype=F64, requires_grad=True)
    s0 = tuple(s.detach() for s in m(torch.randn(3, 4, 16, dtype=F64))[1])
    mask = (torch.arange(10)[None, :] < torch.tensor([10, 6, 1])[:, None]) if masked else None
    calls = []
    real = linear_attention_recurrent
    monkeypatch.setattr(
        "seqlab.layers.linear_attention.linear_attention_recurrent",
        lambda *a, **k: calls.append(1) or real(*a, **k),
    )
    kernel = _layer_outputs(m, x, s0, mask)
    assert calls == [1]
    chunked = _layer_outputs(m, x, s0, mask, disable="linear_attention")
    assert calls == [1]  # switched off: the chunked form ran
    y_ref, (S_ref, z_ref) = m.forward_ref(x, s0, mask)
    for got, want in zip(kernel[:3], (y_ref, S_ref, z_ref), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for got, want in zip(kernel, chunked, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_torch_compile_traces_the_chunked_form():
    torch.manual_seed(0)
    m = LinearAttention(16, 2)
    x = torch.randn(2, 9, 16)
    seen = []
    compiled = torch.compile(m, backend=lambda gm, inputs: seen.append(gm) or gm.forward)
    torch.testing.assert_close(compiled(x)[0], m(x)[0], rtol=1e-5, atol=1e-6)
    assert len(seen) == 1  # one graph, no break at the kernel's pybind call


def test_bfloat16_and_empty_sequences_take_the_chunked_form():
    m = LinearAttention(16, 2)
    y, _ = m.to(torch.bfloat16)(torch.randn(2, 5, 16, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.shape == (2, 5, 16)


@needs_compiler
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda f: f.forward(*[torch.rand(1, 2, 3, 4)] * 2, torch.rand(1, 2, 4, 4), None, None, 1e-6),
            "v \\(b, h",
        ),
        (
            lambda f: f.forward(*[torch.ones(1, 2, 3, 4, dtype=torch.long)] * 3, None, None, 1e-6),
            "float32 or float64",
        ),
        (
            lambda f: f.forward(*[torch.rand(1, 2, 3, 4)] * 3, torch.rand(1, 2, 4, 4), None, 1e-6),
            "give both S and z",
        ),
        (
            lambda f: f.forward(
                *[torch.rand(1, 2, 3, 4)] * 3, torch.rand(1, 2, 4, 5), torch.rand(1, 2, 4), 1e-6
            ),
            "the state must be S \\(b, h, k, e\\)",
        ),
        (
            lambda f: f.forward(
                torch.rand(1, 2, 3, 4),
                torch.rand(1, 2, 3, 4).double(),
                torch.rand(1, 2, 3, 4),
                None,
                None,
                1e-6,
            ),
            "share one dtype",
        ),
    ],
)
def test_the_cpp_entry_checks_its_arguments_on_its_own(call, message):
    """The compiled functions refuse what they cannot read (an error, never a read out of bounds)."""
    with pytest.raises(RuntimeError, match=message):
        call(EXTENSION.load())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (torch.rand(1, 2, 3, 4), torch.rand(1, 2, 3, 4), torch.rand(1, 2, 4, 4)),
            r"v of shape \(b, h, t, e\) = \(1, 2, 3, e\)",
        ),
        (
            (torch.rand(1, 2, 3, 4), torch.rand(1, 2, 3, 3), torch.rand(1, 2, 3, 4)),
            r"k of q's shape .* got \(1, 2, 3, 3\)",
        ),
        ((torch.rand(2, 3, 4),) * 3, r"q of shape \(b, h, t, k\), got \(2, 3, 4\)"),
        (
            (torch.rand(1, 2, 3, 4), torch.rand(1, 2, 3, 4).double(), torch.rand(1, 2, 3, 4)),
            "k must have q's dtype",
        ),
        (
            (*(torch.rand(1, 2, 3, 4),) * 3, (torch.rand(1, 2, 4, 5), torch.rand(1, 2, 4))),
            r"state S must be \(b, h, k, e\) = \(1, 2, 4, 4\), got \(1, 2, 4, 5\)",
        ),
        (
            (*(torch.rand(1, 2, 3, 4),) * 3, (torch.rand(1, 2, 4, 4).double(), torch.rand(1, 2, 4))),
            "S must have q's",
        ),
    ],
)
def test_bad_inputs_say_what_was_expected(args, message):
    """At the Python boundary, before the C++ entry's own checks, with the expected and the given."""
    with pytest.raises(ValueError, match=message):
        linear_attention_recurrent(*args)
