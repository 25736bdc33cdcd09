r"""The selective scan on the GPU: Triton kernels for the forward and the recomputing backward.

Same contract and numbers as ``seqlab.layers.scan.selective_scan_ref`` and the CPU kernel
(``selective_scan.py``); ``b`` batch, ``t`` time, ``d`` channels, ``n`` state size:

    Δ_t = softplus(delta_t + delta_bias)                 # bias and softplus optional
    h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t              # (b, d, n)
    y_t = (⟨h_t, C_t⟩ + D u_t) ⊙ silu(z_t)                # (b, d); D and the gate optional

One program per (batch row, block of channels; ``LAUNCH``) walks the sequence with its (channels, n) state in
registers; every step reads one row of u, Δ, z and of B, C and writes one row of y (each row's loads go out one
step ahead, so their latency overlaps the step before), and the state never goes to memory except at chunk
boundaries: the forward stores the state entering each
chunk of ``chunk`` positions, (b, t / chunk, d, n), for the backward. The backward walks the chunks from
the last: it recomputes the chunk's states from the saved one into a per-program scratch buffer (chunk + 1
states of (channels, n), which stays in L2), then runs the adjoint recurrence of docs/scan.md backwards
through the chunk:

    g_t = dy_t ⊙ silu(z_t)                     dz_t = dy_t ⊙ (⟨h_t, C_t⟩ + D u_t) ⊙ silu'(z_t)
    λ_t = λ_{t+1} ⊙ exp(Δ_{t+1} A) + g_t C_t   # the state's adjoint, λ_T = dh_last
    dC_t = Σ_d g_t h_t      dB_t = Σ_d λ_t Δ_t u_t      du_t = Δ_t Σ_n λ_t B_t + D g_t
    dΔ_t = Σ_n λ_t A exp(Δ_t A) h_{t-1} + u_t Σ_n λ_t B_t      dA = Σ_{b,t} λ_t Δ_t exp(Δ_t A) h_{t-1}

Sums over channels (dB, dC) are written per channel block and added up by PyTorch afterwards, sums over the
batch (dA, dD, d bias) per batch row: no atomics, so the gradients are deterministic. Inputs are computed in
float32 (float64 stays float64); y comes back in u's dtype, the last state in the computing dtype.

Why Triton and not CUDA C++: it compiles on first use with nothing but ``pip install triton`` (PyTorch's CUDA
wheels bring it; about 3 s for both kernels), caches across processes (~/.triton), and reads like the equations
above. The walk is latency-bound, not bandwidth-bound, so small programs win: 8 channels and one warp each
(b · d / 8 programs) was the fastest launch on an H100: forward + backward 3.6 ms at b 8, t 1024, d 1536,
n 16 (2.6 ms in the launch sweep), 60x seqlab's chunked PyTorch scan and 650x transformers' PyTorch path
(benchmarks/results/scan-gpu-*; ``python benchmarks/bench_scan_gpu.py --sweep`` times the settings on
another GPU). mamba_ssm's CUDA kernel additionally runs a parallel scan inside each chunk.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from seqlab.kernels.selective_scan import check_scan_shapes, checked_chunk, unsupported_shapes, widened

__all__ = ["selective_scan_triton", "triton_unavailable", "why_not_triton"]

DEFAULT_CHUNK = 64
"""Positions between the states saved for backward; the backward's scratch is (chunk + 1) states per program."""

LAUNCH = {"fwd": (8, 1), "bwd": (8, 1)}
"""(channels per program, warps per program) of each kernel: (channels, n) is the state a program keeps in
registers. ``python benchmarks/bench_scan_gpu.py --sweep`` times the alternatives on the GPU at hand."""


def _interpreting() -> bool:
    """Triton's interpreter (``TRITON_INTERPRET=1``) runs the kernels on CPU tensors with NumPy: for tests."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def triton_unavailable() -> str | None:
    """None when Triton imports, else why not (with the line that installs it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (PyTorch's CUDA wheels bring it; else `pip install triton`)"
    return None


def why_not_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> str | None:
    """None when :func:`selective_scan_triton` takes these inputs, else why not: the device, the dtype, the shapes
    of D, z and delta_bias (the others are :func:`check_scan_shapes`'), and Triton itself."""
    given = [x for x in (u, delta, A, B, C, D, z, delta_bias, initial_state) if x is not None]
    devices = {x.device.type for x in given}
    if devices != {"cuda"} and not (_interpreting() and devices == {"cpu"}):
        return f"the Triton scan runs on CUDA tensors, these are on {sorted(devices)}"
    if torch.compiler.is_compiling():
        return "torch.compile is tracing (the Triton scan is not registered as a custom op)"
    if not u.is_floating_point():
        return f"u has dtype {u.dtype}; the Triton scan computes in float32 or float64"
    return unsupported_shapes(u, D, z, delta_bias) or triton_unavailable()


@functools.cache
def _kernels():
    """The two ``@triton.jit`` kernels, imported on first use so that importing seqlab never imports Triton."""
    from seqlab.kernels import _triton_scan_kernels as k

    return k.scan_fwd, k.scan_bwd


def _block_n(n: int) -> int:
    return max(2, 1 << (n - 1).bit_length())


class _TritonScan(torch.autograd.Function):
    """u, delta, A, B, C, D?, z?, delta_bias?, h0? (contiguous, one dtype) -> y (b, t, d), last state (b, d, n)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, h0, softplus: bool, chunk: int):
        scan_fwd, _ = _kernels()
        b, t, d = u.shape
        n = A.size(1)
        n_chunks = -(-t // chunk)
        y = torch.empty_like(u)
        h_last = u.new_empty(b, d, n)
        bounds = u.new_empty(b, n_chunks, d, n)
        dummy = u.new_empty(0)
        block_d, warps = LAUNCH["fwd"]
        scan_fwd[(b, -(-d // block_d))](
            u, delta, A, B, C,
            dummy if D is None else D, dummy if z is None else z,
            dummy if delta_bias is None else delta_bias, dummy if h0 is None else h0,
            y, h_last, bounds, t, d, n, n_chunks,
            HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, HAS_H0=h0 is not None,
            SOFTPLUS=softplus, CHUNK=chunk, BLOCK_D=block_d, BLOCK_N=_block_n(n), num_warps=warps,
        )  # fmt: skip
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, bounds)
        ctx.softplus, ctx.chunk = softplus, chunk
        ctx.given = (D is not None, z is not None, delta_bias is not None, h0 is not None)
        return y, h_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last):
        _, scan_bwd = _kernels()
        u, delta, A, B, C, D, z, delta_bias, bounds = ctx.saved_tensors
        b, t, d = u.shape
        n = A.size(1)
        block_d, warps = LAUNCH["bwd"]
        n_blocks, block_n = -(-d // block_d), _block_n(n)
        dy = torch.zeros_like(u) if dy is None else dy.to(u.dtype).contiguous()
        dh_last = u.new_zeros(b, d, n) if dh_last is None else dh_last.to(u.dtype).contiguous()
        du, ddelta = torch.empty_like(u), torch.empty_like(u)
        dz = torch.empty_like(u) if z is not None else u.new_empty(0)
        dB_parts = u.new_empty(b, t, n_blocks, n)  # per channel block, summed below
        dC_parts = u.new_empty(b, t, n_blocks, n)
        dA_parts, dh0 = u.new_empty(b, d, n), u.new_empty(b, d, n)  # per batch row
        dD_parts, dbias_parts = u.new_empty(b, d), u.new_empty(b, d)
        scratch = u.new_empty(b * n_blocks * (ctx.chunk + 1) * block_d * block_n)
        dummy = u.new_empty(0)
        scan_bwd[(b, n_blocks)](
            u, delta, A, B, C,
            dummy if D is None else D, dummy if z is None else z, dummy if delta_bias is None else delta_bias,
            bounds, dy, dh_last,
            du, ddelta, dz, dB_parts, dC_parts, dA_parts, dD_parts, dbias_parts, dh0, scratch,
            t, d, n, bounds.size(1), n_blocks,
            HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
            SOFTPLUS=ctx.softplus, CHUNK=ctx.chunk, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
        has_D, has_z, has_bias, has_h0 = ctx.given
        return (
            du,
            ddelta,
            dA_parts.sum(0),
            dB_parts.sum(2),
            dC_parts.sum(2),
            dD_parts.sum(0) if has_D else None,
            dz if has_z else None,
            dbias_parts.sum(0) if has_bias else None,
            dh0 if has_h0 else None,
            None,
            None,
        )


def selective_scan_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    initial_state: Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int | None = None,
):
    r"""The selective scan through the Triton kernels; the signature of ``seqlab.layers.scan.selective_scan``.

    Shapes: u, delta, z (b, t, d); A (d, n); B, C (b, t, n); D, delta_bias (d,); initial_state (b, d, n).
    Returns y (b, t, d), and the last state (b, d, n) when ``return_last_state``. ``chunk_size``: positions
    between the states saved for backward (None: :data:`DEFAULT_CHUNK`). :func:`why_not_triton` says
    beforehand whether it takes the inputs.
    """
    check_scan_shapes(u, delta, A, B, C, initial_state)
    chunk = checked_chunk(chunk_size, DEFAULT_CHUNK, u.size(1))
    inputs = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    if (reason := why_not_triton(*inputs)) is not None:
        raise RuntimeError(f"the Triton selective scan cannot run: {reason}")
    y, h = _TritonScan.apply(*widened(inputs), bool(delta_softplus), chunk)
    y = y.to(u.dtype)
    return (y, h) if return_last_state else y
