"""Fuzzing the public entry points: every input either works (finite outputs of the right shape) or is refused
with seqlab's own ValueError/TypeError, never an error from inside torch and never a silent result.

The oracle for "valid" is written out per entry point (``_config_ok``, ``_call_ok``, ``_lm_ok``) from the
documented contracts, independently of the code under test; an input the oracle calls valid must run, one it
calls invalid must be refused by a check in a seqlab file (the innermost frame of the traceback).
"""

from __future__ import annotations

import math
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqlab
from seqlab import models
from seqlab.layers import create_mixer, list_mixers

SRC = Path(seqlab.__file__).resolve().parent
MIXERS = list_mixers()
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _refused(fn) -> None:
    """fn() raises ValueError/TypeError from a seqlab file (not from inside torch)."""
    with pytest.raises((ValueError, TypeError)) as info:
        fn()
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert Path(frame.filename).resolve().is_relative_to(SRC), (
        f"{type(info.value).__name__} raised in {frame.filename}:{frame.lineno}, not by seqlab: {info.value}"
    )


def _finite(*ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


# ---- create_mixer: drawn config fields --------------------------------------------------------------------

ANY = st.one_of(st.integers(-3, 10), st.none(), st.sampled_from([2.5, float("nan"), True, "4"]))
FIELDS = {
    "attention": ["n_heads", "n_kv_heads", "head_dim", "window", "rope_base"],
    "linear-attention": ["n_heads", "head_dim"],
    "s4d": ["d_state"],
    "mamba": ["d_state", "d_conv", "expand", "dt_rank"],
    "mingru": ["expand"],
    "lstm": ["forget_bias", "cell_size"],
    "rnn": ["nonlinearity"],
    "gru": [],
    "mamba2": ["d_state", "d_conv", "expand", "headdim", "n_groups"],
}


def _pos(v, none_ok=False) -> bool:
    return (v is None and none_ok) or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)


def _config_ok(name: str, d: int, f: dict) -> bool:
    """The documented rules, written independently of the validators."""
    if not _pos(d):
        return False
    g = {k: f.get(k, default) for k, default in _DEFAULTS[name].items()}
    if name == "attention":
        if not (_pos(g["n_heads"]) and all(_pos(g[k], True) for k in ("n_kv_heads", "head_dim", "window"))):
            return False
        base = g["rope_base"]
        if (
            isinstance(base, bool)
            or not isinstance(base, int | float)
            or not (math.isfinite(base) and base > 0)
        ):
            return False
        if g["n_kv_heads"] is not None and g["n_heads"] % g["n_kv_heads"]:
            return False
        if g["head_dim"] is None and d % g["n_heads"]:
            return False
        return (g["head_dim"] or d // g["n_heads"]) % 2 == 0  # RoPE rotates pairs
    if name == "linear-attention":
        ok = _pos(g["n_heads"]) and _pos(g["head_dim"], True)
        return ok and (g["head_dim"] is not None or d % g["n_heads"] == 0)
    if name == "s4d":
        return _pos(g["d_state"]) and g["d_state"] % 2 == 0
    if name == "mamba":
        return all(_pos(g[k]) for k in ("d_state", "d_conv", "expand")) and _pos(g["dt_rank"], True)
    if name == "mingru":
        return _pos(g["expand"])
    if name == "mamba2":  # d_inner = expand * d in heads of headdim, the heads in n_groups groups
        keys = ("d_state", "d_conv", "expand", "headdim", "n_groups")
        if not all(_pos(g[k]) for k in keys):
            return False
        inner = g["expand"] * d
        return inner % g["headdim"] == 0 and (inner // g["headdim"]) % g["n_groups"] == 0
    if name == "lstm":
        v, cells = g["forget_bias"], g["cell_size"]
        bias_ok = v is None or (not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v))
        return bias_ok and (cells is None or (_pos(cells) and cells >= d))  # LSTMP: wider cells, projected
    if name == "rnn":
        return g["nonlinearity"] in ("tanh", "relu")
    return True


_DEFAULTS = {
    "attention": {"n_heads": 4, "n_kv_heads": None, "head_dim": None, "window": None, "rope_base": 1e4},
    "linear-attention": {"n_heads": 4, "head_dim": None},
    "s4d": {"d_state": 16},
    "mamba": {"d_state": 16, "d_conv": 4, "expand": 2, "dt_rank": None},
    "mingru": {"expand": 2},
    "lstm": {"forget_bias": 1.0, "cell_size": None},
    "rnn": {"nonlinearity": "tanh"},
    "gru": {},
    "mamba2": {"d_state": 64, "d_conv": 4, "expand": 2, "headdim": 8, "n_groups": 1},
}


@st.composite
def mixer_configs(draw):
    name = draw(st.sampled_from(MIXERS))
    d = draw(st.one_of(st.integers(-1, 12), st.just(8)))
    fields = {}
    for k in FIELDS[name]:
        if draw(st.booleans()):
            pool = st.sampled_from(["tanh", "relu", "gelu", 3]) if k == "nonlinearity" else ANY
            fields[k] = draw(pool)
    return name, d, fields


def _check_config(case) -> None:
    name, d, fields = case
    if not _config_ok(name, d, fields):
        _refused(lambda: create_mixer(name, d, **fields))
        return
    m = create_mixer(name, d, **fields)
    y, _ = m(torch.randn(2, 3, d))
    assert y.shape == (2, 3, d) and _finite(y)


@FAST
@given(mixer_configs())
def test_create_mixer_with_drawn_fields(case):
    _check_config(case)


@pytest.mark.slow
@SLOW
@given(mixer_configs())
def test_create_mixer_with_drawn_fields_long(case):
    _check_config(case)


# ---- forward / step: drawn shapes, dtypes, masks and states ------------------------------------------------

D = 8
_LAYERS = {n: create_mixer(n, D, **({"d_state": 4} if n in ("s4d", "mamba") else {})) for n in MIXERS}
_OTHER = {n: create_mixer(n, 2 * D) for n in MIXERS}  # another layer: its states have other shapes


@st.composite
def calls(draw):
    name = draw(st.sampled_from(MIXERS))
    b, t = draw(st.integers(1, 3)), draw(st.integers(0, 4))
    width = draw(st.sampled_from([D, D, D, D + 1]))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64]))
    mask = draw(st.sampled_from(["none", "none", "right", "left", "shape", "list", "float", "rank3"]))
    state = draw(st.sampled_from(["none", "own", "own", "batch+1", "other", "float64"]))
    lengths = draw(st.lists(st.integers(1, max(t, 1)), min_size=b, max_size=b))
    return name, b, t, width, dtype, mask, state, lengths


def _make_mask(kind, b, t, lengths):
    right = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (b, t), True at real positions
    return {
        "none": None,
        "right": right,
        "left": right.flip(1) if t > 1 and not right.all() else torch.ones(b + 1, t, dtype=torch.bool),
        "shape": torch.ones(b, t + 1, dtype=torch.bool),
        "list": right.tolist(),
        "float": right.float(),
        "rank3": right[None],
    }[kind]


def _make_state(kind, name, b):
    own = _LAYERS[name]
    return {
        "none": None,
        "own": own.init_state(b),
        "batch+1": own.init_state(b + 1),
        "other": _OTHER[name].init_state(b),
        "float64": own.init_state(b, dtype=torch.float64),
    }[kind]


def _call_ok(width, dtype, t, mask, state) -> bool:
    return (
        width == D
        and dtype == torch.float32
        and t >= 1
        and mask in ("none", "right")
        and state in ("none", "own")
    )


def _check_call(case) -> None:
    name, b, t, width, dtype, mask_kind, state_kind, lengths = case
    m = _LAYERS[name]
    x = torch.randn(b, t, width, dtype=dtype)
    mask, state = _make_mask(mask_kind, b, t, lengths), _make_state(state_kind, name, b)
    if not _call_ok(width, dtype, t, mask_kind, state_kind):
        _refused(lambda: m(x, state, mask))
        if mask_kind == "none" and t >= 1:
            _refused(lambda: m.step(x[:, 0], state if state is not None else m.init_state(b)))
        return
    with torch.no_grad():
        y, new = m(x, state, mask)
        assert y.shape == (b, t, D) and _finite(y)
        if mask is None:  # the state after a padded batch is not meant to be continued (KVCache's docstring)
            y_t, _ = m.step(torch.randn(b, D), new)
            assert y_t.shape == (b, D) and _finite(y_t)


@FAST
@given(calls())
def test_forward_and_step_with_drawn_inputs(case):
    _check_call(case)


@pytest.mark.slow
@SLOW
@given(calls())
def test_forward_and_step_with_drawn_inputs_long(case):
    _check_call(case)


# ---- models.create + forward + generate --------------------------------------------------------------------

PRESETS = ["test-lm-gru", "test-lm-attention", "test-s4d", "test-mamba"]
_MODELS = {p: models.create(p).eval() for p in PRESETS}


@st.composite
def lm_calls(draw):
    preset = draw(st.sampled_from(PRESETS))
    b, t = draw(st.integers(1, 2)), draw(st.integers(0, 4))
    lo, hi = draw(st.sampled_from([(0, 1), (0, 1), (0, 1), (-1, 0), (0, 2)]))  # fractions of the vocabulary
    dtype = draw(st.sampled_from([torch.long, torch.long, torch.long, torch.float32, torch.int32]))
    temperature = draw(st.sampled_from([0.0, 1.0, 0.7, -1.0, float("nan")]))
    top_k = draw(st.sampled_from([None, None, 1, 5, 0, -2]))
    top_p = draw(st.sampled_from([None, None, 0.9, 1.0, 0.0, 1.5]))
    n_new = draw(st.sampled_from([0, 1, 3, -1]))
    return preset, b, t, lo, hi, dtype, temperature, top_k, top_p, n_new


def _check_lm(case) -> None:
    preset, b, t, lo, hi, dtype, temperature, top_k, top_p, n_new = case
    model = _MODELS[preset]
    v = model.config.vocab_size
    ids = torch.randint(lo * v, max(hi * v, lo * v + 1), (b, t)).to(dtype)  # hi=2 reaches past the vocabulary
    ids_ok = dtype != torch.float32 and t >= 1 and int(ids.min()) >= 0 and int(ids.max()) < v  # any integers
    sampling_ok = temperature >= 0 and top_k in (None, 1, 5) and top_p in (None, 0.9, 1.0) and n_new >= 0
    sampling_ok = sampling_ok and dtype == torch.long  # generate's prompt: long ids
    if not ids_ok:
        _refused(lambda: model(ids))
        return
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == (b, t, v) and _finite(logits)
    gen = lambda: model.generate(ids, n_new, temperature=temperature, top_k=top_k, top_p=top_p)  # noqa: E731
    if not sampling_ok:
        _refused(gen)
        return
    out = gen()
    assert out.shape == (b, t + n_new) and bool(((out >= 0) & (out < v)).all())


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lm_calls())
def test_models_forward_and_generate_with_drawn_ids(case):
    _check_lm(case)


@pytest.mark.slow
@SLOW
@given(lm_calls())
def test_models_forward_and_generate_with_drawn_ids_long(case):
    _check_lm(case)


# ---- encoder–decoders: drawn sources, masks and targets ------------------------------------------------------

ENCDEC = {
    "none": models.create("test-seq2seq", attention="none"),
    "bahdanau": models.create("test-seq2seq"),
    "luong": models.create("test-seq2seq-luong"),
    "mamba-encoder": models.create("test-seq2seq", encoder="mamba", n_encoder_layers=2),
    "transformer": models.create("test-transformer"),
}


@st.composite
def encdec_calls(draw):
    name = draw(st.sampled_from(sorted(ENCDEC)))
    b, s, t = draw(st.integers(1, 3)), draw(st.integers(0, 9)), draw(st.integers(0, 6))
    lo, hi = draw(st.sampled_from([(3, 64), (3, 64), (-2, 64), (3, 70)]))
    lengths = [draw(st.integers(0, s)) for _ in range(b)]
    left_pad = draw(st.booleans()) and s >= 2
    beam = draw(st.sampled_from([1, 2, 3, 0]))
    return name, b, s, t, lo, hi, lengths, left_pad, beam


def _check_encdec(case) -> None:
    name, b, s, t, lo, hi, lengths, left_pad, beam = case
    model = ENCDEC[name].eval()
    g = torch.Generator().manual_seed(b * 100 + s * 10 + t)
    src = torch.randint(lo, hi, (b, s), generator=g)
    tgt = torch.randint(3, 64, (b, max(t, 1)), generator=g)
    mask = torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]  # right-padded
    if left_pad:
        mask = mask.flip(1)
    ids_ok = s >= 1 and int(src.min()) >= 0 and int(src.max()) < 64
    # the oracle: every sentence has a real token, padded on the right (the Transformer's positions count from
    # slot 0, so a left-padded sentence would be encoded at shifted positions)
    right = not left_pad or all(n in (0, s) for n in lengths)
    mask_ok = s >= 1 and all(n >= 1 for n in lengths) and right
    if not (ids_ok and mask_ok):
        _refused(lambda: model(src, tgt, src_mask=mask))
        return
    with torch.no_grad():
        out = model(src, tgt, src_mask=mask)
    assert out.shape == (b, tgt.size(1), 64) and _finite(out)
    gen = lambda: model.generate(src, src_mask=mask, max_new_tokens=4, beam_size=beam)  # noqa: E731
    if beam < 1:
        _refused(gen)
        return
    ids = gen()
    assert ids.shape[0] == b and ids.shape[1] <= 5 and bool((ids[:, 0] == 1).all())
    assert bool(((ids >= 0) & (ids < 64)).all()) and not bool((ids[:, 1:] == 1).any())  # never <s> again


@FAST
@given(encdec_calls())
def test_encoder_decoders_with_drawn_inputs(case):
    _check_encdec(case)


@pytest.mark.slow
@SLOW
@given(encdec_calls())
def test_encoder_decoders_with_drawn_inputs_long(case):
    _check_encdec(case)
