"""The C++ selective-scan kernel (seqlab.kernels) against selective_scan_ref: outputs, last states and every
gradient, in float64 (gradcheck, 1e-10) and float32; the dispatch, the fallback with its one warning, the cache."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

import seqlab.layers.scan as scan_module
from seqlab.kernels import build, build_info, kernel_unavailable, selective_scan_kernel
from seqlab.layers.scan import selective_scan, selective_scan_ref

F64 = torch.float64
_COMPILER = os.environ.get("CXX", "c++")
pytestmark = pytest.mark.skipif(
    shutil.which(_COMPILER) is None, reason=f"no C++ compiler ({_COMPILER}) on PATH"
)
OPTIONS = ["D", "z", "delta_bias", "initial_state"]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    """Build (or load) the kernel once for the module; skip when a build tool is missing, fail if the build does."""
    reason = kernel_unavailable()
    if reason is not None and reason.startswith(("no C++ compiler", "ninja")):
        pytest.skip(reason)
    assert reason is None, reason


def _inputs(b, t, d, n, dtype=F64, seed=0, options=OPTIONS):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    x = {"u": r(b, t, d), "delta": r(b, t, d), "A": -torch.rand(d, n, generator=g, dtype=dtype) * 3 - 0.1}
    x |= {
        "B": r(b, t, n),
        "C": r(b, t, n),
        "D": r(d),
        "z": r(b, t, d),
        "delta_bias": r(d),
        "initial_state": r(b, d, n),
    }
    return {k: v for k, v in x.items() if k in ("u", "delta", "A", "B", "C") or k in options}


def _call(fn, x, softplus=True, **kw):
    return fn(**x, delta_softplus=softplus, return_last_state=True, **kw)


def _compare(x, softplus, chunk, atol, rtol):
    """Outputs, last states and all gradients of the kernel against the reference."""
    x = {k: v.clone().requires_grad_() for k, v in x.items()}
    y_ref, h_ref = _call(selective_scan_ref, x, softplus)
    y, h = _call(selective_scan_kernel, x, softplus, chunk_size=chunk)
    torch.testing.assert_close(y, y_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(h, h_ref, atol=atol, rtol=rtol)
    wy, wh = torch.randn_like(y), torch.randn_like(h)
    g_ref = torch.autograd.grad((y_ref * wy).sum() + (h_ref * wh).sum(), list(x.values()))
    g = torch.autograd.grad((y * wy).sum() + (h * wh).sum(), list(x.values()))
    for name, a, e in zip(x, g, g_ref, strict=True):
        torch.testing.assert_close(a, e, atol=atol * 10, rtol=rtol * 10, msg=name)


@pytest.mark.parametrize(
    "options, softplus",
    [
        (OPTIONS, True),
        ([], False),
        (["D", "z"], False),
        (["delta_bias", "initial_state"], True),
        (["z"], True),
    ],
)
@pytest.mark.parametrize(
    ("b", "t", "d", "n", "chunk"), [(2, 37, 19, 5, 8), (1, 1, 3, 1, 64), (3, 16, 8, 16, 4)]
)
def test_float64_equals_reference(options, softplus, b, t, d, n, chunk):
    # t = 37 is no multiple of the chunk; d = 19 is no multiple of the channel block (8 in float64, 16 in float32)
    _compare(_inputs(b, t, d, n, seed=t + d, options=options), softplus, chunk, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("options", [OPTIONS, ["z"]])
def test_gradcheck_float64(options):
    x = _inputs(2, 5, 3, 2, seed=1, options=options)
    names = list(x)

    def f(*vals):
        return _call(selective_scan_kernel, dict(zip(names, vals, strict=True)), chunk_size=2)

    assert torch.autograd.gradcheck(f, tuple(v.requires_grad_() for v in x.values()))


@pytest.mark.parametrize(("t", "n"), [(64, 16), (100, 16), (37, 5), (50, 20), (21, 33)])
def test_float32_matches_reference(t, n):
    # float32 runs the AVX-512 loops where the CPU has them: the channel sums of dB, dC take 16 state rows at a
    # time, so n = 5, 20, 33 cover the partial groups; d = 40 leaves a half-empty channel block
    x = {k: v.float() for k, v in _inputs(2, t, 40, n, seed=t).items()}
    _compare(x, True, 32, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(("b", "d"), [(8, 40), (4, 100), (5, 19), (1, 100), (8, 200)])
def test_channel_block_groups_match_reference_at_any_thread_count(dtype, b, d, torch_threads):
    """A task takes one batch row and a group of channel blocks, sized by the batch and the thread count: at
    b = 8 and 2 threads one group of a row's 3 blocks; at b = 4, d = 100 (7 float32 blocks) groups of 4 + 3;
    one block a task at b = 1; at d = 200 (13 blocks) groups of at most 8, 7 + 6. Where a whole row is one task
    (the first and third), dB and dC are written to one slice; elsewhere each thread sums into its own, added at
    the end. The outputs and the per-position gradients are the same bits whatever the grouping (only the sums
    over channels and batch rows, dA, dB, dC, dD, may round differently)."""
    x = {k: v.to(dtype) for k, v in _inputs(b, 70, d, 16, seed=b + d).items()}
    tol = 1e-10 if dtype == F64 else 2e-4
    runs = []
    for n_threads in (1, 2, 3):
        torch_threads(n_threads)
        _compare(x, True, 16, atol=tol, rtol=tol)
        xg = {k: v.clone().requires_grad_() for k, v in x.items()}
        y, h = _call(selective_scan_kernel, xg, chunk_size=16)
        grads = torch.autograd.grad((y * y).sum() + h.sum(), [xg["u"], xg["delta"], xg["z"]])
        runs.append((y, h, *grads))
    for other in runs[1:]:
        for a, e in zip(other, runs[0], strict=True):
            assert torch.equal(a, e)


@pytest.mark.parametrize(
    ("dtype", "b", "t", "d", "n", "chunk"),
    [
        (F64, 2, 37, 19, 5, 8),
        (F64, 1, 1, 3, 1, 64),
        (F64, 3, 40, 8, 64, 16),
        (torch.float32, 2, 50, 40, 64, 32),  # the AVX-512 forward where the CPU has it; a half-empty block
        (torch.float32, 2, 21, 19, 17, 8),
    ],
)
def test_one_A_per_channel_equals_reference(dtype, b, t, d, n, chunk):
    """A (d, 1): one decay for a channel's n states (Mamba-2's SSD). The kernel takes one exp per channel and
    position and sums ∂L/∂A over the states; the reference broadcasts A. Every gradient, dA (d, 1) included."""
    x = {k: v.to(dtype) for k, v in _inputs(b, t, d, n, seed=n).items()}
    x["A"] = x["A"][:, :1].contiguous()
    tol = 1e-10 if dtype == F64 else 1e-4
    _compare(x, True, chunk, atol=tol, rtol=tol)
    y, h = _call(selective_scan, x, chunk_size=chunk, impl="chunked")  # the chunked scan expands A to (d, n)
    y_ref, h_ref = _call(selective_scan_ref, x)
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(h, h_ref, atol=tol, rtol=tol)


def test_gradcheck_one_A_per_channel():
    x = _inputs(2, 5, 3, 4, seed=2)
    x["A"] = x["A"][:, :1].contiguous()
    names = list(x)

    def f(*vals):
        return _call(selective_scan_kernel, dict(zip(names, vals, strict=True)), chunk_size=2)

    assert torch.autograd.gradcheck(f, tuple(v.requires_grad_() for v in x.values()))


def test_float32_nan_and_extreme_decays_match_reference():
    """The kernel's own exp: a NaN stays NaN (not 0 or 1), Δ·A far below float's range gives exp = 0."""
    x = {k: v.float() for k, v in _inputs(1, 12, 16, 16, seed=2).items()}
    x["delta"][0, 5, 3] = float("nan")
    x["A"][9, 2] = float("nan")  # reaches exp alone (Δ u B stays finite)
    x["A"][7] = -1e30
    x["delta"][0, 8], x["delta"][0, 9] = 40.0, -40.0  # softplus at both ends: ≈ 40 and ≈ 4e-18
    x["z"][0, 10], x["z"][0, 11] = 100.0, -100.0  # the gate's sigmoid at both ends
    (y, h), (y_ref, h_ref) = _call(selective_scan_kernel, x), _call(selective_scan_ref, x)
    assert torch.equal(torch.isnan(y), torch.isnan(y_ref)) and torch.isnan(y[0, 5:, 3]).all()
    assert torch.isnan(y[0, :, 9]).all() and not torch.isnan(y[0, :, 8]).any()
    assert torch.equal(torch.isnan(h), torch.isnan(h_ref))
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4, equal_nan=True)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_non_contiguous_and_half_precision_inputs():
    x = _inputs(2, 9, 6, 4, seed=3)
    # the same values behind transposed storage: (b, t, d) and (b, t, n) views of (b, d, t) / (b, n, t) tensors
    strided = {k: v.transpose(1, 2).contiguous().transpose(1, 2) if v.dim() == 3 else v for k, v in x.items()}
    assert not strided["u"].is_contiguous()
    _compare(strided, True, 4, atol=1e-10, rtol=1e-10)
    half = {k: v.bfloat16() for k, v in x.items()}
    y, h = _call(selective_scan_kernel, half)
    y_ref, h_ref = _call(selective_scan_ref, half)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4)


def test_views_with_spaced_rows_are_read_in_place():
    """The Mamba block's B, C (slices of x_proj's output) and z (half of in_proj's) reach the kernel as views."""
    b, t, d, n = 2, 21, 19, 5
    g = torch.Generator().manual_seed(4)
    proj = torch.randn(b, t, 3 + 2 * n, generator=g, dtype=F64, requires_grad=True)  # dt (3), B, C
    xz = torch.randn(b, t, 2 * d, generator=g, dtype=F64, requires_grad=True)  # u, z
    rest = _inputs(b, t, d, n, seed=5, options=["D", "delta_bias", "initial_state"])
    delta, A = rest.pop("delta").requires_grad_(), rest.pop("A")
    for name in ("u", "B", "C"):  # these come from the wide tensors below
        del rest[name]

    def run(fn, **kw):
        u, z = xz.chunk(2, dim=-1)
        B, C = proj[..., 3 : 3 + n], proj[..., 3 + n :]
        return _call(fn, {"u": u, "delta": delta, "A": A, "B": B, "C": C, "z": z, **rest}, **kw)

    y, h = run(selective_scan_kernel, chunk_size=8)
    y_ref, h_ref = run(selective_scan_ref)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(h, h_ref, atol=1e-10, rtol=1e-10)
    w = torch.randn_like(y)
    got = torch.autograd.grad((y * w).sum() + h.sum(), [proj, xz, delta])
    want = torch.autograd.grad((y_ref * w).sum() + h_ref.sum(), [proj, xz, delta])
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, atol=1e-9, rtol=1e-9)
    u, z = xz.detach().chunk(2, dim=-1)
    B, C = proj.detach()[..., 3 : 3 + n], proj.detach()[..., 3 + n :]
    # the compiled operator itself takes the views (no copy made on the way)
    out = torch.ops.seqlab_scan.fwd(u.contiguous(), delta.detach(), A, B, C, None, z, None, None, True, 8)
    torch.testing.assert_close(
        out[0], selective_scan_ref(u, delta.detach(), A, B, C, z=z, delta_softplus=True)
    )


def test_size_one_dimensions_with_any_strides_and_integer_inputs():
    """torch calls a tensor contiguous whatever the strides of its size-1 dimensions; the kernels read strides,
    so such views (a batch of 1 cut from a time-major tensor, t = 1) are copied first. Integer inputs are
    refused: the outputs take u's dtype and would come back truncated."""
    from seqlab.kernels.causal_conv import causal_conv_silu, causal_conv_silu_ref

    g = torch.Generator().manual_seed(0)
    A = -torch.rand(4, 3, generator=g)
    for b, t in ((1, 5), (2, 1)):
        u, delta = torch.randn(b, t, 4, generator=g), torch.rand(b, t, 4, generator=g)
        B = torch.randn(t, b, 3, generator=g).transpose(0, 1)  # time-major: contiguous only by torch's rule
        C, z = torch.randn(b, t, 3, generator=g), torch.randn(t, b, 4, generator=g).transpose(0, 1)
        assert B.is_contiguous() and z.is_contiguous()
        want = selective_scan_ref(u, delta, A, B, C, z=z)
        torch.testing.assert_close(selective_scan(u, delta, A, B, C, z=z, impl="kernel"), want)
        x = torch.randn(t, b, 4, generator=g).transpose(0, 1)
        state, w, bias = (
            torch.randn(b, 2, 4, generator=g),
            torch.randn(3, 4, generator=g),
            torch.randn(4, generator=g),
        )
        torch.testing.assert_close(
            causal_conv_silu(x, state, w, bias), causal_conv_silu_ref(x, state, w, bias)
        )
    u = torch.randn(1, 5, 4, generator=g)
    with pytest.raises(ValueError, match=r"u must be a floating tensor .* got torch\.int64"):
        selective_scan(u.long(), u.abs(), A, torch.randn(1, 5, 3), torch.randn(1, 5, 3))


def test_large_decays_stay_finite():
    x = {k: v.float() for k, v in _inputs(1, 200, 4, 16).items()}
    x["delta"], x["A"] = x["delta"] * 50, x["A"] * 10  # Δ·A down to about -10^3 per step
    (y, h), (y_ref, h_ref) = _call(selective_scan_kernel, x), _call(selective_scan_ref, x)
    assert torch.isfinite(y).all() and torch.isfinite(h).all()
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4)


def test_backward_keeps_only_inputs_and_chunk_states():
    b, t, d, n, chunk = 2, 96, 4, 8, 32
    x = {k: v.requires_grad_() for k, v in _inputs(b, t, d, n).items()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s.numel()) or s, lambda s: s):
        _call(selective_scan_kernel, x, chunk_size=chunk)
    assert b * (t // chunk) * n * d in saved  # the state entering each chunk
    assert max(saved) <= max(b * t * d, b * t * n)  # never a (b, t, d, n) tensor


def test_selective_scan_dispatches_to_the_kernel_on_cpu(monkeypatch):
    calls = []

    def spy(*args):
        calls.append(1)
        return selective_scan_kernel(*args)

    monkeypatch.setattr(scan_module, "selective_scan_kernel", spy)
    x = _inputs(2, 7, 5, 3)
    y_auto = selective_scan(**x, delta_softplus=True)
    y_chunked = selective_scan(**x, delta_softplus=True, impl="chunked")
    assert calls == [1]
    torch.testing.assert_close(y_auto, y_chunked, atol=1e-10, rtol=1e-10)
    with pytest.raises(RuntimeError, match="not all on the CPU"):
        selective_scan(*(v.to("meta") for v in list(x.values())[:5]), impl="kernel")
    with pytest.raises(ValueError, match="impl must be"):
        selective_scan(**x, impl="fast")


@pytest.mark.parametrize("failure", ["build", "compiler"])
def test_fallback_warns_once_and_gives_the_same_numbers(monkeypatch, caplog, tmp_path, failure):
    def broken(*args):
        raise RuntimeError("Error building extension 'x':\nselective_scan.cpp:1:1: error: something broke")

    monkeypatch.setattr(build, "_info", None)  # as in a fresh process
    if failure == "build":
        monkeypatch.setattr(build, "_compile", broken)
    else:  # nothing built yet (an empty cache) and no compiler to build it
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
        monkeypatch.setenv("CXX", "no-such-compiler")
    x = _inputs(2, 7, 5, 3)
    with caplog.at_level(logging.WARNING, logger="seqlab.kernels"):
        ys = [selective_scan(**x, delta_softplus=True) for _ in range(3)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "chunked PyTorch scan" in warnings[0]
    assert ("error: something broke" if failure == "build" else "no-such-compiler") in warnings[0]
    assert not build_info().loaded and build_info().reason in warnings[0]
    expected = selective_scan(**x, delta_softplus=True, impl="chunked")
    assert all(torch.equal(y, expected) for y in ys)


def test_second_process_loads_from_the_cache():
    info = build_info()
    assert info.loaded and info.seconds >= 0
    code = (
        "import dataclasses, json; from seqlab.kernels import build_info, load_kernel; "
        "load_kernel(); print(json.dumps(dataclasses.asdict(build_info())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    child = json.loads(out.strip().splitlines()[-1])
    assert child["loaded"] and child["cached"], child
    assert child["name"] == info.name and child["path"] == info.path


@pytest.mark.parametrize("impl", ["kernel", "chunked"])
def test_second_derivatives_are_the_references(impl):
    """A backward with create_graph=True (a gradient penalty) differentiates the reference: exact second
    derivatives, where the kernel's own backward would have given zeros."""
    g = torch.Generator().manual_seed(0)
    b, t, d, n = 1, 5, 3, 2
    u, B, C = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((b, t, d), (b, t, n), (b, t, n)))
    delta = 0.1 + 0.5 * torch.rand(b, t, d, generator=g, dtype=torch.float64)
    A = -(0.1 + torch.rand(d, n, generator=g, dtype=torch.float64))
    D, z = torch.randn(d, dtype=torch.float64), torch.randn(b, t, d, dtype=torch.float64)
    inputs = tuple(x.requires_grad_() for x in (u, delta, A, B, C))

    def scan(u, delta, A, B, C):
        return selective_scan(u, delta, A, B, C, D, z, impl=impl)

    assert torch.autograd.gradgradcheck(scan, inputs)
