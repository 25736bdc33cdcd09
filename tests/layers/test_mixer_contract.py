"""The token-mixer contract (seqlab.layers.mixer), checked for every registered mixer.

Every test is parametrized over ``list_mixers()``, so a newly registered mixer is tested with no edit here,
and no law names a mixer. Each mixer is built by ``create_mixer(name, d_model)`` at its smallest width of at
least 8 (a multiple of its ``width_multiple``), in float64 and eval mode, and held to:

1. step: ``step`` position by position gives forward's outputs and final state;
2. chunks: a forward over x1 then over x2 with the carried state equals one forward over [x1; x2];
3. causality: changing x[:, s:] leaves y[:, :s] unchanged;
4. padding: with a right-padded ``mask`` and garbage (NaN or huge numbers) in the padding, the outputs at the
   real positions and the returned state equal those of each sequence run alone, from the same carried
   state; the padding gets no gradient and sends none anywhere.

States are compared part by part (tuples, NamedTuples and lists of tensors, complex ones included). Which
dimension of a part is the batch is read off ``init_state`` (the one that changes with the batch size); a
part with none (a position counter shared by the batch) is compared in the laws 1-2 but not per sequence.
In the padding law a part that grows with time (a KV cache) is compared at the real positions, the law as
stated for attention. Non-tensor parts (a cache's preallocated buffer) are storage, not state, and are
skipped. Sizes: lengths from 1 to 9, powers of two or not; Hypothesis keeps to ~10 examples per law.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from seqlab.layers.mixer import TokenMixer, create_mixer, list_mixers, make_mixer_config, mixer_spec

F64 = torch.float64
TOL = {"atol": 1e-9, "rtol": 1e-9}
LAW = settings(max_examples=10, deadline=None)
VARIANTS = {"lstm[cell_size=20]": ("lstm", {"cell_size": 20})}
"""Configurations other than a mixer's defaults whose state or layout differs (the LSTMP's cells, wider than the
h it carries): name -> (mixer, config fields)."""
MIXERS = [*list_mixers(), *VARIANTS]


def _mixer(name: str) -> tuple[str, dict]:
    return VARIANTS.get(name, (name, {}))


def width(name: str) -> int:
    """The smallest d_model >= 8 that the mixer's config accepts."""
    mixer, fields = _mixer(name)
    step = mixer_spec(mixer).width_multiple(make_mixer_config(mixer, fields))
    return step * math.ceil(8 / step)


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    mixer, fields = _mixer(name)
    return create_mixer(mixer, width(name), **fields).to(F64).eval()


@functools.cache
def shared(name: str):
    """One instance per mixer for the laws, which never change it."""
    return build(name)


def randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# ---- states -------------------------------------------------------------------------------------------------


def leaves(state) -> list:
    """The tensors of a state in order (None for non-tensor parts, which hold storage, not state)."""
    if isinstance(state, Tensor):
        return [state]
    if isinstance(state, tuple | list):
        return [leaf for part in state for leaf in leaves(part)]
    return [None]


def rebuild(state, parts: list):
    """``state`` with its tensors replaced, in order, by ``parts``; other parts become None."""
    it = iter(parts)

    def walk(s):
        if isinstance(s, Tensor):
            return next(it)
        if isinstance(s, tuple | list):
            items = [walk(p) for p in s]
            return type(s)(*items) if hasattr(s, "_fields") else type(s)(items)
        next(it)
        return None

    return walk(state)


@functools.cache
def batch_dims(name: str) -> tuple[int | None, ...]:
    """Per state tensor: the dimension that is the batch (where init_state(2) and init_state(3) differ)."""
    m = shared(name)
    dims = []
    for a, b in zip(leaves(m.init_state(2)), leaves(m.init_state(3)), strict=True):
        diff = (
            [] if a is None else [i for i, (p, q) in enumerate(zip(a.shape, b.shape, strict=True)) if p != q]
        )
        dims.append(diff[0] if diff else None)
    return tuple(dims)


def row(name: str, state, i: int):
    """Sequence i of a batched state, as a batch of one."""
    parts = [
        leaf if leaf is None or d is None else leaf.narrow(d, i, 1)
        for leaf, d in zip(leaves(state), batch_dims(name), strict=True)
    ]
    return rebuild(state, parts)


def assert_states_close(got, want, **tol) -> None:
    for a, b in zip(leaves(got), leaves(want), strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, **(tol or TOL))


def assert_row_close(name: str, got_row, alone, length: int) -> None:
    """The padding law for one sequence's state: a part that grew with time is compared at its first
    ``length`` positions (its real ones); parts without a batch dimension are not per sequence."""
    for a, b, d in zip(leaves(got_row), leaves(alone), batch_dims(name), strict=True):
        if a is None or d is None:
            continue
        grown = [i for i, (p, q) in enumerate(zip(a.shape, b.shape, strict=True)) if p != q]
        if grown:
            (g,) = grown  # the time dimension of a cache: t in the padded run, length alone
            a = a.narrow(g, 0, b.size(g))
        torch.testing.assert_close(a, b, **TOL)


# ---- the interface ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MIXERS)
def test_is_a_token_mixer_with_a_state_that_honours_device_and_dtype(name):
    m = build(name)
    assert isinstance(m, TokenMixer)
    for dtype in (torch.float32, F64):
        state = m.init_state(3, device="cpu", dtype=dtype)
        for leaf in leaves(state):
            if leaf is None:
                continue
            assert leaf.device.type == "cpu" and not leaf.requires_grad
            if leaf.is_floating_point() or leaf.is_complex():
                assert (leaf.real if leaf.is_complex() else leaf).dtype == dtype
    for leaf in leaves(m.init_state(2)):  # default: the parameters' dtype
        if leaf is not None and (leaf.is_floating_point() or leaf.is_complex()):
            assert (leaf.real if leaf.is_complex() else leaf).dtype == F64
    y, _ = m(randn(2, 3, width(name), seed=0), m.init_state(2))
    assert y.shape == (2, 3, width(name))


@pytest.mark.parametrize("name", MIXERS)
def test_every_parameter_gets_a_finite_gradient(name):
    m = build(name)
    x = randn(2, 5, width(name), seed=1)
    y, _ = m(x)
    loss = (y * randn(*y.shape, seed=2)).sum()
    loss.backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None, f"{name}: {pname} gets no gradient"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name}: {pname}"


@pytest.mark.parametrize("name", MIXERS)
def test_state_dict_round_trips_into_a_fresh_instance(name):
    m, fresh = build(name, seed=0), build(name, seed=1)
    x = randn(2, 4, width(name), seed=3)
    assert not torch.allclose(fresh(x)[0], m(x)[0])
    fresh.load_state_dict(m.state_dict())
    torch.testing.assert_close(fresh(x)[0], m(x)[0], atol=0, rtol=0)


# ---- the four laws ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MIXERS)
@LAW
@given(b=st.integers(1, 3), t=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_step_by_step_equals_forward(name, b, t, seed):
    m = shared(name)
    x = randn(b, t, width(name), seed=seed)
    with torch.no_grad():
        y, final = m(x)
        state, ys = m.init_state(b), []
        for i in range(t):
            y_i, state = m.step(x[:, i], state)
            ys.append(y_i)
    torch.testing.assert_close(torch.stack(ys, 1), y, **TOL)
    assert_states_close(state, final)


@pytest.mark.parametrize("name", MIXERS)
@LAW
@given(b=st.integers(1, 3), t=st.integers(2, 9), data=st.data())
def test_chunked_with_carried_state_equals_whole(name, b, t, data):
    m = shared(name)
    cut = data.draw(st.integers(1, t - 1), label="cut")
    x = randn(b, t, width(name), seed=data.draw(st.integers(0, 2**16), label="seed"))
    with torch.no_grad():
        y, final = m(x)
        first, state = m(x[:, :cut])
        second, state = m(x[:, cut:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), y, **TOL)
    assert_states_close(state, final)


@pytest.mark.parametrize("name", MIXERS)
@LAW
@given(b=st.integers(1, 3), t=st.integers(2, 9), data=st.data())
def test_causality(name, b, t, data):
    m = shared(name)
    s = data.draw(st.integers(1, t - 1), label="s")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    x = randn(b, t, width(name), seed=seed)
    x2 = x.clone()
    x2[:, s:] += 1.0 + randn(b, t - s, width(name), seed=seed + 1)
    with torch.no_grad():
        y, y2 = m(x)[0], m(x2)[0]
    torch.testing.assert_close(y[:, :s], y2[:, :s], atol=1e-12, rtol=0)
    assert not torch.allclose(y[:, s:], y2[:, s:])  # the change does reach the later positions


@pytest.mark.parametrize("name", MIXERS)
@LAW
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    extra=st.integers(0, 3),
    carried=st.booleans(),
    garbage=st.sampled_from(["nan", "huge"]),
    seed=st.integers(0, 2**16),
)
def test_padding(name, lengths, extra, carried, garbage, seed):
    """Real outputs and the state equal each sequence's alone; padding changes nothing, gets no gradient."""
    m = shared(name)
    b, t, d = len(lengths), max(lengths) + extra, width(name)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (b, t), True at real positions
    x = randn(b, t, d, seed=seed)
    x[~mask] = float("nan") if garbage == "nan" else 1e6 * randn(int((~mask).sum()), d, seed=seed + 1)
    x.requires_grad_()
    state = None
    if carried:
        with torch.no_grad():
            _, state = m(randn(b, 3, d, seed=seed + 2))
    y, final = m(x, state, mask=mask)
    for i, n in enumerate(lengths):
        with torch.no_grad():
            y_i, final_i = m(x[i : i + 1, :n].detach(), None if state is None else row(name, state, i))
        torch.testing.assert_close(y[i, :n], y_i[0], **TOL)
        assert_row_close(name, row(name, final, i), final_i, n)
    real = [
        leaf for leaf in leaves(final) if leaf is not None and (leaf.is_floating_point() or leaf.is_complex())
    ]
    loss = y[mask].sum() + sum(torch.view_as_real(p).sum() if p.is_complex() else p.sum() for p in real)
    loss.backward()
    assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    m.zero_grad(set_to_none=True)


# ---- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MIXERS)
def test_mask_errors_say_what_was_expected(name):
    m = shared(name)
    x = randn(2, 5, width(name), seed=0)
    good = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with pytest.raises(ValueError, match=r"\(b, t\) = \(2, 5\).*got torch.bool of shape \(2, 4\)"):
        m(x, mask=good[:, :4])
    with pytest.raises(ValueError, match=r"boolean.*got torch.float32 of shape \(2, 5\)"):
        m(x, mask=good.float())
    with pytest.raises(ValueError, match="right-padded"):
        m(x, mask=good.flip(1))
    torch.testing.assert_close(m(x, mask=torch.ones(2, 5, dtype=torch.bool))[0], m(x)[0], atol=0, rtol=0)
