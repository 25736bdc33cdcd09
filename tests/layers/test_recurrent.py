"""seqlab.layers.recurrent against torch.nn, the fast path against the reference loop, and the mixer laws.

Parity runs in float64 so that the tolerance (1e-10) is tight enough to catch a wrong gate or a bias in the
wrong place; both seqlab paths are compared with torch.nn on outputs, final states and every gradient
(input, initial state, each parameter by name).

Sizes: ``IN`` input features, ``H`` hidden size, ``T`` time steps.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqlab.layers import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell

IN, H, T = 3, 5, 6
F64 = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}
P = 2  # "lstm_proj": the LSTM with proj_size=P (LSTMP), h (and the output) P wide, c H wide
BASE_KINDS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]  # those with a cell
KINDS = [*BASE_KINDS, "lstm_proj"]
THEIRS = {"lstm": nn.LSTM, "lstm_proj": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}
OURS = {"lstm": LSTM, "lstm_proj": LSTM, "gru": GRU, "rnn_tanh": RNN, "rnn_relu": RNN}
CELLS = {
    "lstm": (nn.LSTMCell, LSTMCell),
    "gru": (nn.GRUCell, GRUCell),
    "rnn_tanh": (nn.RNNCell, RNNCell),
    "rnn_relu": (nn.RNNCell, RNNCell),
}
PROPERTY = settings(max_examples=15, deadline=None)


def extra_kwargs(kind: str) -> dict:
    if kind == "lstm_proj":
        return {"proj_size": P}
    return {"nonlinearity": kind.removeprefix("rnn_")} if kind.startswith("rnn") else {}


def out_size(kind: str) -> int:
    """The width of a step's output and of h."""
    return P if kind == "lstm_proj" else H


def make_pair(kind: str, *, fast_path: bool = True, **kw) -> tuple[nn.Module, nn.Module]:
    """A torch.nn layer with random weights and the seqlab layer holding the same weights (float64)."""
    kw = {"input_size": IN, "hidden_size": H, "batch_first": True, "dtype": F64, **extra_kwargs(kind), **kw}
    torch.manual_seed(0)
    theirs = THEIRS[kind](**kw)
    ours = OURS[kind](fast_path=fast_path, **kw)
    ours.load_state_dict(theirs.state_dict())  # strict: the names and shapes are torch.nn's
    return theirs, ours


def make_ours(kind: str, **kw) -> nn.Module:
    return make_pair(kind, **kw)[1]


def parts(state) -> list[Tensor]:
    return list(state) if isinstance(state, tuple | list) else [state]


def random_state(kind: str, n: int, b: int, gen: torch.Generator):
    h = torch.randn(n, b, out_size(kind), generator=gen, dtype=F64)
    return (h, torch.randn(n, b, H, generator=gen, dtype=F64)) if kind.startswith("lstm") else h


def unsorted_lengths(b: int, t: int, gen: torch.Generator) -> Tensor:
    """Lengths between 1 and t, not in descending order (what pack_padded_sequence would want) and, for
    b >= 3, not in ascending order either; a single sequence is shorter than t so that it has padding."""
    if b == 1:
        return torch.tensor([t - 2])
    lengths = torch.linspace(1, t, b).round().long()[torch.randperm(b, generator=gen)]
    monotonic = lambda v: bool((v.diff() >= 0).all() or (v.diff() <= 0).all())  # noqa: E731
    while monotonic(lengths) if b >= 3 else lengths[0] > lengths[1]:
        lengths = lengths.roll(1)
    return lengths


def map_state(state, fn):
    """Apply ``fn`` to each tensor of a state (None, h, or an (h, c) pair)."""
    if state is None:
        return None
    return tuple(fn(s) for s in state) if isinstance(state, tuple) else fn(state)


def torch_forward(module: nn.Module, x: Tensor, state, lengths: Tensor | None):
    """torch.nn's numbers for a padded batch: pack_padded_sequence, the module, pad_packed_sequence."""
    if lengths is None:
        return module(x, state)
    bf = module.batch_first
    packed = pack_padded_sequence(x, lengths, batch_first=bf, enforce_sorted=False)
    out, state = module(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=bf, total_length=x.size(1 if bf else 0))
    return out, state


def outputs_and_grads(fn, module: nn.Module, x: Tensor, state, seed: int = 1) -> dict[str, Tensor]:
    """Run ``fn(x, state)``, back-propagate a fixed random weighting of output and final state, and return
    the output, the final state parts and the gradients of x, the initial state parts and every parameter."""
    x = x.detach().clone().requires_grad_()
    state = map_state(state, lambda s: s.detach().clone().requires_grad_())
    out, final = fn(x, state)
    gen = torch.Generator().manual_seed(seed)
    loss = sum((t * torch.randn(t.shape, generator=gen, dtype=t.dtype)).sum() for t in [out, *parts(final)])
    names, params = zip(*module.named_parameters(), strict=True)
    inputs = [x, *([] if state is None else parts(state)), *params]
    grads = torch.autograd.grad(loss, inputs)
    result = {"out": out, **{f"final{i}": s for i, s in enumerate(parts(final))}, "grad_x": grads[0]}
    result |= {f"grad_state{i}": g for i, g in enumerate(grads[1 : len(inputs) - len(params)])}
    result |= {f"grad_{n}": g for n, g in zip(names, grads[len(inputs) - len(params) :], strict=True)}
    return result


def assert_same(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], **TOL, msg=lambda m, k=key: f"{k}: {m}")


# ---- parity with torch.nn -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("b", "with_lengths", "with_state"),
    [
        (1, False, False),
        (1, True, True),
        (4, False, False),
        (4, False, True),
        (4, True, False),
        (4, True, True),
    ],
)
def test_matches_torch_nn(kind, num_layers, bidirectional, bias, b, with_lengths, with_state):
    kw = {"num_layers": num_layers, "bidirectional": bidirectional, "bias": bias}
    theirs, ours = make_pair(kind, **kw)
    _, ours_ref = make_pair(kind, fast_path=False, **kw)
    gen = torch.Generator().manual_seed(num_layers * 100 + b)
    x = torch.randn(b, T, IN, generator=gen, dtype=F64)
    lengths = unsorted_lengths(b, T, gen) if with_lengths else None
    state = random_state(kind, num_layers * (1 + bidirectional), b, gen) if with_state else None

    want = outputs_and_grads(lambda x, s: torch_forward(theirs, x, s, lengths), theirs, x, state)
    fast = outputs_and_grads(lambda x, s: ours(x, s, lengths=lengths), ours, x, state)
    assert_same(fast, want)
    ref = outputs_and_grads(lambda x, s: ours_ref(x, s, lengths=lengths), ours_ref, x, state)
    assert_same(ref, want)
    if with_lengths:  # padded positions output exactly zero
        pad = torch.arange(T)[None, :] >= lengths[:, None]  # (b, t)
        assert pad.any() and (ref["out"][pad] == 0).all() and (fast["out"][pad] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_matches_torch_nn_time_major(kind, bidirectional, with_lengths):
    """batch_first=False: x is (t, b, input_size), as torch.nn's default."""
    theirs, ours = make_pair(kind, num_layers=2, bidirectional=bidirectional, batch_first=False)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(T, 3, IN, generator=gen, dtype=F64)
    lengths = unsorted_lengths(3, T, gen) if with_lengths else None
    state = random_state(kind, 2 * (1 + bidirectional), 3, gen)
    want = outputs_and_grads(lambda x, s: torch_forward(theirs, x, s, lengths), theirs, x, state)
    mask = None if lengths is None else torch.arange(T)[None, :] < lengths[:, None]  # (b, t), batch-first
    assert_same(outputs_and_grads(lambda x, s: ours(x, s, lengths=lengths), ours, x, state), want)
    assert_same(outputs_and_grads(lambda x, s: ours.forward_ref(x, s, mask), ours, x, state), want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["forward", "forward_ref"])
def test_unbatched_sequence_matches_torch_nn(kind, path):
    theirs, ours = make_pair(kind, num_layers=2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, IN, generator=gen, dtype=F64)
    state = map_state(random_state(kind, 2, 1, gen), lambda s: s[:, 0])  # (L * D, H): no batch dimension
    (y_theirs, s_theirs), (y_ours, s_ours) = theirs(x, state), getattr(ours, path)(x, state)
    assert y_ours.shape == (T, out_size(kind))
    torch.testing.assert_close(y_ours, y_theirs, **TOL)
    for a, b in zip(parts(s_ours), parts(s_theirs), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("kind", BASE_KINDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
def test_cells_match_torch_nn(kind, bias, with_state):
    theirs_cls, ours_cls = CELLS[kind]
    torch.manual_seed(0)
    theirs = theirs_cls(IN, H, bias=bias, dtype=F64, **extra_kwargs(kind))
    ours = ours_cls(IN, H, bias=bias, dtype=F64, **extra_kwargs(kind))
    ours.load_state_dict(theirs.state_dict())
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, IN, generator=gen, dtype=F64)
    state = None
    if with_state:
        h = torch.randn(4, H, generator=gen, dtype=F64)
        state = (h, torch.randn(4, H, generator=gen, dtype=F64)) if kind == "lstm" else h

    def as_pair(fn):  # a cell returns h or (h, c); outputs_and_grads wants (output, state)
        return lambda x, s: (lambda r: (parts(r)[0], r))(fn(x, s))

    assert_same(
        outputs_and_grads(as_pair(ours), ours, x, state), outputs_and_grads(as_pair(theirs), theirs, x, state)
    )
    unbatched = ours(x[0], map_state(state, lambda s: s[0]))  # (H_in,) with state (H,)
    for a, b in zip(parts(unbatched), parts(ours(x, state)), strict=True):
        torch.testing.assert_close(a, b[0], **TOL)


# ---- fast path against the reference loop -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_fast_and_ref_agree_in_float32(kind):
    """The two paths in the dtype people train in: same numbers up to float32 rounding."""
    ours = make_ours(kind, num_layers=2, bidirectional=True, dtype=torch.float32)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 9, IN, generator=gen)
    lengths = unsorted_lengths(4, 9, gen)
    fast = outputs_and_grads(lambda x, s: ours(x, s, lengths=lengths), ours, x, None)
    ref = outputs_and_grads(lambda x, s: ours.forward_ref(x, s, lengths=lengths), ours, x, None)
    assert fast.keys() == ref.keys()
    for key in fast:
        torch.testing.assert_close(
            ref[key], fast[key], atol=1e-5, rtol=1e-4, msg=lambda m, k=key: f"{k}: {m}"
        )


def _refuse(*args, **kwargs):
    raise AssertionError("this path must not run")


@pytest.mark.parametrize("kind", KINDS)
def test_forward_takes_the_path_that_why_not_fast_path_announces(kind, monkeypatch):
    ours = make_ours(kind)
    x = torch.randn(2, T, IN, dtype=F64)
    assert ours.why_not_fast_path(x) is None
    want, _ = ours.forward_ref(x)
    monkeypatch.setattr(ours, "_forward_ref", _refuse)  # the fast path needs no reference loop
    torch.testing.assert_close(ours(x)[0], want, **TOL)
    off = make_ours(kind, fast_path=False)
    assert "fast_path=False" in off.why_not_fast_path(x)
    monkeypatch.setattr(off, "_forward_fast", _refuse)  # ... and fast_path=False never calls the kernel
    torch.testing.assert_close(off(x)[0], want, **TOL)


class _Tagged(Tensor):
    """A tensor subclass: it carries __torch_function__, which the fused kernel does not honour."""


def test_tensor_subclass_takes_the_reference_path_and_says_why_once(caplog, monkeypatch):
    monkeypatch.setattr("seqlab.layers.fastpath._logged", set())
    ours = make_ours("lstm")
    x = torch.randn(2, T, IN, dtype=F64)
    tagged = x.as_subclass(_Tagged)
    assert "subclass" in ours.why_not_fast_path(tagged)
    monkeypatch.setattr(ours, "_forward_fast", _refuse)
    with caplog.at_level("INFO", logger="seqlab.layers.recurrent"):
        y, _ = ours(tagged)
        ours(tagged)
    assert caplog.text.count("subclass") == 1
    torch.testing.assert_close(y.as_subclass(Tensor), ours.forward_ref(x)[0], **TOL)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dropout_acts_only_in_training(kind):
    theirs, ours = make_pair(kind, num_layers=3, dropout=0.5)
    x = torch.randn(2, T, IN, dtype=F64)
    theirs.eval()
    ours.eval()
    for fn in (ours.forward, ours.forward_ref):
        torch.testing.assert_close(fn(x)[0], theirs(x)[0], **TOL)
    ours.train()
    for fn in (ours.forward, ours.forward_ref):
        first, second = fn(x)[0], fn(x)[0]
        assert not torch.allclose(first, second)  # a fresh dropout mask each call


# ---- the token-mixer laws (docs: DESIGN.md), as properties --------------------------------------------------

kinds = st.sampled_from(KINDS)
paths = st.sampled_from(["forward", "forward_ref"])


@PROPERTY
@given(
    kind=kinds,
    num_layers=st.integers(1, 2),
    b=st.integers(1, 3),
    t=st.integers(1, 7),
    batch_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_step_by_step_equals_forward(kind, num_layers, b, t, batch_first, seed):
    ours = make_ours(kind, num_layers=num_layers, batch_first=batch_first)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, IN, generator=gen, dtype=F64)
    state = random_state(kind, num_layers, b, gen)
    y, final = ours(x if batch_first else x.transpose(0, 1), state)
    y = y if batch_first else y.transpose(0, 1)
    s, ys = state, []
    for i in range(t):
        y_i, s = ours.step(x[:, i], s)
        ys.append(y_i)
    torch.testing.assert_close(torch.stack(ys, 1), y, **TOL)
    for a, c in zip(parts(s), parts(final), strict=True):
        torch.testing.assert_close(a, c, **TOL)


@PROPERTY
@given(
    kind=kinds,
    path=paths,
    num_layers=st.integers(1, 2),
    b=st.integers(1, 3),
    t=st.integers(2, 8),
    data=st.data(),
)
def test_chunked_with_carried_state_equals_whole(kind, path, num_layers, b, t, data):
    ours = make_ours(kind, num_layers=num_layers)
    split = data.draw(st.integers(1, t - 1), label="split")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    x = torch.randn(b, t, IN, generator=gen, dtype=F64)
    run = getattr(ours, path)
    whole, s_whole = run(x)
    first, s = run(x[:, :split])
    second, s = run(x[:, split:], s)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, **TOL)
    for a, c in zip(parts(s), parts(s_whole), strict=True):
        torch.testing.assert_close(a, c, **TOL)


@PROPERTY
@given(
    kind=kinds,
    path=paths,
    num_layers=st.integers(1, 2),
    bidirectional=st.booleans(),
    t=st.integers(2, 8),
    data=st.data(),
)
def test_causality(kind, path, num_layers, bidirectional, t, data):
    """Changing x[:, s:] leaves y[:, :s] unchanged, unless the layer also reads backwards."""
    ours = make_ours(kind, num_layers=num_layers, bidirectional=bidirectional)
    s = data.draw(st.integers(1, t - 1), label="s")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    x = torch.randn(2, t, IN, generator=gen, dtype=F64)
    x2 = x.clone()
    x2[:, s:] += 1.0 + torch.rand(2, t - s, IN, generator=gen, dtype=F64)
    run = getattr(ours, path)
    y, y2 = run(x)[0], run(x2)[0]
    if not bidirectional:
        torch.testing.assert_close(y[:, :s], y2[:, :s], **TOL)
        assert not torch.allclose(y[:, s:], y2[:, s:])
        return
    assert not torch.allclose(y[:, :s, H:], y2[:, :s, H:])  # the reverse direction has read the change
    if num_layers == 1:  # one layer: its forward half is still causal (deeper ones read the reverse half)
        torch.testing.assert_close(y[:, :s, :H], y2[:, :s, :H], **TOL)


@PROPERTY
@given(kind=kinds, path=paths, bidirectional=st.booleans(), b=st.integers(2, 4), data=st.data())
def test_batch_independence_and_padding_invariance(kind, path, bidirectional, b, data):
    """A sequence's outputs and final state depend on its own real positions only: not on the other sequences
    in the batch, and not on what fills its padding (NaN included, and no NaN leaks into gradients)."""
    ours = make_ours(kind, num_layers=2, bidirectional=bidirectional)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    lengths = torch.randint(1, T + 1, (b,), generator=gen)
    j = data.draw(st.integers(0, b - 1), label="j")
    x = torch.randn(b, T, IN, generator=gen, dtype=F64)
    pad = torch.arange(T)[None, :] >= lengths[:, None]  # (b, t)
    x[pad] = 0.0
    noisy = torch.randn(b, T, IN, generator=gen, dtype=F64)  # every other sequence replaced
    noisy[j] = x[j]
    noisy[pad] = float("nan")  # and garbage in all padding
    noisy.requires_grad_()
    run = getattr(ours, path)
    y, s = run(x, lengths=lengths)
    y2, s2 = run(noisy, lengths=lengths)
    torch.testing.assert_close(y2[j], y[j], **TOL)
    for a, c in zip(parts(s2), parts(s), strict=True):
        torch.testing.assert_close(a[:, j], c[:, j], **TOL)
    assert not y2.isnan().any()
    (y2.sum() + sum(p.sum() for p in parts(s2))).backward()
    assert torch.isfinite(noisy.grad).all() and (noisy.grad[pad] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("kind", KINDS)
def test_full_lengths_equal_no_lengths(kind):
    ours = make_ours(kind, bidirectional=True)
    x = torch.randn(3, T, IN, dtype=F64)
    full = torch.full((3,), T)
    for fn in (ours.forward, ours.forward_ref):
        (y, s), (y_len, s_len) = fn(x), fn(x, lengths=full)
        torch.testing.assert_close(y_len, y, **TOL)
        for a, c in zip(parts(s_len), parts(s), strict=True):
            torch.testing.assert_close(a, c, **TOL)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["forward", "forward_ref"])
def test_mask_equals_lengths(kind, path):
    """mask (b, t), True at real positions, is the token-mixer spelling of lengths; batch-first either way."""
    ours = make_ours(kind, num_layers=2, bidirectional=True, batch_first=False)
    gen = torch.Generator().manual_seed(2)
    lengths = unsorted_lengths(3, T, gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (b, t)
    x = torch.randn(T, 3, IN, generator=gen, dtype=F64)
    run = getattr(ours, path)
    (y, s), (y_len, s_len) = run(x, mask=mask), run(x, lengths=lengths)
    torch.testing.assert_close(y, y_len, **TOL)
    for a, c in zip(parts(s), parts(s_len), strict=True):
        torch.testing.assert_close(a, c, **TOL)
    unbatched = make_ours(kind)
    x1 = torch.randn(T, IN, generator=gen, dtype=F64)
    y1, _ = getattr(unbatched, path)(x1, mask=torch.arange(T) < 4)  # unbatched: a (t,) mask
    torch.testing.assert_close(y1[:4], getattr(unbatched, path)(x1[:4])[0], **TOL)


@pytest.mark.parametrize("method", ["forward", "forward_ref"])
def test_bad_masks(method):
    run = getattr(make_ours("lstm"), method)
    x = torch.randn(2, T, IN, dtype=F64)
    mask = torch.ones(2, T, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask or as lengths, not both"):
        run(x, mask=mask, lengths=torch.tensor([T, T]))
    with pytest.raises(ValueError, match=r"\(b, t\) = \(2, 6\).*got torch.bool of shape \(2, 5\)"):
        run(x, mask=mask[:, 1:])
    with pytest.raises(ValueError, match=r"got torch.int64"):
        run(x, mask=mask.long())
    left = mask.clone()
    left[1, :2] = False
    with pytest.raises(ValueError, match=r"right-padded.*row 1"):
        run(x, mask=left)
    empty = mask.clone()
    empty[0] = False
    with pytest.raises(ValueError, match="at least one real position"):
        run(x, mask=empty)


# ---- state, initialisation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_init_state_is_zeros_in_torch_layout(kind):
    ours = make_ours(kind, num_layers=2, bidirectional=True)
    state = ours.init_state(3)
    assert len(parts(state)) == (2 if kind.startswith("lstm") else 1)
    for s, width in zip(
        parts(state), (out_size(kind), H)[: len(parts(state))], strict=True
    ):  # h; an LSTM's c
        assert s.shape == (4, 3, width) and s.dtype == F64 and not s.any()
    if kind.startswith("lstm"):
        assert state[0].data_ptr() != state[1].data_ptr()  # h and c are separate tensors
    y_default, _ = ours(torch.ones(3, 2, IN, dtype=F64))
    torch.testing.assert_close(ours(torch.ones(3, 2, IN, dtype=F64), state)[0], y_default, **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_reset_parameters_uses_torch_nn_bound(kind):
    ours = OURS[kind](IN, 16, num_layers=2, **extra_kwargs(kind))
    bound = 16**-0.5
    for p in ours.parameters():
        assert p.abs().max() <= bound and p.std() > bound / 4  # U(-1/√H, 1/√H), not all zeros


# ---- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["forward", "forward_ref"])
def test_wrong_feature_size_names_expected_shape(method):
    ours = make_ours("lstm")
    with pytest.raises(ValueError, match=r"\(b, t, input_size\).*input_size=3.*\(2, 6, 4\)"):
        getattr(ours, method)(torch.randn(2, T, IN + 1, dtype=F64))
    with pytest.raises(ValueError, match="input_size=3"):
        getattr(ours, method)(torch.randn(2, 1, T, IN, dtype=F64))


@pytest.mark.parametrize("method", ["forward", "forward_ref"])
@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([T + 1, 2], "cannot exceed the sequence length t=6"),
        ([0, 2], "at least 1, got a length of 0"),
        ([3, -1], "at least 1, got a length of -1"),
        ([2.0, 3.0], r"integer tensor of shape \(b,\) = \(2,\)"),
        ([True, True], "integer tensor"),
        ([1, 2, 3], r"shape \(b,\) = \(2,\)"),
    ],
)
def test_bad_lengths(method, lengths, message):
    ours = make_ours("gru")
    with pytest.raises(ValueError, match=message):
        getattr(ours, method)(torch.randn(2, T, IN, dtype=F64), lengths=torch.tensor(lengths))


@pytest.mark.parametrize("kind", BASE_KINDS)
def test_wrong_state_shape_names_expected_shape(kind):
    ours = make_ours(kind, num_layers=2)
    x = torch.randn(3, T, IN, dtype=F64)
    bad = torch.zeros(1, 3, H, dtype=F64)
    with pytest.raises(ValueError, match=r"\(num_layers \* num_directions, b, hidden_size\) = \(2, 3, 5\)"):
        ours(x, (bad, bad) if kind == "lstm" else bad)
    if kind == "lstm":
        with pytest.raises(ValueError, match=r"tuple \(h, c\)"):
            ours(x, torch.zeros(2, 3, H, dtype=F64))
    with pytest.raises(ValueError, match="move the state"):
        good = torch.zeros(2, 3, H)  # float32 state for a float64 input
        ours(x, (good, good) if kind == "lstm" else good)


def test_zero_length_sequence_is_rejected():
    with pytest.raises(ValueError, match="at least one time step"):
        make_ours("rnn_tanh")(torch.randn(2, 0, IN, dtype=F64))


def test_step_errors():
    with pytest.raises(ValueError, match="unidirectional"):
        make_ours("lstm", bidirectional=True).step(torch.randn(2, IN, dtype=F64))
    with pytest.raises(ValueError, match=r"\(b, 3\)"):
        make_ours("gru").step(torch.randn(2, T, IN, dtype=F64))


@pytest.mark.parametrize("kind", BASE_KINDS)
def test_cell_errors_name_expected_shape(kind):
    cell = CELLS[kind][1](IN, H, dtype=F64, **extra_kwargs(kind))
    with pytest.raises(ValueError, match=r"\(b, 3\)"):
        cell(torch.randn(2, IN + 1, dtype=F64))
    bad = torch.zeros(3, H, dtype=F64)  # batch 3 for an input of batch 2
    with pytest.raises(ValueError, match=r"\(2, 5\)"):
        cell(torch.randn(2, IN, dtype=F64), (bad, bad) if kind == "lstm" else bad)


def test_constructor_errors():
    with pytest.raises(ValueError, match="nonlinearity"):
        RNN(IN, H, nonlinearity="gelu")
    with pytest.raises(ValueError, match="dropout"):
        LSTM(IN, H, dropout=1.5)
    with pytest.raises(ValueError, match="positive"):
        GRU(IN, 0)


def test_projected_lstm_states_and_arguments_are_checked_by_name():
    ours = make_ours("lstm_proj", num_layers=2)
    x = torch.randn(3, T, IN, dtype=F64)
    h, c = torch.zeros(2, 3, P, dtype=F64), torch.zeros(2, 3, H, dtype=F64)
    with pytest.raises(ValueError, match=r"state h .*\(2, 3, 2\)"):
        ours(x, (c, c))  # h as wide as c: the projection makes it P wide
    with pytest.raises(ValueError, match=r"state c .*\(2, 3, 5\)"):
        ours(x, (h, h))
    assert ours(x, (h, c))[0].shape == (3, T, P)
    for bad in (H, H + 1, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"proj_size must be an integer in \[0, hidden_size=5\)"):
            LSTM(IN, H, proj_size=bad)
    for other in (GRU, RNN):
        with pytest.raises(ValueError, match="proj_size is only supported for LSTM"):
            other(IN, H, proj_size=2)
    assert "proj_size=2" in repr(ours) and "weight_hr_l1" in dict(ours.named_parameters())
    assert ours.why_not_kernel(x.float()) is None  # seqlab's kernel runs the projection


def test_the_lstm_mixer_with_wider_cells_is_an_lstmp():
    """cell_size > d_model: H cells projected back to d_model (proj_size=d_model), the forget bias on H gates."""
    from seqlab.layers.mixer import create_mixer

    m = create_mixer("lstm", 8, cell_size=12)
    assert (m.hidden_size, m.proj_size) == (12, 8)
    assert torch.all(m.bias_ih_l0[12:24] == 1.0) and torch.all(m.bias_hh_l0[12:24] == 0.0)
    assert torch.all(m.bias_hh_l0[:12] != 0.0)  # the other gates keep torch.nn's init
    assert create_mixer("lstm", 8, cell_size=8).proj_size == 0  # as wide as d_model: the plain LSTM
    with pytest.raises(ValueError, match=r"cell_size=4 must be at least d_model=8"):
        create_mixer("lstm", 8, cell_size=4)
    with pytest.raises(ValueError, match=r"cell_size"):
        create_mixer("lstm", 8, cell_size=0)
