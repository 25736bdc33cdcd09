r"""Mamba-2's sequence transformation, the state-space dual (SSD) layer (Dao & Gu 2024, arXiv 2405.21060), in
three forms that give the same numbers.

Notation: ``b`` batch, ``t`` time, ``h`` heads, ``p`` channels per head, ``n`` state size, ``g`` groups of heads
that share B and C (head i reads group i // (h / g)), ``q`` positions per chunk.

SSD is a selective SSM whose state matrix is a scalar times the identity for each head (the paper's Sections 3
and 7: a_t = exp(Δ_t A) with one A < 0 per head):

    a_t = exp(Δ_t A)                          (b, h)           Δ_t > 0 per head and position
    H_t = a_t H_{t-1} + (Δ_t x_t) ⊗ B_t        (b, h, p, n)     H_{-1} = the initial state (zeros)
    y_t = H_t C_t + D x_t                      (b, h, p)

Unrolled, y = M (Δ x) + D x with one (t, t) matrix per head (the SSM as a structured matrix, Section 3; its
dual, Section 5):

    M[s, r] = ⟨C_s, B_r⟩ · exp(Σ_{k=r+1..s} Δ_k A)   for r ≤ s, 0 above the diagonal

a causal attention matrix (scores C Bᵀ, no softmax) masked by a decay: the quadratic, attention-like form of
the same recurrence. The three forms:

- :func:`ssd_ref`: the recurrence, one position at a time (the reference; float64 tests hold the others to it).
- :func:`ssd_chunked`: the paper's block decomposition (Section 6): in each chunk of q positions the
  quadratic form (matrix products); across chunks the recurrence, carried by each chunk's final state. O(t q)
  work in products, what GPUs' matrix units want.
- :func:`ssd_scan`: the selective scan of ``seqlab.layers.scan`` (Mamba's fused kernel on the CPU, Triton on a
  GPU), which SSD is with A and Δ the same for a head's p channels and its n states: the fast path of
  ``seqlab.layers.mamba2.Mamba2``. On this library's CPUs it is several times faster than the chunked form
  (``benchmarks/bench_mamba2.py``), whose small products run far from the matmul rate.

Δ comes in positive (after the block's softplus); a position with Δ = 0 leaves the state as it was (a = 1,
Δ x = 0), which is how padding holds it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.layers.scan import selective_scan

__all__ = ["ssd_chunked", "ssd_ref", "ssd_scan"]


def _check(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D, initial_state) -> None:
    """Shapes: x (b, t, h, p), dt (b, t, h), A (h,), B and C (b, t, g, n) with g dividing h, D (h,), the state
    (b, h, p, n); one floating dtype and device for all. A clear error before any product."""

    def shape(v) -> object:
        return tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__

    if not (isinstance(x, Tensor) and x.dim() == 4 and x.is_floating_point()):
        raise ValueError(f"SSD expects x (b, t, h, p) floating, got {shape(x)}")
    b, t, h, p = x.shape
    if not (isinstance(B, Tensor) and B.dim() == 4 and B.shape[:2] == (b, t)):
        raise ValueError(
            f"SSD: B must have shape (b, t, g, n) = ({b}, {t}, g, n) for x {tuple(x.shape)}, got {shape(B)}"
        )
    g, n = B.shape[2:]
    shapes = {
        "dt": (b, t, h),
        "A": (h,),
        "B": (b, t, g, n),
        "C": (b, t, g, n),
        "D": (h,),
        "initial_state": (b, h, p, n),
    }
    for name, v in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("initial_state", initial_state)):
        if v is None and name in ("D", "initial_state"):
            continue
        if not isinstance(v, Tensor) or tuple(v.shape) != shapes[name]:
            raise ValueError(
                f"SSD: {name} must have shape {shapes[name]} for x {tuple(x.shape)}, got {shape(v)}"
            )
        if v.dtype != x.dtype or v.device != x.device:
            raise ValueError(
                f"SSD: {name} is {v.dtype} on {v.device} but x is {x.dtype} on {x.device}; give every input "
                "x's dtype and device"
            )
    if h % g:
        raise ValueError(f"SSD: the {g} groups of B and C must divide the {h} heads")


def _per_head(M: Tensor, h: int) -> Tensor:
    """B or C (b, t, g, n) -> (b, t, h, n): head i reads group i // (h / g)."""
    return M.repeat_interleave(h // M.size(2), dim=2)


def ssd_ref(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The SSD recurrence, one position at a time: y (b, t, h, p), the final state H (b, h, p, n)."""
    _check(x, dt, A, B, C, D, initial_state)
    b, t, h, p = x.shape
    Bh, Ch = _per_head(B, h), _per_head(C, h)  # (b, t, h, n)
    H = x.new_zeros(b, h, p, B.size(-1)) if initial_state is None else initial_state
    ys = []
    for i in range(t):
        a = torch.exp(dt[:, i] * A)  # (b, h)
        dx = dt[:, i, :, None] * x[:, i]  # Δ x: (b, h, p)
        H = a[..., None, None] * H + dx[..., None] * Bh[:, i, :, None, :]  # (b, h, p, n)
        ys.append(H @ Ch[:, i, :, :, None])  # (b, h, p, n) x (b, h, n, 1) -> (b, h, p, 1)
    y = torch.stack(ys, dim=1).squeeze(-1)  # (b, t, h, p)
    if D is not None:
        y = y + D[:, None] * x
    return y, H


def _segment_sums(a: Tensor) -> Tensor:
    """a (..., q) -> S (..., q, q) with S[s, r] = a_{r+1} + ... + a_s for r ≤ s and -inf above the diagonal, so
    that exp(S) is the decay from position r to s. Each S[s, r] is its own sum of the a's between (a masked
    cumulative sum), not a difference of two running sums, which would cancel digits on long decays."""
    q = a.size(-1)
    strict = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)  # r < s
    terms = a[..., :, None].expand(*a.shape, q).masked_fill(~strict, 0.0)  # terms[k, r] = a_k for k > r
    sums = terms.cumsum(dim=-2)  # sums[s, r] = Σ_{r < k ≤ s} a_k
    return sums.masked_fill(~torch.ones(q, q, dtype=torch.bool, device=a.device).tril(), float("-inf"))


def ssd_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """SSD by the block decomposition of M (the paper's Section 6): y (b, t, h, p), the final state (b, h, p, n).

    In chunk c (positions q c ... q c + q - 1), with la = Δ A and its running sum cs within the chunk:
      1. diagonal block, the quadratic form:  Y_in = (C Bᵀ ⊙ exp(segment sums of la)) (Δ x)
      2. the chunk's own final state:        S_c = Σ_r exp(cs_last - cs_r) (Δ x)_r ⊗ B_r
      3. the states entering each chunk:     H_c = exp(cs_last of c - 1) H_{c-1} + S_{c-1}, as one product with
                                             the (chunks + 1)² decay matrix of the chunk totals
      4. what they add to the outputs:       Y_off = exp(cs_s) C_s H_c
    A length that is not a multiple of q is padded with Δ = 0 (the state is held), then cut.
    """
    _check(x, dt, A, B, C, D, initial_state)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"ssd_chunked: chunk_size must be a positive integer, got {chunk_size!r}")
    b, t, h, p = x.shape
    n, q = B.size(-1), chunk_size
    nc = -(-t // q)  # chunks
    pad = nc * q - t
    Bh, Ch = _per_head(B, h), _per_head(C, h)
    la, dx = dt * A, dt[..., None] * x  # Δ A (b, t, h), Δ x (b, t, h, p)
    if pad:
        la, dx, Bh, Ch = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (la, dx, Bh, Ch))
    la = la.view(b, nc, q, h).permute(0, 3, 1, 2)  # (b, h, c, q)
    dx = dx.view(b, nc, q, h, p).permute(0, 3, 1, 2, 4)  # (b, h, c, q, p)
    Bh, Ch = (v.view(b, nc, q, h, n).permute(0, 3, 1, 2, 4) for v in (Bh, Ch))  # (b, h, c, q, n)
    cs = la.cumsum(dim=-1)  # (b, h, c, q)
    # 1. within chunks: (b, h, c, q, n) x (b, h, c, n, q) -> scores (b, h, c, q, q), masked by the decays
    scores = (Ch @ Bh.transpose(-1, -2)) * torch.exp(_segment_sums(la))
    y = scores @ dx  # (b, h, c, q, q) x (b, h, c, q, p) -> (b, h, c, q, p)
    # 2. each chunk's final state from its own inputs: (b, h, c, n, q) x (b, h, c, q, p) -> (b, h, c, n, p)
    to_end = torch.exp(cs[..., -1:] - cs)  # decay from each position to the chunk's end (b, h, c, q)
    S = (Bh * to_end[..., None]).transpose(-1, -2) @ dx
    # 3. the states entering chunks 0 .. nc (the last one is the final state), kept as (n, p)
    H0 = x.new_zeros(b, h, 1, n, p) if initial_state is None else initial_state.transpose(-1, -2)[:, :, None]
    carried = torch.exp(_segment_sums(F.pad(cs[..., -1], (1, 0))))  # (b, h, c + 1, c + 1)
    H = (carried @ torch.cat([H0, S], dim=2).flatten(-2)).view(b, h, nc + 1, n, p)
    # 4. what the entering states add: (b, h, c, q, n) x (b, h, c, n, p) -> (b, h, c, q, p), decayed to each s
    y = y + (Ch @ H[:, :, :-1]) * torch.exp(cs)[..., None]
    y = y.permute(0, 2, 3, 1, 4).reshape(b, nc * q, h, p)[:, :t]  # (b, t, h, p)
    if D is not None:
        y = y + D[:, None] * x
    return y, H[:, :, -1].transpose(-1, -2)


def ssd_scan(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """SSD as Mamba's selective scan (fused kernels, custom backward): y (b, t, h, p), the final state (b, h, p, n).

    The h p channels become the scan's d channels (channel i p + j is head i's j-th): Δ, A and D repeat over a
    head's p channels, A given as (h p, 1), one value for all n states (the C++ kernel then takes one exp per
    channel and position, not n); each group of heads is one scan with its B and C. Gradients flow back
    through the repeats (autograd sums them)."""
    _check(x, dt, A, B, C, D, initial_state)
    b, t, h, p = x.shape
    g, n = B.size(2), B.size(-1)
    hg = h // g  # heads per group
    u = x.reshape(b, t, h * p)
    delta = dt.repeat_interleave(p, dim=-1)  # (b, t, h p): head i's Δ for each of its p channels
    A_full = A.repeat_interleave(p)[:, None]  # (h p, 1): the scan's one A for all n states of a channel
    D_full = None if D is None else D.repeat_interleave(p)
    H0 = None if initial_state is None else initial_state.reshape(b, h * p, n)
    ys, Hs = [], []
    for j in range(g):  # one scan per group: its hg p channels, its B and C
        c = slice(j * hg * p, (j + 1) * hg * p)
        # one group: squeeze, whose backward is a view (select's fills a zero (b, t, 1, n) tensor and copies into it)
        Bj, Cj = (B.squeeze(2), C.squeeze(2)) if g == 1 else (B[:, :, j], C[:, :, j])
        y, H = selective_scan(
            u[..., c].contiguous() if g > 1 else u,
            delta[..., c].contiguous() if g > 1 else delta,
            A_full[c],
            Bj.contiguous(),
            Cj.contiguous(),
            D=None if D_full is None else D_full[c],
            initial_state=None if H0 is None else H0[:, c].contiguous(),
            return_last_state=True,
        )
        ys.append(y)
        Hs.append(H)
    y, H = (ys[0], Hs[0]) if g == 1 else (torch.cat(ys, dim=-1), torch.cat(Hs, dim=1))
    return y.view(b, t, h, p), H.view(b, h, p, n)
