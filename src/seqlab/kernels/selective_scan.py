r"""The fused CPU selective scan: the C++ operators of ``selective_scan.cpp`` behind a ``torch.autograd.Function``.

Same contract and numbers as ``seqlab.layers.scan.selective_scan_ref`` (Gu & Dao 2023, arXiv 2312.00752,
Algorithm 2); ``b`` batch, ``t`` time, ``d`` channels, ``n`` state size:

    Δ_t = softplus(delta_t + delta_bias)                 # bias and softplus optional
    h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t              # (b, d, n); A (d, n), or (d, 1): one exp a channel
    y_t = (⟨h_t, C_t⟩ + D u_t) ⊙ silu(z_t)                # (b, d); D and the gate optional

One pass over the sequence per (batch row, block of channels) does all of it, softplus and gate included.
Autograd saves the inputs and the state entering each chunk of ``chunk_size`` positions, (b, t / chunk, n, d);
the backward recomputes one chunk at a time and runs the adjoint recurrence through it (docs/scan.md), so
memory stays O(b·t·d + b·(t / chunk)·d·n). Inputs in half precision are computed in float32, like the
reference; y comes back in u's dtype, the last state in the computing dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqlab.kernels.build import kernel_unavailable
from seqlab.kernels.extension import with_spaced_rows

__all__ = [
    "DEFAULT_CHUNK",
    "check_scan_shapes",
    "selective_scan_kernel",
    "unsupported_shapes",
    "why_not_kernel",
]

DEFAULT_CHUNK = 64
"""Positions between saved states. The backward's buffers per thread are 2·chunk·n·W values (W = 16 float32
or 8 float64 channels: 128 KiB at n = 16); the saved states (b, t / chunk, n, d) are 1/4 of u's size at n = 16."""


def check_scan_shapes(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    initial_state: Tensor | None = None,
    *,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    owner: str = "selective_scan",
) -> None:
    """A ValueError naming the expected and the given shape unless u, delta (b, t, d), A (d, n) or (d, 1) (one
    value for all n states of a channel, as Mamba-2's SSD has), B, C (b, t, n), initial_state (b, d, n) and,
    where given, D (d,), z (b, t, d) and delta_bias (d,) agree, all floating: the contract of every selective
    scan (reference, chunked, kernels). D, z and delta_bias may also be any shape that broadcasts to (b, t, d)
    without changing it, as the reference computes them (the fused kernels take the exact shapes only:
    :func:`unsupported_shapes`). ``owner`` starts the message."""
    named = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "initial_state": initial_state}
    named |= {"D": D, "z": z, "delta_bias": delta_bias}
    for name, x in named.items():
        if x is not None and not (isinstance(x, Tensor) and x.is_floating_point()):
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(
                f"{owner}: {name} must be a floating tensor (the scan's outputs take u's dtype), got {got}"
            )
    if u.dim() != 3:
        raise ValueError(f"{owner}: u must be (b, t, d), got shape {tuple(u.shape)}")
    b, t, d = u.shape
    if delta.shape != u.shape:
        raise ValueError(f"{owner}: delta must have u's shape {tuple(u.shape)}, got {tuple(delta.shape)}")
    if A.dim() != 2 or A.size(0) != d:
        raise ValueError(
            f"{owner}: A must be (d, n) = ({d}, n), or ({d}, 1) for one A per channel, got {tuple(A.shape)}"
        )
    n = B.size(-1) if A.size(1) == 1 and B.dim() == 3 else A.size(1)  # (d, 1): one A for a channel's n states
    for name, m in (("B", B), ("C", C)):
        if tuple(m.shape) != (b, t, n):
            raise ValueError(f"{owner}: {name} must be (b, t, n) = {(b, t, n)}, got {tuple(m.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (b, d, n):
        raise ValueError(
            f"{owner}: initial_state must be (b, d, n) = {(b, d, n)}, got {tuple(initial_state.shape)}"
        )
    expected = {
        "D": f"(d,) = ({d},) (or broadcast to u's shape {(b, t, d)})",
        "z": f"shaped like u, (b, t, d) = {(b, t, d)} (or broadcast to it)",
        "delta_bias": f"(d,) = ({d},) (or broadcast to delta's shape {(b, t, d)})",
    }
    for name, want in expected.items():
        x = named[name]
        if x is not None and not _broadcasts_to(tuple(x.shape), (b, t, d)):
            raise ValueError(f"{owner}: {name} must be {want}, got {tuple(x.shape)}")


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` broadcasts against one of ``target`` to ``target`` itself."""
    return len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False)
    )


def unsupported_shapes(
    u: Tensor, D: Tensor | None, z: Tensor | None, delta_bias: Tensor | None
) -> str | None:
    """Why a fused scan (the C++ or the Triton one) cannot take D, z and delta_bias, or None: they must be (d,),
    (b, t, d) and (d,) exactly, where the reference would broadcast other shapes."""
    if u.dim() != 3 or u.size(1) == 0:
        return "u is not a non-empty (b, t, d) sequence"
    b, t, d = u.shape
    expected = {"D": (D, (d,)), "z": (z, (b, t, d)), "delta_bias": (delta_bias, (d,))}
    for name, (x, shape) in expected.items():
        if x is not None and tuple(x.shape) != shape:
            return f"{name} has shape {tuple(x.shape)}, the kernel takes {shape} only"
    return None


def why_not_kernel(
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
    """None when :func:`selective_scan_kernel` takes these inputs (building the kernel on first call), else why
    not. The inputs are checked first, so that inputs the kernel never takes do not trigger a build."""
    given = [x for x in (u, delta, A, B, C, D, z, delta_bias, initial_state) if x is not None]
    if torch.compiler.is_compiling():
        return "torch.compile is tracing (the kernel's operators have no fake-tensor rules)"
    if any(x.device.type != "cpu" for x in given):
        return "the inputs are not all on the CPU"
    if not u.is_floating_point():
        return f"u has dtype {u.dtype}; the kernel computes in float32 or float64"
    return unsupported_shapes(u, D, z, delta_bias) or kernel_unavailable()


class _KernelScan(torch.autograd.Function):
    """u, delta, A, B, C, D?, z?, delta_bias?, h0? (one dtype; contiguous, B, C, z with spaced rows allowed) -> y (b, t, d),
    last state (b, d, n)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, h0, softplus: bool, chunk: int):
        y, h_last, bounds = torch.ops.seqlab_scan.fwd(
            u, delta, A, B, C, D, z, delta_bias, h0, softplus, chunk
        )
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, bounds, h0)  # bounds: (b, t / chunk, n, d)
        ctx.softplus, ctx.chunk = softplus, chunk
        ctx.given = (D is not None, z is not None, delta_bias is not None, h0 is not None)
        return y, h_last

    @staticmethod
    def backward(ctx, dy, dh_last):
        u, delta, A, B, C, D, z, delta_bias, bounds, h0 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference, so that second
            inputs = (u, delta, A, B, C, D, z, delta_bias, h0)  # derivatives are exact too
            return (*through_reference(inputs, (dy, dh_last), ctx.softplus), None, None)
        du, ddelta, dA, dB, dC, dD, dz, dbias, dh0 = torch.ops.seqlab_scan.bwd(
            u,
            delta,
            A,
            B,
            C,
            D,
            z,
            delta_bias,
            bounds,
            dy.contiguous(),
            dh_last.contiguous(),
            ctx.softplus,
            ctx.chunk,
        )
        has_D, has_z, has_bias, has_h0 = ctx.given
        optional = (
            dD if has_D else None,
            dz if has_z else None,
            dbias if has_bias else None,
            dh0 if has_h0 else None,
        )
        return du, ddelta, dA, dB, dC, *optional, None, None


# The reference scan, seqlab.layers.scan.selective_scan_ref, which sets it when imported (kernels import nothing
# from the layers above them); differentiated instead of the kernel by a backward with create_graph=True.
REFERENCE: list = [None]


def through_reference(inputs: tuple, grads: tuple, softplus: bool) -> list:
    """The gradients of the reference scan's (y, last state) at ``inputs`` (u, delta, A, B, C, D, z,
    delta_bias, h0; None where absent) against ``grads``, as a differentiable graph: a backward with
    create_graph=True through the kernel. None for the inputs that need no gradient."""
    if REFERENCE[0] is None:
        raise RuntimeError(
            "a backward with create_graph=True through the scan kernel needs seqlab.layers.scan"
        )
    u, delta, A, B, C, D, z, delta_bias, h0 = inputs
    with torch.enable_grad():
        y, h = REFERENCE[0](u, delta, A, B, C, D, z, delta_bias, softplus, h0, return_last_state=True)
        wanted = [i for i, x in enumerate(inputs) if x is not None and x.requires_grad]
        outs = [(o, g) for o, g in ((y, grads[0]), (h, grads[1])) if g is not None]
        got = torch.autograd.grad(
            [o for o, _ in outs], [inputs[i] for i in wanted], [g for _, g in outs], create_graph=True,
            allow_unused=True,
        )  # fmt: skip
    result = [None] * len(inputs)
    for i, g in zip(wanted, got, strict=True):
        result[i] = g if g is not None else torch.zeros_like(inputs[i])
    return result


def selective_scan_kernel(
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
    r"""The selective scan through the C++ kernel; the signature of ``seqlab.layers.scan.selective_scan``.

    Shapes: u, delta, z (b, t, d); A (d, n) or (d, 1) (one A for a channel's n states); B, C (b, t, n); D,
    delta_bias (d,); initial_state (b, d, n).
    Returns y (b, t, d), and the last state (b, d, n) when ``return_last_state``. ``chunk_size``: positions
    between the states saved for backward (None: :data:`DEFAULT_CHUNK`). Raises ValueError for inputs it never
    takes (:func:`check_scan_shapes`, then :func:`unsupported_shapes` and CPU tensors only), RuntimeError when
    the kernel cannot be built; :func:`why_not_kernel` says beforehand whether it takes the inputs.
    """
    check_scan_shapes(
        u, delta, A, B, C, initial_state, D=D, z=z, delta_bias=delta_bias, owner="selective_scan_kernel"
    )
    inputs = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    reason = unsupported_shapes(u, D, z, delta_bias)
    if reason is None and any(x is not None and x.device.type != "cpu" for x in inputs):
        reason = "the inputs are not all on the CPU"
    if reason is not None:
        raise ValueError(f"selective_scan_kernel cannot take these inputs: {reason}")
    chunk = checked_chunk(chunk_size, DEFAULT_CHUNK, u.size(1))
    if (reason := kernel_unavailable()) is not None:
        raise RuntimeError(f"the selective-scan kernel is unavailable: {reason}")
    y, h = _KernelScan.apply(*widened(inputs, views=(3, 4, 6)), bool(delta_softplus), chunk)
    y = y.to(u.dtype)
    return (y, h) if return_last_state else y


def checked_chunk(chunk_size: int | None, default: int, t: int) -> int:
    """Positions per saved state: ``chunk_size`` (None: ``default``), never longer than t (the backward's buffers
    hold one chunk); a ValueError below 1."""
    chunk_size = default if chunk_size is None else chunk_size
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    return min(int(chunk_size), max(t, 1))


def widened(inputs: tuple[Tensor | None, ...], views: tuple[int, ...] = ()) -> list[Tensor | None]:
    """The scan's inputs in float32 at least (float64 stays), contiguous; those at the indices in ``views`` may
    stay (b, t, m) views with spaced rows, which the CPU kernel reads in place."""
    wide = torch.promote_types(inputs[0].dtype, torch.float32)
    ready = [None if x is None else x.to(wide) for x in inputs]
    for i, x in enumerate(ready):
        if x is not None:
            ready[i] = with_spaced_rows(x) if i in views and x.dim() == 3 else x.contiguous()
    return ready
