r"""The selective scan of Mamba (Gu & Dao 2023, arXiv 2312.00752, Algorithm 2 and Section 3.3).

Notation: ``b`` batch, ``t`` time, ``d`` channels (``d_inner`` in the Mamba block), ``n`` SSM state size.
Layout is batch-first like the rest of seqlab: sequences are ``(b, t, d)``, the per-position SSM inputs
B and C are ``(b, t, n)``, the state is ``(b, d, n)``. (mamba_ssm and Hugging Face use ``(b, d, t)``; the
converter never needs the scan's layout, and batch-first saves a transpose on both sides of the block.)

For every channel ``d`` and state index ``n``, with Δ input-dependent (the "selection"):

    Ā_t = exp(Δ_t A)                      # zero-order hold of A, elementwise (A is diagonal): (b, d, n)
    B̄_t u_t ≈ Δ_t B_t u_t                  # the paper's simplified (Euler) discretization of B
    h_t = Ā_t ⊙ h_{t-1} + B̄_t u_t          # (b, d, n)
    y_t = ⟨h_t, C_t⟩_n + D u_t              # (b, d)
    y_t ← y_t ⊙ silu(z_t)                  # optional gate

Two implementations with the same signature and the same numbers:

* ``selective_scan_ref``: the equations above as a loop over t, differentiated by autograd. The reference.
* ``selective_scan``: the fast path. The sequence is cut into chunks of ``chunk_size`` positions. Per chunk
  the big (b, l, n, d) tensors (Ā, B̄u and the states; channels innermost) are built with a few vectorized
  operations, the recurrence runs over the chunk's positions on (b, n, d) slices written in place into one
  chunk buffer, and the outputs are one batched product with C. A custom ``torch.autograd.Function`` keeps
  only the inputs and the state at each chunk boundary, (b, t / chunk_size, n, d), and recomputes one chunk
  at a time in the backward pass, whose adjoint recurrence and parameter gradients are written out in
  docs/scan.md. So memory is O(b·t·d + b·(t/l)·d·n + b·l·d·n), never the O(b·t·d·n) of a scan that keeps
  every state for autograd (Hugging Face's slow path and mambapy's pscan both do).

Why a loop inside each chunk and not a parallel (log-depth or cumsum) form: on CPU the work, not the
number of kernel launches, is what costs, and the loop does the least. The alternatives were measured on
one core at b=16, t=256, d=512, n=16 (forward only): the in-chunk loop 0.15-0.2 s; a Hillis–Steele scan
per chunk (log₂ l passes over the chunk, factors all ≤ 1) 0.3-1.3 s; the cumsum form
h_t = exp(S_t) (h_0 + Σ_{s≤t} exp(-S_s) B̄_s u_s) with S the in-chunk cumsum of Δ·A 0.45-0.7 s, and it
overflows (NaN at l=128): exp(-S_s) has a positive exponent. Every exponent the fast path takes is Δ·A ≤ 0
(for Δ ≥ 0, A ≤ 0), so Ā ∈ (0, 1] and products of Ā can only underflow towards 0, which is exact in the
limit. mambapy's Blelloch pscan over the whole sequence took 0.75 s for the same forward.

On the CPU, ``selective_scan`` runs a fused C++ kernel (``seqlab.kernels``, built with g++ on first use, about
10-30 s, and cached in ~/.cache/seqlab/kernels): one pass over the sequence per (batch row, 16 float32 channels),
the state (n × 16) in a local buffer, softplus(Δ + bias), exp(Δ A), Δ B u, ⟨h, C⟩ + D u and the silu(z) gate
fused, channels innermost so that every inner loop is one vector loop, tasks spread over torch's threads. Its
backward runs the recurrence of docs/scan.md in reverse over each chunk of ``chunk_size`` positions, recomputed
from the state saved at the chunk's start, so memory stays as above. Why: the chunked scan spends its time
writing and re-reading (b, l, n, d) buffers between PyTorch operations, while the kernel keeps them in registers
and cache; forward + backward at b=16, t=256, d=512, n=16 is 3.5x faster, a Mamba LM training step 2.1-2.6x at
the lab's widths (the projections and the conv are the rest); TorchInductor's compile of the loop reference,
measured too, ran 1.8x slower than the kernel at t=16 and did not finish compiling at t=256
(benchmarks/results/scan-kernel-*). Without a compiler, or when the build fails, a warning says so once and
the chunked scan runs. On CUDA tensors the scan runs Triton kernels of the same design
(``seqlab.kernels.triton_scan``: one program per batch row and 8 channels, the state in registers, the same
recomputing backward) where Triton is installed, and the chunked scan where not. ``impl="chunked"``,
``"kernel"`` or ``"triton"`` forces one.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.kernels import selective_scan as scan_kernel
from seqlab.kernels import selective_scan_kernel, why_not_kernel
from seqlab.kernels.selective_scan import check_scan_shapes
from seqlab.kernels.triton_scan import selective_scan_triton, why_not_triton

__all__ = ["auto_chunk_size", "selective_scan", "selective_scan_ref"]


def _widened(
    u, delta, A, B, C, delta_bias, delta_softplus, initial_state, *, D, z, owner: str
) -> tuple[Tensor, ...]:
    """The checked inputs in float32 at least, delta with its bias and softplus; and h0 (b, d, n). D and z
    are only checked here (``_finish`` applies them); ``owner`` names the scan in an error."""
    check_scan_shapes(u, delta, A, B, C, initial_state, D=D, z=z, delta_bias=delta_bias, owner=owner)
    wide = torch.promote_types(u.dtype, torch.float32)
    u, delta, A, B, C = (x.to(wide) for x in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias  # (b, t, d) + (d,)
    delta = F.softplus(delta) if delta_softplus else delta
    b, _, d = u.shape
    h0 = u.new_zeros(b, d, B.size(-1)) if initial_state is None else initial_state.to(wide)
    return u, delta, A, B, C, h0


def _per_state(A: Tensor, B: Tensor) -> Tensor:
    """A (d, 1), one value for a channel's n states, as (d, n) (autograd sums the copies' gradients); A (d, n) as
    is. For the scans that take (d, n) only (the chunked and the Triton one; the C++ kernel takes both)."""
    if A.dim() == 2 and A.size(1) == 1 and B.dim() == 3 and B.size(-1) != 1:
        return A.expand(A.size(0), B.size(-1)).contiguous()
    return A


def _finish(y: Tensor, u: Tensor, D: Tensor | None, z: Tensor | None) -> Tensor:
    if D is not None:
        y = y + u * D  # (b, t, d) + (b, t, d) * (d,)
    if z is not None:
        y = y * F.silu(z)
    return y


def selective_scan_ref(
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
):
    r"""The selective scan as a plain loop over time (the reference).

    Shapes: u, delta, z (b, t, d); A (d, n), or (d, 1) for one A shared by a channel's n states (Mamba-2's SSD,
    ``seqlab.layers.ssd``: the kernel then takes one exp per channel and position, not n); B, C (b, t, n); D,
    delta_bias (d,); initial_state (b, d, n).
    Returns y (b, t, d), and the last state (b, d, n) when ``return_last_state``. Computes in float32 for
    half-precision inputs; y has u's dtype.
    """
    dtype = u.dtype
    u, delta, A, B, C, h = _widened(
        u, delta, A, B, C, delta_bias, delta_softplus, initial_state, D=D, z=z, owner="selective_scan_ref"
    )
    b, t, d = u.shape
    ys = []
    for i in range(t):
        dA = torch.exp(delta[:, i, :, None] * A)  # Ā_t = exp(Δ_t A): (b, d, 1) * (d, n) -> (b, d, n)
        dBu = (delta[:, i] * u[:, i])[:, :, None] * B[:, i, None, :]  # Δ_t u_t B_t: (b, d, 1) * (b, 1, n)
        h = dA * h + dBu  # (b, d, n)
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, i]))  # ⟨h_t, C_t⟩: (b, d)
    y = torch.stack(ys, dim=1) if ys else u.new_zeros(b, 0, d)  # (b, t, d)
    y = _finish(y, u, D, z).to(dtype)
    return (y, h) if return_last_state else y


scan_kernel.REFERENCE[0] = selective_scan_ref  # what the kernel differentiates for create_graph=True


class _ChunkedScan(torch.autograd.Function):
    """y_t = ⟨h_t, C_t⟩, h_t = exp(Δ_t A) h_{t-1} + Δ_t u_t B_t, chunk by chunk; backward recomputes.

    Inputs u, delta (b, t, d); A (d, n); B, C (b, t, n); h0 (b, d, n). Outputs y (b, t, d), h_t (b, d, n).
    Inside, states are laid out (b, n, d) and a chunk's buffers (b, l, n, d): channels innermost, so that
    every broadcast runs along a contiguous row of d and every contraction over n or d is a batched matrix
    product (with n = 16 innermost the elementwise kernels ran 16-wide and the reductions were slow sums).
    """

    @staticmethod
    def _chunk_states(u, delta, At, B, h0):
        """One chunk: (b, l, d) inputs, At = Aᵀ (n, d), h0 (b, n, d) -> Ā, H (b, l, n, d), H[:, i] = h_i."""
        # Ā = exp(Δ A): (b, l, 1, d) * (n, d) -> (b, l, n, d), every exponent ≤ 0
        dA = torch.mul(delta[:, :, None, :], At).exp_()
        H = (delta * u)[:, :, None, :] * B[..., None]  # Δ u B: (b, l, 1, d) * (b, l, n, 1) -> (b, l, n, d)
        h = h0
        for i in range(u.size(1)):  # h_i = Ā_i h_{i-1} + Δ_i u_i B_i, in place over the Δ u B buffer
            h = torch.addcmul(H[:, i], dA[:, i], h, out=H[:, i])
        return dA, H

    @staticmethod
    def forward(ctx, u, delta, A, B, C, h0, chunk_size: int):
        b, t, d = u.shape
        At = A.t().contiguous()  # (n, d)
        starts = list(range(0, t, chunk_size))
        boundary = u.new_empty(b, len(starts), A.size(1), d)  # state entering each chunk: (b, c, n, d)
        y = u.new_empty(b, t, d)
        h = h0.transpose(1, 2)  # (b, n, d)
        for k, s in enumerate(starts):
            e = min(s + chunk_size, t)
            boundary[:, k] = h
            _, H = _ChunkedScan._chunk_states(u[:, s:e], delta[:, s:e], At, B[:, s:e], h)
            y[:, s:e] = (C[:, s:e, None, :] @ H).squeeze(2)  # ⟨C_i, h_i⟩: (b, l, 1, n) x (b, l, n, d)
            h = H[:, -1].clone()
        ctx.save_for_backward(u, delta, A, B, C, boundary, h0)
        ctx.chunk_size = chunk_size
        return y, h.transpose(1, 2)

    @staticmethod
    def backward(ctx, dy, dh_last):
        u, delta, A, B, C, boundary, h0 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the reference's graph (its loops write in place)
            du, ddelta, dA, dB, dC, *_, dh0 = scan_kernel.through_reference(
                (u, delta, A, B, C, None, None, None, h0), (dy, dh_last), False
            )
            return du, ddelta, dA, dB, dC, dh0, None
        l_max, t = ctx.chunk_size, u.size(1)
        At = A.t().contiguous()  # (n, d)
        du, ddelta = torch.empty_like(u), torch.empty_like(delta)
        dB, dC = torch.empty_like(B), torch.empty_like(C)
        dAt = torch.zeros_like(At)  # (n, d)
        # ∂L/∂h after the chunk, (b, n, d)
        g = torch.zeros_like(boundary[:, 0]) if dh_last is None else dh_last.transpose(1, 2).contiguous()
        carry = torch.empty_like(g)  # g's storage inside the loops (no allocation per position)
        if dy is None:
            dy = torch.zeros_like(u)
        for k in range(boundary.size(1) - 1, -1, -1):
            s, e = k * l_max, min((k + 1) * l_max, t)
            uc, dc, Bc, Cc, dyc = u[:, s:e], delta[:, s:e], B[:, s:e], C[:, s:e], dy[:, s:e]
            h0 = boundary[:, k]
            dAbar, H = _ChunkedScan._chunk_states(uc, dc, At, Bc, h0)
            dC[:, s:e] = (H @ dyc[..., None]).squeeze(-1)  # Σ_d h_i dy_i: (b, l, n, d) x (b, l, d, 1)
            # adjoint recurrence, backwards through the chunk: G_i = ∂L/∂h_i = C_i dy_i + Ā_{i+1} G_{i+1}
            G = Cc[..., None] * dyc[:, :, None, :]  # (b, l, n, 1) * (b, l, 1, d) -> (b, l, n, d)
            for i in range(e - s - 1, -1, -1):
                torch.add(G[:, i], g, out=G[:, i])  # G_i = C_i dy_i + (Ā_{i+1} G_{i+1}, carried in g)
                g = torch.mul(dAbar[:, i], G[:, i], out=carry)  # what flows to h_{i-1}
            GB = (Bc[:, :, None, :] @ G).squeeze(2)  # ⟨B_i, G_i⟩ = ∂L/∂(Δ_i u_i): (b, l, 1, n) x (b, l, n, d)
            # Σ_d G_i Δ_i u_i: (b, l, n, d) x (b, l, d, 1)
            dB[:, s:e] = (G @ (dc * uc)[..., None]).squeeze(-1)
            # ∂L/∂(Δ_i A) = G_i ⊙ h_{i-1} ⊙ Ā_i, in G's buffer (G is not needed after this)
            dlog = G.mul_(dAbar)
            dlog[:, 1:].mul_(H[:, :-1])  # h_{i-1} is the chunk's own previous state ...
            dlog[:, 0].mul_(h0)  # ... or, for the first position, the state entering the chunk
            ddelta[:, s:e] = (dlog * At).sum(2) + GB * uc  # Σ_n ∂L/∂(Δ A) A + ⟨G, B⟩ u
            du[:, s:e] = GB * dc
            dAt += dlog.mul_(dc[:, :, None, :]).sum((0, 1))  # Σ_{b,i} ∂L/∂(Δ_i A) Δ_i: (n, d)
        return du, ddelta, dAt.t(), dB, dC, g.transpose(1, 2), None


def auto_chunk_size(b: int, n: int, d: int, budget: int = 3 << 17) -> int:
    """The largest of 8, 16, 32, 64 positions whose chunk buffer (b, l, n, d) holds at most ``budget`` floats.

    Short chunks cost Python steps, long ones fall out of the cache. Measured fwd+bwd on CPU (one and two
    threads), the fastest chunk kept its buffers near 250k-500k floats: 8 at the lab's training sizes
    (b 32, d 120, n 16) and at benchmarks/bench_mamba.py's (b 16 and 8, d 512), 16 at b 8 or 4 with d 120-256,
    32-64 for a single long sequence; a fixed 32 (the earlier default) was 1.3-1.4x slower where 8 wins, a
    fixed 8 up to 1.25x slower for one sequence.
    """
    size = 8
    while size < 64 and 2 * size * b * n * d <= budget:
        size *= 2
    return size


def selective_scan(
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
    impl: Literal["auto", "kernel", "triton", "chunked"] = "auto",
):
    r"""The selective scan, fast, with a memory-light custom backward. Same contract as ``selective_scan_ref``.

    ``impl``: "auto" runs the C++ kernel where it takes the inputs (CPU, built), the Triton kernels on CUDA
    tensors where Triton is installed, and the chunked PyTorch scan otherwise; "kernel", "triton" or "chunked"
    forces one (for comparisons). ``chunk_size`` is the number of positions
    between the states kept for backward (one per chunk); in the chunked scan it also trades Python steps
    against the size of one chunk's buffers (b, chunk_size, n, d). None picks the kernel's default or
    :func:`auto_chunk_size`. The backward's derivation: docs/scan.md.
    """
    args = (u, delta, A, B, C, D, z, delta_bias)
    if impl not in ("auto", "kernel", "triton", "chunked"):
        raise ValueError(f"impl must be 'auto', 'kernel', 'triton' or 'chunked', got {impl!r}")
    if impl != "chunked":
        check_scan_shapes(u, delta, A, B, C, initial_state, D=D, z=z, delta_bias=delta_bias)
    rest = (delta_softplus, initial_state, return_last_state, chunk_size)
    if impl in ("auto", "triton") and (u.device.type != "cpu" or impl == "triton"):
        full = (u, delta, _per_state(A, B), *args[3:])  # Triton's scan takes A (d, n) only
        if (reason := why_not_triton(*full, initial_state)) is None:
            return selective_scan_triton(*full, *rest)
        if impl == "triton":
            raise RuntimeError(f"selective_scan(impl='triton'): {reason}")
    if impl in ("auto", "kernel"):
        if (reason := why_not_kernel(*args, initial_state)) is None:
            return selective_scan_kernel(*args, *rest)
        if impl == "kernel":
            raise RuntimeError(f"selective_scan(impl='kernel'): {reason}")
    dtype = u.dtype
    u, delta, A, B, C, h0 = _widened(
        u, delta, A, B, C, delta_bias, delta_softplus, initial_state, D=D, z=z, owner="selective_scan"
    )
    A = _per_state(A, B)
    if chunk_size is None:
        chunk_size = auto_chunk_size(u.size(0), B.size(-1), u.size(2))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    b, t, d = u.shape
    if t == 0:
        y, h = u.new_zeros(b, 0, d), h0
    else:
        y, h = _ChunkedScan.apply(u, delta, A, B, C, h0, chunk_size)
    y = _finish(y, u, D, z).to(dtype)
    return (y, h) if return_last_state else y
