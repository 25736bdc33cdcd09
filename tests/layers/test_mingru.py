"""minGRU: the log-space scan and the CPU kernel against the loop (outputs, states, every gradient), the four
mixer laws on each of the three paths, numerics over long sequences, the registry entry and the input checks.

The paths (``PATHS``): "kernel" is ``forward`` on the CPU (``seqlab.kernels.mingru_scan``), "scan" is ``forward``
with that kernel switched off (the log-space scan, what runs on other devices), "loop" is ``fast_path=False``.

Parity runs in float64 at 1e-10: tight enough to catch a gate read from the wrong half of ``in_proj``, a
state prefix counted twice or an off-by-one in the carried chunk state.

Sizes: ``D`` model width, ``T`` time steps.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import Tensor

import seqlab.layers.mingru as mingru_module
from seqlab.layers import MinGRU, create_mixer, list_mixers, mixer_spec
from seqlab.layers.mingru import MinGRUMixerConfig, log_space_scan, log_space_scan_ref

D, T = 4, 9
F64 = torch.float64
TOL = {"atol": 1e-10, "rtol": 1e-10}
PROPERTY = settings(max_examples=20, deadline=None)


PATHS = ("kernel", "scan", "loop")


@contextmanager
def on(path: str) -> Iterator[None]:
    """Run the block on ``path``: "scan" switches the kernel off (SEQLAB_DISABLE_KERNELS) for its duration."""
    before = os.environ.get("SEQLAB_DISABLE_KERNELS")
    if path == "scan":
        os.environ["SEQLAB_DISABLE_KERNELS"] = "mingru_scan"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SEQLAB_DISABLE_KERNELS", None)
        else:
            os.environ["SEQLAB_DISABLE_KERNELS"] = before


def make(expand: int = 2, chunk_size: int = 4, seed: int = 0, **kw) -> MinGRU:
    """A float64 minGRU with random weights; a small chunk so that short sequences cross chunk borders."""
    torch.manual_seed(seed)
    m = MinGRU(D, expand=expand, chunk_size=chunk_size, dtype=F64, **kw)
    with torch.no_grad():  # gate biases spread over [-3, 3]: some gates nearly shut, some nearly open
        m.in_proj.bias.uniform_(-3.0, 3.0)
    return m


def randn(*shape: int, seed: int = 0, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale


def right_padded(lengths: list[int], t: int) -> Tensor:
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (b, t)


def grads(out: tuple[Tensor, Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """Gradients of a random-weighted sum of outputs and final state (weights fixed by the shapes)."""
    y, h = out
    loss = (y * randn(*y.shape, seed=1)).sum() + (h * randn(*h.shape, seed=2)).sum()
    return list(torch.autograd.grad(loss, inputs, allow_unused=True))


# ---- the log-space scan against the loop ---------------------------------------------------------------


@PROPERTY
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 40),
    e=st.integers(1, 4),
    chunk=st.sampled_from([1, 3, 8, 64]),
    h0_kind=st.sampled_from(["zero", "positive", "any sign"]),
    seed=st.integers(0, 2**16),
)
@example(b=1, t=21, e=1, chunk=64, h0_kind="zero", seed=2122)  # gradients of 6e4: rounding past 1e-9
def test_scan_function_equals_loop_for_any_length_chunk_and_state(b, t, e, chunk, h0_kind, seed):
    log_a = -torch.nn.functional.softplus(randn(b, t, e, seed=seed, scale=3.0)).requires_grad_()
    log_b = randn(b, t, e, seed=seed + 1, scale=3.0).requires_grad_()
    h0 = {"zero": torch.zeros(b, e, dtype=F64), "positive": randn(b, e, seed=seed + 2).exp()}.get(
        h0_kind, randn(b, e, seed=seed + 2)
    )
    h0.requires_grad_()
    h = log_space_scan(log_a, log_b, h0, chunk_size=chunk)
    h_ref = log_space_scan_ref(log_a, log_b, h0)
    torch.testing.assert_close(h, h_ref, **TOL)
    w = randn(b, t, e, seed=seed + 3)
    for g, g_ref in zip(
        torch.autograd.grad((h * w).sum(), [log_a, log_b, h0]),
        torch.autograd.grad((h_ref * w).sum(), [log_a, log_b, h0]),
        strict=True,
    ):
        # the backward sums products of exponentials (log_b scale 3): float64 rounding reached 3.3e-10 on a
        # few draws, and 1.1e-9 where the gradients reach 6e4 (b=1, t=21, e=1, chunk=64, seed=2122: 2e-14 of
        # that scale), so the gradients get 1e-9 plus 1e-13 of their largest magnitude
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9 + 1e-13 * g_ref.abs().max().item())


@PROPERTY
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 20),
    expand=st.integers(1, 3),
    chunk=st.sampled_from([1, 3, 8, 64]),
    with_state=st.booleans(),
    with_mask=st.booleans(),
    seed=st.integers(0, 2**16),
    path=st.sampled_from(["kernel", "scan"]),
)
def test_forward_equals_forward_ref_outputs_state_and_every_gradient(
    b, t, expand, chunk, with_state, with_mask, seed, path
):
    m = make(expand, chunk, seed)
    x = randn(b, t, D, seed=seed, scale=2.0).requires_grad_()
    h0 = randn(b, m.d_inner, seed=seed + 1).requires_grad_() if with_state else None
    lengths = torch.randint(1, t + 1, (b,), generator=torch.Generator().manual_seed(seed)).tolist()
    mask = right_padded(lengths, t) if with_mask else None
    inputs = [x, *([h0] if with_state else []), *m.parameters()]
    with on(path):
        fast, ref = m(x, h0, mask), m.forward_ref(x, h0, mask)
        g_fast, g_ref = grads(fast, inputs), grads(ref, inputs)
    torch.testing.assert_close(fast[0], ref[0], **TOL)
    torch.testing.assert_close(fast[1], ref[1], **TOL)
    for g, g_r in zip(g_fast, g_ref, strict=True):
        torch.testing.assert_close(g, g_r, **TOL)


def test_each_path_runs_where_it_should(monkeypatch):
    m = make()
    assert m.why_not_fast_path() is None and m.why_not_fast_path(randn(2, T, D)) is None
    calls = []
    for name in ("log_space_scan", "mingru_scan"):
        real = getattr(mingru_module, name)
        monkeypatch.setattr(
            mingru_module, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k)
        )
    m(randn(2, T, D))
    assert calls == ["mingru_scan"]  # the CPU: the kernel
    with on("scan"):
        m(randn(2, T, D))
    assert calls == ["mingru_scan", "log_space_scan"]  # the kernel off (or another device): the scan
    m.fast_path = False
    assert "fast_path=False" in m.why_not_fast_path()
    m(randn(2, T, D))
    assert calls == ["mingru_scan", "log_space_scan"]  # fast_path=False: the loop


# ---- the four laws ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("expand", [1, 2])
def test_step_by_step_equals_forward(path, expand):
    m = make(expand, fast_path=path != "loop")
    x = randn(3, T, D, scale=2.0)
    with on(path):
        y, h = m(x)
    state = m.init_state(3)
    steps = []
    for i in range(T):
        y_t, state = m.step(x[:, i], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps, 1), y, **TOL)
    torch.testing.assert_close(state, h, **TOL)


@PROPERTY
@given(t=st.integers(2, 30), data=st.data(), chunk=st.sampled_from([1, 4, 64]), path=st.sampled_from(PATHS))
def test_chunks_with_carried_state_equal_whole(t, data, chunk, path):
    cut = data.draw(st.integers(1, t - 1))
    m = make(chunk_size=chunk, fast_path=path != "loop")
    x = randn(2, t, D, seed=t, scale=2.0)
    with on(path):
        y, h = m(x)
        y1, h1 = m(x[:, :cut])
        y2, h2 = m(x[:, cut:], h1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(h2, h, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("path", PATHS)
def test_causal(path):
    m = make(fast_path=path != "loop")
    x = randn(2, T, D)
    with on(path):
        y, _ = m(x)
        for s in range(T):
            x2 = x.clone()
            x2[:, s:] = randn(2, T - s, D, seed=s + 10)
            torch.testing.assert_close(m(x2)[0][:, :s], y[:, :s], atol=0.0, rtol=0.0)


@PROPERTY
@given(lengths=st.lists(st.integers(1, T), min_size=2, max_size=4), path=st.sampled_from(PATHS))
def test_padding_equals_each_sequence_alone(lengths, path):
    b = len(lengths)
    m = make(fast_path=path != "loop")
    x = randn(b, T, D)
    mask = right_padded(lengths, T)
    h0 = randn(b, m.d_inner, seed=3)
    with on(path):
        y, h = m(x.masked_fill(~mask[..., None], float("nan")), h0, mask)  # padding is never read
        alone = [m(x[j : j + 1, :n], h0[j : j + 1]) for j, n in enumerate(lengths)]
    for j, (n, (y_j, h_j)) in enumerate(zip(lengths, alone, strict=True)):
        torch.testing.assert_close(y[j : j + 1, :n], y_j, **TOL)
        torch.testing.assert_close(h[j : j + 1], h_j, **TOL)
    assert (y[~mask] == 0).all()  # padded positions output zero


@pytest.mark.parametrize("path", PATHS)
def test_padding_leaves_gradients_untouched_and_a_fully_padded_row_keeps_its_state(path):
    m = make(fast_path=path != "loop")
    mask = right_padded([T, 3, 0], T)  # the last row: a chunk after its sequence ended
    x = randn(3, T, D).masked_fill(~mask[..., None], float("nan")).requires_grad_()
    h0 = randn(3, m.d_inner, seed=4).requires_grad_()
    with on(path):
        y, h = m(x, h0, mask)
        g_x, g_h0, *g_params = grads((y, h), [x, h0, *m.parameters()])
    torch.testing.assert_close(h[2], h0[2], atol=0.0, rtol=0.0)
    assert (g_x[~mask] == 0).all() and torch.isfinite(g_x).all()
    assert all(torch.isfinite(g).all() for g in [g_h0, *g_params])


# ---- numerics ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["kernel", "scan"])
@pytest.mark.parametrize("scale", [1.0, 30.0, 1000.0])
def test_long_sequences_with_large_inputs_stay_finite_positive_and_accurate_in_float32(scale, path):
    """t = 2000 with inputs up to 1000x the usual: saturated gates, A_t down to about -10⁵ per channel."""
    torch.manual_seed(0)
    m = MinGRU(8, expand=1)  # no down projection: the outputs are h itself, positive in theory
    m64 = MinGRU(8, expand=1, dtype=F64)
    m64.load_state_dict(m.state_dict())
    x = (torch.randn(2, 2000, 8) * scale).requires_grad_()
    with on(path):
        y, h = m(x)
        y.sum().backward()
    y64, _ = m64.forward_ref(x.detach().double())
    assert torch.isfinite(y).all() and (y >= 0).all() and (h >= 0).all()
    representable = y64 > 1e-30  # float32 flushes smaller values (e^-100 candidates) to zero
    rel = ((y.double() - y64).abs() / y64)[representable].max()
    assert rel < 1e-2, f"float32 scan off by {rel:.2e} relative against the float64 loop"
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("path", ["kernel", "scan"])
def test_half_precision_runs_the_scan_in_float32(path):
    torch.manual_seed(0)
    m = MinGRU(8)
    x = torch.randn(2, 300, 8)
    with on(path):
        y, h = m(x)
        y16, h16 = m.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert y16.dtype == h16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), y, atol=0.05, rtol=0.05)
    torch.testing.assert_close(h16.float(), h, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("path", PATHS)
def test_every_parameter_gets_a_finite_gradient(path):
    m = make(fast_path=path != "loop")
    with on(path):
        y, h = m(randn(2, T, D))
        (y.square().sum() + h.sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


# ---- the registry ----------------------------------------------------------------------------------------


def test_registered_as_an_rnn_mixer():
    assert "mingru" in list_mixers("RNN")
    spec = mixer_spec("mingru")
    assert spec.config is MinGRUMixerConfig and spec.family == "RNN" and spec.channel_mlp
    m = create_mixer("mingru", 32)
    assert isinstance(m, MinGRU) and m.d_inner == 64 and m.out_proj is not None
    y, h = m(torch.randn(2, 5, 32))
    assert y.shape == (2, 5, 32) and h.shape == (2, 64)
    narrow = create_mixer("mingru", 32, expand=1, dtype=F64)
    assert narrow.out_proj is None and narrow.in_proj.weight.dtype == F64
    with pytest.raises(ValueError, match="expand must be a positive integer"):
        create_mixer("mingru", 32, expand=0)
    with pytest.raises(ValueError, match="unknown field"):
        create_mixer("mingru", 32, d_state=4)


def test_init_state():
    m = MinGRU(D, expand=3)
    h = m.init_state(5)
    assert h.shape == (5, 3 * D) and (h == 0).all() and h.dtype == torch.float32
    assert m.init_state(2, dtype=F64).dtype == F64


# ---- input checks ----------------------------------------------------------------------------------------


BAD_FORWARD = {
    "x not (b, t, d)": ({"x": torch.randn(T, D)}, r"x of shape \(b, t, 4\)"),
    "x of the wrong width": ({"x": torch.randn(2, T, D + 1)}, r"x of shape \(b, t, 4\)"),
    "no time steps": ({"x": torch.randn(2, 0, D)}, "t >= 1"),
    "state of the wrong shape": ({"state": torch.zeros(2, D)}, r"\(b, expand \* d_model\) = \(2, 8\)"),
    "state as a tuple": ({"state": (torch.zeros(2, 2 * D),)}, "state h must have shape.*got tuple"),
    "state of another dtype": (
        {"state": torch.zeros(2, 2 * D, dtype=F64)},
        r"float64 on cpu, expected torch\.float32.*move the state",
    ),
    "mask not boolean": ({"mask": torch.ones(2, T)}, "mask must be a boolean tensor"),
    "mask of the wrong shape": ({"mask": torch.ones(2, T + 1, dtype=torch.bool)}, r"\(b, t\) = \(2, 9\)"),
    "mask padded on the left": ({"mask": right_padded([T, 6], T).flip(1)}, "right-padded"),
}


@pytest.mark.parametrize("case", list(BAD_FORWARD))
@pytest.mark.parametrize("method", ["forward", "forward_ref"])
def test_bad_inputs_say_what_was_expected(case, method):
    m = MinGRU(D)
    args, message = BAD_FORWARD[case]
    kw = {"x": torch.randn(2, T, D), "state": None, "mask": None, **args}
    with pytest.raises(ValueError, match=message):
        getattr(m, method)(kw["x"], kw["state"], kw["mask"])


def test_bad_step_and_constructor_arguments():
    m = MinGRU(D)
    with pytest.raises(ValueError, match=r"x_t of shape \(b, 4\)"):
        m.step(torch.randn(2, 1, D), m.init_state(2))
    with pytest.raises(ValueError, match=r"\(b, expand \* d_model\) = \(2, 8\)"):
        m.step(torch.randn(2, D), torch.zeros(3, 2 * D))
    for bad in ({"expand": 0}, {"d_model": 0}, {"chunk_size": 0}, {"expand": 1.5}):
        with pytest.raises(ValueError, match="must be a positive integer"):
            MinGRU(**{"d_model": D, **bad})


def test_without_bias():
    torch.manual_seed(0)
    m = MinGRU(D, bias=False, chunk_size=4, dtype=F64)
    assert m.in_proj.bias is None
    x = randn(2, T, D)
    for a, b in zip(m(x), m.forward_ref(x), strict=True):
        torch.testing.assert_close(a, b, **TOL)
