r"""State-space token mixers: discretization, the diagonal LTI SSM (S4D) and Mamba's selective SSM.

Notation: ``b`` batch, ``t`` time, ``d`` model width, ``n`` SSM state size; ``A, B, C, D, Δ`` are the SSM's.

A continuous-time linear state-space model with a diagonal state matrix,

    x'(τ) = A x(τ) + B u(τ),     y(τ) = C x(τ) + D u(τ),      A = diag(a_1 … a_n),

sampled with step Δ becomes the recurrence  x_k = Ā x_{k-1} + B̄ u_k,  y_k = C x_k + D u_k,  with

    zero-order hold (u constant over a step): Ā = exp(Δ A), B̄ = (Δ A)⁻¹ (exp(Δ A) - I) Δ B = (Ā - 1) / a ⊙ B
    bilinear (Tustin, trapezoid rule):        Ā = (I - Δ/2 A)⁻¹ (I + Δ/2 A), B̄ = (I - Δ/2 A)⁻¹ Δ B

(diagonal A makes every inverse an elementwise division). When A, B, C, Δ do not depend on the input (LTI),
unrolling the recurrence from x_{-1} gives a convolution:

    y_k = Σ_{j≤k} K_{k-j} u_j + D u_k + C Ā^{k+1} x_{-1},     K_i = C Ā^i B̄       (the SSM kernel)

``S4D`` (Gu et al. 2022, arXiv 2206.11893, ``seqlab.layers.s4d``) uses both views: ``forward`` builds K for
the whole length and applies it by FFT in O(t log t); ``step`` and ``forward_ref`` run the recurrence.
``Mamba`` (Gu & Dao 2023, arXiv 2312.00752, ``seqlab.layers.mamba``) makes Δ, B, C functions of the input
("selective"), which rules out the convolution: its forward is the selective scan of ``seqlab.layers.scan``.
The discretizations live in ``seqlab.layers.discretization``; this module gathers all of them.

Both are token mixers (``seqlab.layers.mixer``) with a padding ``mask`` (b, t), True at real positions,
padding on the right, and the fast/reference switch of ``seqlab.layers.fastpath`` (``fast_path=``,
``forward_ref``, ``why_not_fast_path``). A padded position leaves the state as it was: its input is zeroed
(S4D; the returned state is then each row's after its last real position) or its step Δ is 0 (Mamba).
"""

from seqlab.layers.discretization import discretize, discretize_bilinear, discretize_zoh
from seqlab.layers.s4d import S4D

# isort: split
from seqlab.layers.mamba import Mamba  # after S4D: the registry lists "s4d" before "mamba", as it always has

__all__ = ["S4D", "Mamba", "discretize", "discretize_bilinear", "discretize_zoh"]
