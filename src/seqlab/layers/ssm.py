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

``S4D`` (Gu et al. 2022, arXiv 2206.11893) uses both views: ``forward`` builds K for the whole length and
applies it by FFT in O(t log t); ``step`` runs the recurrence in O(1) per token. ``Mamba`` (Gu & Dao 2023,
arXiv 2312.00752) makes Δ, B, C functions of the input ("selective"), which rules out the convolution: its
forward is the selective scan of ``seqlab.layers.scan``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.scan import selective_scan, selective_scan_ref

__all__ = ["S4D", "Mamba", "discretize", "discretize_bilinear", "discretize_zoh"]


def discretize_zoh(A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Zero-order hold for diagonal A: Ā = exp(Δ A), B̄ = (exp(Δ A) - 1) / A · B. Real or complex; broadcasts.

    A must have no zero entries (S4D and Mamba keep Re(A) < 0).
    """
    dA = dt * A
    return torch.exp(dA), torch.expm1(dA) / A * B


def discretize_bilinear(A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Bilinear (Tustin) for diagonal A: Ā = (1 + Δ A / 2) / (1 - Δ A / 2), B̄ = Δ B / (1 - Δ A / 2)."""
    half = dt * A / 2
    return (1 + half) / (1 - half), dt * B / (1 - half)


def discretize(A: Tensor, B: Tensor, dt: Tensor, method: Literal["zoh", "bilinear"] = "zoh"):
    if method == "zoh":
        return discretize_zoh(A, B, dt)
    if method == "bilinear":
        return discretize_bilinear(A, B, dt)
    raise ValueError(f"discretization must be 'zoh' or 'bilinear', got {method!r}")


def _wide(p: Tensor) -> Tensor:
    """float32 for half-precision tensors (the scan's numerics), unchanged otherwise."""
    return p.to(torch.promote_types(p.dtype, torch.float32))


def _log_uniform(size: int, lo: float, hi: float, **kw) -> Tensor:
    return torch.exp(torch.rand(size, **kw) * (math.log(hi) - math.log(lo)) + math.log(lo))


class S4D(nn.Module):
    r"""Diagonal linear time-invariant SSM block (S4D, Gu et al. 2022, arXiv 2206.11893), one SSM per channel.

        y = GLU(W · GELU(SSM(u) + D ⊙ u)),    SSM(u)_k = Σ_{j≤k} K_{k-j} u_j,   K_i = 2 Re(Σ_n C_n Ā_n^i B̄_n)

    Shapes: x (b, t, d) -> y (b, t, d); state (b, d, n/2) complex, the SSM state after the last position.

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
    """

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
    ):
        super().__init__()
        if d_state < 2 or d_state % 2:
            raise ValueError(f"S4D needs an even d_state >= 2 (conjugate pairs), got {d_state}")
        if discretization not in ("zoh", "bilinear"):
            raise ValueError(f"discretization must be 'zoh' or 'bilinear', got {discretization!r}")
        if init not in ("lin", "inv"):
            raise ValueError(f"init must be 'lin' or 'inv', got {init!r}")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.discretization, self.init = d_model, d_state, discretization, init
        self.dt_min, self.dt_max = dt_min, dt_max
        m = d_state // 2  # complex modes per channel
        self.log_dt = nn.Parameter(torch.empty(d_model, **kw))
        self.A_log_re = nn.Parameter(torch.empty(d_model, m, **kw))  # Re(A) = -exp(A_log_re)
        self.A_im = nn.Parameter(torch.empty(d_model, m, **kw))
        self.C = nn.Parameter(torch.empty(d_model, m, 2, **kw))  # (re, im) of C
        self.D = nn.Parameter(torch.empty(d_model, **kw))
        for p in (self.log_dt, self.A_log_re, self.A_im):
            p._no_weight_decay = (
                True  # the time scales: trained, but not pulled to zero (see optim.param_groups)
            )
        self.drop = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d_model, 2 * d_model, **kw)  # then GLU: (b, t, 2d) -> (b, t, d)
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
        """log Ā, Ā, B̄ and C, each (d, n/2) complex."""
        A = torch.complex(-torch.exp(self.A_log_re), self.A_im)  # (d, m)
        dt = torch.exp(self.log_dt)[:, None]  # (d, 1)
        dA, dB = discretize(A, torch.ones_like(A), dt, self.discretization)
        log_dA = dt * A if self.discretization == "zoh" else torch.log(dA)
        return log_dA, dA, dB, torch.view_as_complex(self.C)

    def init_state(self, batch_size: int) -> Tensor:
        dt = torch.complex(self.D, self.D).dtype  # complex dtype matching the parameters
        return torch.zeros(batch_size, self.d_model, self.d_state // 2, dtype=dt, device=self.D.device)

    def _output(self, y: Tensor) -> Tensor:
        y = self.drop(F.gelu(y))
        return F.glu(self.out_proj(y), dim=-1)  # (b, t, d) -> (b, t, 2d) -> (b, t, d)

    def ssm_conv(self, u: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The SSM alone, convolution view: u (b, t, d) -> SSM(u) + D u (b, t, d), new state (b, d, n/2)."""
        t = u.size(1)
        log_dA, _, dB, C = self._discrete()
        # Vandermonde: P[:, :, k] = Ā^k for k = 0..t, (d, m, t + 1)
        P = torch.exp(log_dA[..., None] * torch.arange(t + 1, device=u.device, dtype=u.dtype))
        K = 2 * torch.einsum("dm,dmk->dk", C * dB, P[..., :t]).real  # K_k = 2 Re(Σ C B̄ Ā^k): (d, t)
        u_dt = u.transpose(1, 2)  # (b, d, t)
        nfft = 2 * t  # zero padding to 2t turns the FFT's circular convolution into a causal linear one
        y = torch.fft.irfft(torch.fft.rfft(u_dt, n=nfft) * torch.fft.rfft(K, n=nfft), n=nfft)[..., :t]
        # new state x_{t-1} = Ā^t x_{-1} + Σ_j Ā^{t-1-j} B̄ u_j: (b, d, t) x (d, m, t) -> (b, d, m)
        new = torch.einsum("bdt,dmt->bdm", u_dt.to(dB.dtype), dB[..., None] * P[..., :t].flip(-1))
        if state is not None:
            # carried state: y_k += 2 Re(Σ C Ā^{k+1} x_{-1}), (d, m) x (b, d, m) x (d, m, t) -> (b, d, t)
            y = y + 2 * torch.einsum("dm,bdm,dmk->bdk", C, state, P[..., 1:]).real
            new = new + P[..., t] * state
        y = y.transpose(1, 2) + u * self.D  # (b, t, d)
        return y, new

    def forward(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x (b, t, d) -> y (b, t, d), state (b, d, n/2) complex."""
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"S4D expects x of shape (b, t, {self.d_model}), got {tuple(x.shape)}")
        y, state = self.ssm_conv(x, state)
        return self._output(y), state

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (b, d) -> y_t (b, d): x_k = Ā x_{k-1} + B̄ u_k, y_k = 2 Re(C x_k) + D u_k, then the output."""
        _, dA, dB, C = self._discrete()
        state = dA * state + dB * x_t[..., None]  # (d, m) * (b, d, m) + (d, m) * (b, d, 1)
        y = 2 * torch.einsum("dm,bdm->bd", C, state).real + self.D * x_t
        return self._output(y), state

    def extra_repr(self) -> str:
        s = f"{self.d_model}, d_state={self.d_state}"
        return s + f", discretization={self.discretization!r}, init={self.init!r}"


class Mamba(nn.Module):
    r"""The Mamba block (Gu & Dao 2023, arXiv 2312.00752, Figure 3 and Algorithm 2) as a token mixer.

        x, z = in_proj(u)                             # (b, t, d) -> 2 x (b, t, d_inner), d_inner = expand·d
        x = silu(causal_depthwise_conv1d(x))          # kernel d_conv, per channel
        Δ, B, C = x_proj(x)                           # (b, t, dt_rank + 2n): Δ low-rank, B, C (b, t, n)
        Δ = softplus(dt_proj(Δ))                      # (b, t, d_inner), bias = Δ's "prior"
        y = selective_scan(x, Δ, A, B, C, D) ⊙ silu(z)   with A = -exp(A_log)  (d_inner, n)
        out = out_proj(y)                             # (b, t, d)

    Parameter names and shapes equal Hugging Face's ``MambaMixer`` (in_proj, conv1d, x_proj, dt_proj, A_log,
    D, out_proj), so a checkpoint converts by renaming the block prefix only.

    Initialization (Section 3.6 and the reference code): A_log[i, j] = log(j + 1) (S4D-Real: A = -(1..n)),
    D = 1,
    dt_proj.weight ~ U(±dt_rank^-1/2); dt_proj.bias = softplus⁻¹(Δ₀) with Δ₀ log-uniform in [dt_min, dt_max],
    floored at dt_init_floor, so that Δ starts in a useful range of time scales whatever the input.
    A_log and D are meant to be trained without weight decay (``_no_weight_decay`` marks them).

    State: (conv_state (b, d_inner, d_conv), the last d_conv conv inputs, oldest first; ssm_state
    (b, d_inner, n)). ``step`` costs O(1) time and memory per token.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int | None = None,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_init_floor: float = 1e-4,
        bias: bool = False,
        conv_bias: bool = True,
        chunk_size: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = di = expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if dt_rank is None else dt_rank
        self.dt_min, self.dt_max, self.dt_init_floor = dt_min, dt_max, dt_init_floor
        self.chunk_size = chunk_size
        self.use_ref = False
        """Run the reference (loop) scan instead of the chunked one; for tests and teaching."""
        self.in_proj = nn.Linear(d_model, 2 * di, bias=bias, **kw)
        self.conv1d = nn.Conv1d(di, di, d_conv, groups=di, padding=d_conv - 1, bias=conv_bias, **kw)
        self.x_proj = nn.Linear(di, self.dt_rank + 2 * d_state, bias=False, **kw)
        self.dt_proj = nn.Linear(self.dt_rank, di, bias=True, **kw)
        self.A_log = nn.Parameter(torch.empty(di, d_state, **kw))
        self.D = nn.Parameter(torch.empty(di, **kw))
        self.A_log._no_weight_decay = True
        self.D._no_weight_decay = True
        self.out_proj = nn.Linear(di, d_model, bias=bias, **kw)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        kw = {"device": self.D.device, "dtype": self.D.dtype}
        for m in (self.in_proj, self.conv1d, self.x_proj, self.out_proj):
            m.reset_parameters()
        self.A_log.copy_(torch.log(torch.arange(1, self.d_state + 1, **kw)).expand(self.d_inner, -1))
        self.D.fill_(1.0)
        nn.init.uniform_(self.dt_proj.weight, -(self.dt_rank**-0.5), self.dt_rank**-0.5)
        dt = _log_uniform(self.d_inner, self.dt_min, self.dt_max, **kw).clamp(min=self.dt_init_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(Δ) = Δ + log(1 - e^-Δ)

    def init_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        kw = {"device": self.D.device, "dtype": self.D.dtype}
        return (
            torch.zeros(batch_size, self.d_inner, self.d_conv, **kw),
            torch.zeros(batch_size, self.d_inner, self.d_state, **kw),
        )

    def _ssm_inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (..., d_inner) -> Δ before bias and softplus (..., d_inner), B and C (..., n)."""
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return F.linear(dt, self.dt_proj.weight), B, C  # the bias is added in float32 by the scan

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None):
        """x (b, t, d) -> y (b, t, d), (conv_state, ssm_state)."""
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"Mamba expects x of shape (b, t, {self.d_model}), got {tuple(x.shape)}")
        b = x.size(0)
        conv_state, ssm_state = self.init_state(b) if state is None else state
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (b, t, 2 d_inner) -> 2 x (b, t, d_inner)
        # causal depthwise conv: the previous d_conv - 1 inputs (zeros at the start) prefix the sequence
        xs_c = torch.cat([conv_state[..., 1:], xs.transpose(1, 2)], dim=-1)  # (b, d_inner, d_conv - 1 + t)
        new_conv = torch.cat([conv_state[..., :1], xs_c], dim=-1)[..., -self.d_conv :]  # last d_conv inputs
        w, bias = self.conv1d.weight, self.conv1d.bias  # (d_inner, 1, d_conv), (d_inner,)
        xs = F.silu(F.conv1d(xs_c, w, bias, groups=self.d_inner)).transpose(1, 2)  # (b, t, d_inner)
        delta, B, C = self._ssm_inputs(xs)
        A = -torch.exp(_wide(self.A_log))  # (d_inner, n)
        scan = selective_scan_ref if self.use_ref else selective_scan
        kwargs = {} if self.use_ref else {"chunk_size": self.chunk_size}
        y, ssm_state = scan(
            xs,
            delta,
            A,
            B,
            C,
            D=_wide(self.D),
            z=z,
            delta_bias=_wide(self.dt_proj.bias),
            delta_softplus=True,
            initial_state=ssm_state,
            return_last_state=True,
            **kwargs,
        )
        return self.out_proj(y), (new_conv, ssm_state.to(self.D.dtype))

    def step(self, x_t: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x_t (b, d) -> y_t (b, d): one position of the conv and of the recurrence, O(1) in the context."""
        conv_state, h = state
        xs, z = self.in_proj(x_t).chunk(2, dim=-1)  # 2 x (b, d_inner)
        conv_state = torch.cat([conv_state[..., 1:], xs[..., None]], dim=-1)  # (b, d_inner, d_conv)
        xs = torch.einsum("bik,ik->bi", conv_state, self.conv1d.weight[:, 0])  # depthwise conv, one output
        if self.conv1d.bias is not None:
            xs = xs + self.conv1d.bias
        xs = F.silu(xs)
        delta, B, C = self._ssm_inputs(xs)
        delta = F.softplus(delta + self.dt_proj.bias)  # (b, d_inner)
        A = -torch.exp(_wide(self.A_log))
        dA = torch.exp(delta[..., None] * A)  # Ā = exp(Δ A): (b, d_inner, n)
        h = dA * h + (delta * xs)[..., None] * B[:, None, :]  # h = Ā h + Δ x B
        y = torch.einsum("bin,bn->bi", h, C) + self.D * xs  # ⟨h, C⟩ + D x
        y = y * F.silu(z)
        return self.out_proj(y), (conv_state, h)

    def extra_repr(self) -> str:
        return (
            f"{self.d_model}, d_inner={self.d_inner}, d_state={self.d_state}, d_conv={self.d_conv}, "
            f"dt_rank={self.dt_rank}"
        )


@dataclass
class S4DMixerConfig:
    d_state: int = 16
    """Real state size per channel (d_state / 2 complex modes); the layer's own default is 64."""
    discretization: Literal["zoh", "bilinear"] = "zoh"
    init: Literal["lin", "inv"] = "lin"


@dataclass
class MambaMixerConfig:
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None
    """Rank of the Δ projection; None means ceil(d_model / 16), as in the paper."""


register_mixer(
    MixerSpec(
        name="s4d",
        config=S4DMixerConfig,
        build=lambda d, c, *, dropout, device=None, dtype=None: S4D(
            d, c.d_state, c.discretization, c.init, dropout=dropout, device=device, dtype=dtype
        ),
        family="SSM",
        summary="diagonal LTI state-space model, convolution and recurrent views (Gu et al. 2022)",
        step_cost=1.7,
    )
)
register_mixer(
    MixerSpec(
        name="mamba",
        config=MambaMixerConfig,
        build=lambda d, c, *, dropout, device=None, dtype=None: Mamba(
            d, c.d_state, c.d_conv, c.expand, dt_rank=c.dt_rank, device=device, dtype=dtype
        ),
        family="SSM",
        summary="selective SSM with input-dependent Δ, B, C and a gated block (Gu & Dao 2023)",
        # its block has its own gated expansion in place of the MLP (the paper, MambaForCausalLM); with an
        # MLP at the same budget it was too narrow to learn induction heads in the lab's steps (chance after
        # 800 steps, against 92% at 4x the training length without it)
        channel_mlp=False,
        step_cost=5.6,
    )
)
