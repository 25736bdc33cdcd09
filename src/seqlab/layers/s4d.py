r"""S4D: the diagonal linear time-invariant SSM block (Gu et al. 2022, arXiv 2206.11893), a token mixer with
two views of one SSM (the derivation is in ``seqlab.layers.ssm``'s docstring).

Notation: ``b`` batch, ``t`` time, ``d`` model width, ``m = n/2`` complex modes per channel.

    x_k = Ā x_{k-1} + B̄ u_k,   y_k = 2 Re(C x_k) + D u_k                       (recurrence, ``step``)
    y_k = Σ_{j≤k} K_{k-j} u_j + D u_k + 2 Re(C Ā^{k+1} x_{-1}),  K_i = 2 Re(C Ā^i B̄)   (convolution)

Two paths (``seqlab.layers.fastpath``): ``forward`` applies the convolution by FFT in O(t log t)
(:meth:`S4D.ssm_conv`); ``forward_ref`` (and ``fast_path=False``) runs the recurrence position by position
(:meth:`S4D.ssm_recurrent_ref`).

Padding: ``mask`` (b, t), True at real positions, padding on the right. Padded inputs are zeroed, which leaves
the outputs at real positions alone (the SSM is causal); the returned state is each row's state after its
last real position, len_i of them:

    x_new,i = Σ_{j < len_i} Ā^{len_i - 1 - j} B̄ u_j + Ā^{len_i} x_{-1}

The convolution view computes the sum for all rows at once by right-aligning each row's real inputs (a
gather), so that its last real input sits at position t - 1, where the unpadded formula reads the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.activations import gelu
from seqlab.layers.checks import check_batch_size, check_input, check_state
from seqlab.layers.discretization import _log_uniform, discretize
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.linear import Linear
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.validation import check_choices, check_dropout, check_positive_floats, check_positive_ints

__all__ = ["S4D"]


def _complex(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype whose parts are ``dtype`` (float32 -> complex64; float16 and bfloat16, which torch has
    no complex arithmetic for, -> complex64 too), or ``dtype`` if already complex."""
    return dtype if dtype.is_complex else _wide(dtype).to_complex()


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The real dtype the SSM computes in: float32 for half-precision parameters or inputs, else the same."""
    return torch.promote_types(dtype, torch.float32)


def _powers(log_a: Tensor, n: int) -> Tensor:
    """Ā^k = exp(k log Ā) for k = 0..n-1: (d, m) complex -> (d, m, n), as exp(bB log Ā) exp(i log Ā) for k = bB + i,
    B about √n: 2√n complex exps and n products instead of n exps. torch's complex exp is scalar code (7 ms for
    the lab's (48, 8, 1025) on the AMD EPYC); this ran 3.5x faster forward + backward there, with the same float32
    error against float64 truth (about 6e-5 in Ā^k at k ~ 1000, where the phase k·Im(log Ā) itself rounds)."""
    block = max(1, math.isqrt(n))
    rows = -(-n // block)  # ⌈n / B⌉
    steps = torch.arange(block, device=log_a.device, dtype=log_a.real.dtype)
    low = torch.exp(log_a[..., None] * steps)  # Ā^i, i < B: (d, m, B)
    high = torch.exp(log_a[..., None] * (block * torch.arange(rows, device=log_a.device, dtype=steps.dtype)))
    return (high[..., :, None] * low[..., None, :]).flatten(-2)[..., :n]  # (d, m, rows, B) -> (d, m, n)


def _check_args(m: S4D) -> None:
    """The constructor's arguments, validated once they are attributes (``seqlab.validation``)."""
    check_positive_ints(m, ("d_model", "d_state"), prefix="S4D: ")
    if m.d_state < 2 or m.d_state % 2:
        raise ValueError(f"S4D needs an even d_state >= 2 (conjugate pairs), got {m.d_state}")
    if m.discretization not in ("zoh", "bilinear"):
        raise ValueError(f"discretization must be 'zoh' or 'bilinear', got {m.discretization!r}")
    if m.init not in ("lin", "inv"):
        raise ValueError(f"init must be 'lin' or 'inv', got {m.init!r}")
    check_positive_floats(m, ("dt_min", "dt_max"), prefix="S4D: ")
    if m.dt_min > m.dt_max:
        raise ValueError(f"S4D: dt_min={m.dt_min} must not exceed dt_max={m.dt_max}")


class S4D(FastPathMixin, nn.Module):
    r"""Diagonal linear time-invariant SSM block (S4D, Gu et al. 2022, arXiv 2206.11893), one SSM per channel.

        y = GLU(W · GELU(SSM(u) + D ⊙ u)),    SSM(u)_k = Σ_{j≤k} K_{k-j} u_j,   K_i = 2 Re(Σ_n C_n Ā_n^i B̄_n)

    Shapes: x (b, t, d) -> y (b, t, d); state (b, d, n/2) complex, the SSM state after the last (real)
    position; ``mask`` (b, t) boolean, True at real positions, padding on the right (module docstring).

    Choices, each as in the paper's reference S4D block unless said:

    * Complex diagonal A with conjugate symmetry: n real state dimensions are n/2 complex modes a_j and their
      conjugates, so K = 2 Re(...) over n/2 modes. Complex rather than S4D-Real because the imaginary parts
      give each channel a bank of oscillators at different frequencies, which is what the paper credits for
      S4D-Lin/Inv beating S4D-Real on long-range tasks; the real-valued Mamba uses S4D-Real instead.
    * Init ``"lin"`` (S4D-Lin): a_j = -1/2 + iπj; ``"inv"`` (S4D-Inv): a_j = -1/2 + i (n/π)(n/(2j+1) - 1).
      Re(a) is stored as log(-Re(a)) so it stays negative (stable) under training.
    * Δ per channel, learnable, log Δ initialized log-uniform in [dt_min, dt_max] = [1e-3, 1e-1].
    * B is fixed to 1 and C ~ CN(0, 1) is learned: with diagonal A only the product C ⊙ B̄ matters.
    * D skip, then GELU and a position-wise linear d -> 2d with a GLU, the block of the paper's code.
      The paper trains A and Δ with a lower learning rate and no weight decay; that is the optimizer's job.

    ``forward`` uses the convolution view (FFT); with a carried state it adds the state's contribution
    C Ā^{k+1} x_{-1} and returns the new state, so chunked equals whole. ``step`` is the recurrence.

    Examples::

        >>> s4d = S4D(8, d_state=4)
        >>> y, state = s4d(torch.randn(2, 10, 8))
        >>> y.shape, state.shape, state.dtype
        (torch.Size([2, 10, 8]), torch.Size([2, 8, 2]), torch.complex64)
    """

    # the time scales: trained, but not pulled to zero by weight decay (seqlab.training.optim.param_groups)
    no_weight_decay = ("log_dt", "A_log_re", "A_im")

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        discretization: Literal["zoh", "bilinear"] = "zoh",
        init: Literal["lin", "inv"] = "lin",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dropout: float = 0.0,
        device=None,
        dtype=None,
        *,
        fast_path: bool = True,
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.discretization, self.init = d_model, d_state, discretization, init
        self.dt_min, self.dt_max, self.fast_path, self.dropout = dt_min, dt_max, fast_path, dropout
        _check_args(self)
        check_dropout(self, prefix="S4D: ")
        m = d_state // 2  # complex modes per channel
        self.log_dt = nn.Parameter(torch.empty(d_model, **kw))
        self.A_log_re = nn.Parameter(torch.empty(d_model, m, **kw))  # Re(A) = -exp(A_log_re)
        self.A_im = nn.Parameter(torch.empty(d_model, m, **kw))
        self.C = nn.Parameter(torch.empty(d_model, m, 2, **kw))  # (re, im) of C
        self.D = nn.Parameter(torch.empty(d_model, **kw))
        self.drop = nn.Dropout(dropout)
        self.out_proj = Linear(d_model, 2 * d_model, **kw)  # then GLU: (b, t, 2d) -> (b, t, d)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        m = self.d_state // 2
        kw = {"device": self.D.device, "dtype": self.D.dtype}
        j = torch.arange(m, **kw)
        self.log_dt.copy_(_log_uniform(self.d_model, self.dt_min, self.dt_max, **kw).log())
        self.A_log_re.fill_(math.log(0.5))
        n = self.d_state
        im = math.pi * j if self.init == "lin" else (n / math.pi) * (n / (2 * j + 1) - 1)
        self.A_im.copy_(im.expand(self.d_model, m))
        self.C.normal_(0.0, math.sqrt(0.5))  # complex normal, E|C|² = 1
        self.D.normal_()
        self.out_proj.reset_parameters()

    def _discrete(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """log Ā, Ā, B̄ and C, each (d, n/2) complex (complex64 for half-precision parameters)."""
        wide = _wide(self.D.dtype)
        A = torch.complex(-torch.exp(self.A_log_re.to(wide)), self.A_im.to(wide))  # (d, m)
        dt = torch.exp(self.log_dt.to(wide))[:, None]  # (d, 1)
        dA, dB = discretize(A, torch.ones_like(A), dt, self.discretization)
        log_dA = dt * A if self.discretization == "zoh" else torch.log(dA)
        return log_dA, dA, dB, torch.view_as_complex(self.C.to(wide))

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> Tensor:
        """Zeros (b, d, n/2), complex: ``dtype`` (real or complex) and ``device`` default to the parameters'."""
        check_batch_size("S4D", batch_size)
        dtype = _complex(dtype or self.D.dtype)
        return torch.zeros(
            batch_size, self.d_model, self.d_state // 2, dtype=dtype, device=device or self.D.device
        )

    def _output(self, y: Tensor, fast: bool = False) -> Tensor:
        y = self.drop(gelu(y) if fast else F.gelu(y))  # fast: seqlab's GELU kernel where it takes y
        return F.glu(self.out_proj(y), dim=-1)  # (b, t, d) -> (b, t, 2d) -> (b, t, d)

    def ssm_conv(
        self, u: Tensor, state: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The SSM alone, convolution view: u (b, t, d) -> SSM(u) + D u (b, t, d), new state (b, d, n/2).

        ``mask`` (b, t), validated, with u already zero at the padding: the state is each row's after its last
        real position.
        """
        t = u.size(1)
        log_dA, _, dB, C = self._discrete()
        # Vandermonde: P[:, :, k] = Ā^k for k = 0..t, (d, m, t + 1)
        P = _powers(log_dA, t + 1)
        K = 2 * torch.einsum("dm,dmk->dk", C * dB, P[..., :t]).real  # K_k = 2 Re(Σ C B̄ Ā^k): (d, t)
        u_dt = u.transpose(1, 2)  # (b, d, t)
        nfft = 2 * t  # zero padding to 2t turns the FFT's circular convolution into a causal linear one
        y = torch.fft.irfft(torch.fft.rfft(u_dt, n=nfft) * torch.fft.rfft(K, n=nfft), n=nfft)[..., :t]
        carry = P[..., t]  # Ā^t: (d, m), what the carried state is multiplied by
        if mask is not None:
            lengths = mask.sum(1)  # (b,)
            # right-align each row: u_r[j] = u[j - (t - len)]; the wrapped-around indices land on padding (0)
            idx = (torch.arange(t, device=u.device) - (t - lengths)[:, None]) % t  # (b, t)
            u_dt = u_dt.gather(2, idx[:, None, :].expand_as(u_dt))  # (b, d, t)
            carry = P[..., lengths].permute(2, 0, 1)  # Ā^{len_i}: (d, m, b) -> (b, d, m)
        # new state x_{t-1} = Σ_j Ā^{t-1-j} B̄ u_j (+ carry x_{-1}): (b, d, t) x (d, m, t) -> (b, d, m)
        new = torch.einsum("bdt,dmt->bdm", u_dt.to(dB.dtype), dB[..., None] * P[..., :t].flip(-1))
        if state is not None:
            # carried state: y_k += 2 Re(Σ C Ā^{k+1} x_{-1}), (d, m) x (b, d, m) x (d, m, t) -> (b, d, t)
            y = y + 2 * torch.einsum("dm,bdm,dmk->bdk", C, state, P[..., 1:]).real
            new = new + carry * state
        y = y.transpose(1, 2) + u * self.D  # (b, t, d)
        return y, new

    def ssm_recurrent_ref(
        self, u: Tensor, state: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The SSM alone, recurrent view, position by position; the same contract (and numbers, padded
        positions included: the padding's zero inputs run through the recurrence) as :meth:`ssm_conv`."""
        _, dA, dB, C = self._discrete()
        s = self.init_state(u.size(0), device=u.device, dtype=u.dtype) if state is None else state
        last, ys = s, []
        for k in range(u.size(1)):
            s = dA * s + dB * u[:, k, :, None]  # x_k = Ā x_{k-1} + B̄ u_k: (d, m) * (b, d, m) + (b, d, 1)
            last = s if mask is None else torch.where(mask[:, k, None, None], s, last)  # at the last real k
            ys.append(2 * torch.einsum("dm,bdm->bd", C, s).real)  # 2 Re(C x_k): (b, d)
        return torch.stack(ys, 1) + u * self.D, last  # (b, t, d)

    def _check_state(self, state: Tensor | None, x: Tensor) -> None:
        if state is not None:
            shape = (x.size(0), self.d_model, self.d_state // 2)
            check_state("S4D", state, {"": shape}, x, _complex(x.dtype))

    def _inputs(self, x: Tensor, state: Tensor | None, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        check_input("S4D", x, self.d_model, self.D)
        self._check_state(state, x)
        if mask is not None:
            mask = check_padding_mask(mask, x.size(0), x.size(1), x.device)
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)  # padded inputs (even NaN) enter neither y nor the state
        return x, mask

    def forward(
        self, x: Tensor, state: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (b, t, d) -> y (b, t, d), state (b, d, n/2) complex."""
        if not self._take_fast_path(x) or (isinstance(x, Tensor) and x.size(0) == 0):
            return self.forward_ref(x, state, mask)  # (an empty batch too: the FFT refuses one)
        x, mask = self._inputs(x, state, mask)
        y, state = self.ssm_conv(x.to(_wide(x.dtype)), state, mask)
        return self._output(y.to(x.dtype), fast=True), state

    def forward_ref(
        self, x: Tensor, state: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``forward`` through the recurrence (:meth:`ssm_recurrent_ref`), whatever ``fast_path`` says."""
        x, mask = self._inputs(x, state, mask)
        y, state = self.ssm_recurrent_ref(x.to(_wide(x.dtype)), state, mask)
        return self._output(y.to(x.dtype)), state

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x_t (b, d) -> y_t (b, d): x_k = Ā x_{k-1} + B̄ u_k, y_k = 2 Re(C x_k) + D u_k, then the output.
        ``state`` None starts from :meth:`init_state`."""
        check_input("S4D.step", x_t, self.d_model, self.D, step=True, what="x_t")
        if state is None:
            state = self.init_state(x_t.size(0), device=x_t.device, dtype=x_t.dtype)
        self._check_state(state, x_t)
        _, dA, dB, C = self._discrete()
        u = x_t.to(_wide(x_t.dtype))
        state = dA * state + dB * u[..., None]  # (d, m) * (b, d, m) + (d, m) * (b, d, 1)
        y = 2 * torch.einsum("dm,bdm->bd", C, state).real + self.D * u
        return self._output(y.to(x_t.dtype)), state

    def extra_repr(self) -> str:
        s = f"{self.d_model}, d_state={self.d_state}"
        s += f", discretization={self.discretization!r}, init={self.init!r}"
        return s + (", fast_path=False" if not self.fast_path else "")


@dataclass
class S4DMixerConfig:
    d_state: int = 16
    """Real state size per channel (d_state / 2 complex modes); the layer's own default is 64."""
    discretization: Literal["zoh", "bilinear"] = "zoh"
    init: Literal["lin", "inv"] = "lin"

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(self, ("d_state",))
        if self.d_state % 2:
            raise ValueError(f"d_state must be even (conjugate pairs of complex modes), got {self.d_state}")


def _build_s4d(d_model: int, c: S4DMixerConfig, *, dropout: float, device=None, dtype=None) -> S4D:
    return S4D(d_model, c.d_state, c.discretization, c.init, dropout=dropout, device=device, dtype=dtype)


register_mixer(
    MixerSpec(
        "s4d",
        S4DMixerConfig,
        _build_s4d,
        family="SSM",
        summary="diagonal LTI state-space model, convolution and recurrent views (Gu et al. 2022)",
        year=2022,
        step_cost=1.6,  # a lab run's training step: 1.56x the LSTM's (docs/adding-a-mixer.md, section 7)
    )
)
