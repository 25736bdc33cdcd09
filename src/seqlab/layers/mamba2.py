r"""Mamba-2: the SSD block (Dao & Gu 2024, arXiv 2405.21060, Section 7), a token mixer.

Notation: ``b`` batch, ``t`` time, ``d`` model width, ``d_inner = expand · d`` channels in ``h = d_inner / p``
heads of ``p = headdim`` channels, ``n`` state size, ``g`` groups of heads sharing B and C.

What changes from Mamba (``seqlab.layers.mamba``), all in the paper's Section 7: A is one scalar per head (SSD,
``seqlab.layers.ssd``), so the state can be wider (the paper: n = 64 to 256 against Mamba's 16); Δ, B and C
come from the block's input projection beside x and the gate, in parallel, instead of from x after the
convolution; B and C go through the convolution with x; a normalization (RMSNorm of y ⊙ silu(z)) before the
output projection, for stability at scale.

Two paths (``seqlab.layers.fastpath``): ``forward`` runs :func:`seqlab.layers.ssd.ssd_scan` (Mamba's fused
selective-scan kernel) and, on the CPU without a mask, the convolution's C++ kernel; ``forward_ref`` (and
``fast_path=False``) the recurrence :func:`seqlab.layers.ssd.ssd_ref` and torch's conv1d.

Padding: ``mask`` (b, t), True at real positions, padding on the right, as in Mamba: padded inputs and conv
inputs are zeros and Δ = 0 there, so the SSM state is held (exp(0 · A) = 1, Δ x = 0) and each row's outputs at
its real positions and its returned state equal those of the row run alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.gated_norm import gated_rms_norm, gated_rms_norm_ref
from seqlab.layers.checks import check_batch_size, check_input, check_state
from seqlab.layers.discretization import _log_uniform, _wide
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.linear import Linear, linear
from seqlab.layers.mamba import causal_conv, causal_conv_step
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.ssd import ssd_ref, ssd_scan
from seqlab.validation import check_positive_floats, check_positive_ints

__all__ = ["GatedRMSNorm", "Mamba2", "gated_rms_norm_ref"]


class GatedRMSNorm(nn.Module):
    """RMSNorm(y ⊙ silu(z)) · weight, over groups of ``group_size`` channels (Mamba-2's output norm, ``norm_before_gate
    = False`` in the paper's code), in float32 at least. y, z (..., d) -> (..., d). ``fast`` (default) runs
    :func:`seqlab.kernels.gated_norm.gated_rms_norm` (a C++ kernel each way, or torch ops with a backward of
    their own), False the ops of :func:`gated_rms_norm_ref`."""

    def __init__(self, d: int, group_size: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        if group_size < 1 or d % group_size:
            raise ValueError(f"GatedRMSNorm: group_size={group_size} must be positive and divide d={d}")
        self.group_size, self.eps = group_size, eps
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, y: Tensor, z: Tensor, fast: bool = True) -> Tensor:
        if fast:
            return gated_rms_norm(y, z, self.weight, self.group_size, self.eps)
        return gated_rms_norm_ref(y, z, self.weight, self.group_size, self.eps)


def _check_args(m: Mamba2) -> None:
    check_positive_ints(
        m, ("d_model", "d_state", "d_conv", "expand", "headdim", "n_groups"), prefix="Mamba2: "
    )
    check_positive_floats(m, ("dt_min", "dt_max", "dt_init_floor", "norm_eps"), prefix="Mamba2: ")
    if m.dt_min > m.dt_max:
        raise ValueError(f"Mamba2: dt_min={m.dt_min} must not exceed dt_max={m.dt_max}")
    di = m.expand * m.d_model
    if di % m.headdim or (di // m.headdim) % m.n_groups:
        raise ValueError(
            f"Mamba2: d_inner = expand * d_model = {di} must split into heads of headdim={m.headdim} channels, "
            f"their number a multiple of n_groups={m.n_groups}: give a d_model that is a multiple of "
            f"{width_multiple(m)}, or another headdim"
        )


def width_multiple(c) -> int:
    """The smallest step of d_model for which expand · d_model splits into heads of headdim in n_groups groups."""
    unit = c.headdim * c.n_groups  # d_inner must be a multiple of it
    return unit // gcd(unit, c.expand)


class Mamba2(FastPathMixin, nn.Module):
    r"""The Mamba-2 block (Dao & Gu 2024, arXiv 2405.21060, Section 7) as a token mixer.

        z, xBC, Δ = in_proj(u)                   # (b, t, d) -> d_inner, d_inner + 2 g n, h
        x, B, C = silu(causal_depthwise_conv1d(xBC))       # kernel d_conv, per channel
        Δ = softplus(Δ + dt_bias)                # (b, t, h), one step per head
        y = SSD(x, Δ, A, B, C) + D x             # A = -exp(A_log) (h,), D (h,): seqlab.layers.ssd
        out = out_proj(RMSNorm(y ⊙ silu(z)))     # the gated norm, per group of d_inner / g channels

    Parameter names and shapes equal Hugging Face's ``Mamba2Mixer`` (in_proj, conv1d, dt_bias, A_log, D,
    norm.weight, out_proj), so a checkpoint converts by renaming the block prefix only.

    Initialization (the paper's code): A = -U(1, 16) per head (A_log its log), D = 1, dt_bias = softplus⁻¹(Δ₀)
    with Δ₀ log-uniform in [dt_min, dt_max] floored at dt_init_floor; A_log, D and dt_bias are trained
    without weight decay (``no_weight_decay``).

    State: (conv_state (b, d_inner + 2 g n, d_conv), the last d_conv conv inputs, oldest first; ssm_state
    (b, h, p, n), Hugging Face's layout). ``step`` costs O(1) time and memory per token.

    Examples::

        >>> m = Mamba2(16, d_state=8, headdim=8)
        >>> y, (conv_state, ssm_state) = m(torch.randn(2, 10, 16))
        >>> y.shape, conv_state.shape, ssm_state.shape
        (torch.Size([2, 10, 16]), torch.Size([2, 48, 4]), torch.Size([2, 4, 8, 8]))
    """

    no_weight_decay = ("A_log", "D", "dt_bias")

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        d_conv: int = 4,
        expand: int = 2,
        headdim: int = 64,
        n_groups: int = 1,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_init_floor: float = 1e-4,
        norm_eps: float = 1e-5,
        bias: bool = False,
        conv_bias: bool = True,
        device=None,
        dtype=None,
        *,
        fast_path: bool = True,
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.headdim, self.n_groups, self.norm_eps = headdim, n_groups, norm_eps
        self.dt_min, self.dt_max, self.dt_init_floor, self.fast_path = (
            dt_min,
            dt_max,
            dt_init_floor,
            fast_path,
        )
        _check_args(self)
        self.d_inner = di = expand * d_model
        self.n_heads = h = di // headdim
        self.conv_dim = di + 2 * n_groups * d_state
        self.in_proj = Linear(d_model, di + self.conv_dim + h, bias=bias, **kw)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            d_conv,
            groups=self.conv_dim,
            padding=d_conv - 1,
            bias=conv_bias,
            **kw,
        )
        self.dt_bias = nn.Parameter(torch.empty(h, **kw))
        self.A_log = nn.Parameter(torch.empty(h, **kw))
        self.D = nn.Parameter(torch.empty(h, **kw))
        self.norm = GatedRMSNorm(di, di // n_groups, eps=norm_eps, **kw)
        self.out_proj = Linear(di, d_model, bias=bias, **kw)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        kw = {"device": self.D.device, "dtype": self.D.dtype}
        for m in (self.in_proj, self.conv1d, self.out_proj):
            m.reset_parameters()
        self.A_log.copy_(torch.empty(self.n_heads, **kw).uniform_(1.0, 16.0).log())
        self.D.fill_(1.0)
        self.norm.weight.fill_(1.0)
        dt = _log_uniform(self.n_heads, self.dt_min, self.dt_max, **kw).clamp(min=self.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(Δ) = Δ + log(1 - e^-Δ)

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        """Zeros: conv_state (b, d_inner + 2 g n, d_conv), ssm_state (b, h, p, n); defaults: the parameters'."""
        check_batch_size("Mamba2", batch_size)
        kw = {"device": device or self.D.device, "dtype": dtype or self.D.dtype}
        return (
            torch.zeros(batch_size, self.conv_dim, self.d_conv, **kw),
            torch.zeros(batch_size, self.n_heads, self.headdim, self.d_state, **kw),
        )

    def _check_state(self, state: tuple[Tensor, Tensor], x: Tensor) -> None:
        b = x.size(0)
        shapes = {
            "conv_state": (b, self.conv_dim, self.d_conv),
            "ssm_state": (b, self.n_heads, self.headdim, self.d_state),
        }
        check_state("Mamba2", state, shapes, x, (x.dtype, torch.promote_types(x.dtype, torch.float32)))

    def _projections(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """in_proj(u) as its three products (z, xBC, Δ before the bias), as Mamba's in_proj is two: the backward
        adds (..., d) input gradients instead of concatenating the outputs' (for Mamba 3% faster a step)."""
        parts = [self.d_inner, self.conv_dim, self.n_heads]
        biases = [None] * 3 if self.in_proj.bias is None else self.in_proj.bias.split(parts)
        return tuple(
            linear(u, w, bias) for w, bias in zip(self.in_proj.weight.split(parts), biases, strict=True)
        )

    def _split_xbc(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(..., conv_dim) -> x (..., h, p), B and C (..., g, n)."""
        g, n = self.n_groups, self.d_state
        x, B, C = xbc.split([self.d_inner, g * n, g * n], dim=-1)
        return x.unflatten(-1, (self.n_heads, self.headdim)), B.unflatten(-1, (g, n)), C.unflatten(-1, (g, n))

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None):
        """x (b, t, d) -> y (b, t, d), (conv_state, ssm_state)."""
        return self._forward(x, state, mask, fast=self._take_fast_path(x))

    def forward_ref(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None):
        """``forward`` through :func:`seqlab.layers.ssd.ssd_ref`, whatever ``fast_path`` says."""
        return self._forward(x, state, mask, fast=False)

    def _forward(self, u: Tensor, state, mask: Tensor | None, fast: bool):
        check_input("Mamba2", u, self.d_model, self.D)
        if state is not None:
            self._check_state(state, u)
        b, t, _ = u.shape
        if mask is not None and (mask := check_padding_mask(mask, b, t, u.device)) is not None:
            u = u.masked_fill(~mask[..., None], 0.0)  # padded inputs (even NaN) go no further
        conv_state, ssm_state = self.init_state(b, device=u.device, dtype=u.dtype) if state is None else state
        z, xbc, dt = self._projections(u)  # (b, t, d_inner), (b, t, conv_dim), (b, t, h)
        xbc, new_conv_state = causal_conv(xbc, conv_state, self.conv1d, mask, fast)
        x, B, C = self._split_xbc(xbc)  # (b, t, h, p), (b, t, g, n), (b, t, g, n)
        dt = F.softplus(_wide(dt) + _wide(self.dt_bias))  # Δ (b, t, h), float32 at least
        if mask is not None:
            dt = dt.masked_fill(~mask[..., None], 0.0)  # Δ = 0: the state is held
        wide = dt.dtype
        ssd = ssd_scan if fast else ssd_ref
        y, ssm_state = ssd(
            x.to(wide),
            dt,
            -torch.exp(_wide(self.A_log)),
            B.to(wide),
            C.to(wide),
            D=_wide(self.D),
            initial_state=ssm_state.to(wide),
        )  # (b, t, h, p), (b, h, p, n)
        y = self.norm(y.flatten(-2).to(u.dtype), z, fast=fast)  # (b, t, d_inner)
        return self.out_proj(y), (new_conv_state, ssm_state.to(self.D.dtype))

    def step(self, x_t: Tensor, state: tuple[Tensor, Tensor] | None = None):
        """x_t (b, d) -> y_t (b, d): one position of the conv and of the recurrence, O(1) in the context."""
        check_input("Mamba2.step", x_t, self.d_model, self.D, step=True, what="x_t")
        if state is None:
            state = self.init_state(x_t.size(0), device=x_t.device, dtype=x_t.dtype)
        self._check_state(state, x_t)
        conv_state, H = state
        z, xbc, dt = self._projections(x_t)
        xbc, conv_state = causal_conv_step(xbc, conv_state, self.conv1d)
        x, B, C = self._split_xbc(xbc)  # (b, h, p), (b, g, n), (b, g, n)
        dt = F.softplus(_wide(dt) + _wide(self.dt_bias))  # (b, h)
        wide, b, g = dt.dtype, x.size(0), self.n_groups
        x_w = x.to(wide)
        a = torch.exp(dt * -torch.exp(_wide(self.A_log)))  # (b, h)
        # heads as (g, h / g): a group's B and C broadcast over its heads, no copies
        shape = (b, g, self.n_heads // g, self.headdim, self.d_state)
        decay, dx = a.view(*shape[:3], 1, 1), (dt[..., None] * x_w).view(*shape[:4], 1)
        H = decay * H.to(wide).reshape(shape) + dx * B.to(wide).view(b, g, 1, 1, -1)  # (b, g, h / g, p, n)
        y = (H @ C.to(wide).view(b, g, 1, -1, 1)).view(x.shape) + _wide(self.D)[:, None] * x_w  # (b, h, p)
        y = self.norm(y.flatten(-2).to(x_t.dtype), z)
        return self.out_proj(y), (conv_state, H.flatten(1, 2).to(self.D.dtype))

    def extra_repr(self) -> str:
        s = f"{self.d_model}, d_inner={self.d_inner}, n_heads={self.n_heads}, headdim={self.headdim}, "
        s += f"d_state={self.d_state}, n_groups={self.n_groups}"
        return s + (", fast_path=False" if not self.fast_path else "")


@dataclass
class Mamba2MixerConfig:
    d_state: int = 64
    """State size n per head (the paper: 64 to 256; Mamba's 16)."""
    d_conv: int = 4
    expand: int = 2
    headdim: int = 8
    """Channels per head p. The paper (and ``Mamba2``'s own default) has 64 at widths of 768 and more; 8 keeps several
    heads at the lab's widths and d_model a multiple of 4, so the budget matcher can land near any budget."""
    n_groups: int = 1
    """Groups of heads sharing B and C (1: all heads read one B and C, like multi-value attention)."""
    norm_eps: float = 1e-5
    """eps of the gated RMSNorm."""

    def __post_init__(self):
        check_positive_ints(self, ("d_state", "d_conv", "expand", "headdim", "n_groups"))
        check_positive_floats(self, ("norm_eps",))


def _build_mamba2(d_model: int, c: Mamba2MixerConfig, *, dropout: float, device=None, dtype=None) -> Mamba2:
    fields = {"d_state": c.d_state, "d_conv": c.d_conv, "expand": c.expand, "headdim": c.headdim}
    return Mamba2(d_model, **fields, n_groups=c.n_groups, norm_eps=c.norm_eps, device=device, dtype=dtype)


register_mixer(
    MixerSpec(
        "mamba2",
        Mamba2MixerConfig,
        _build_mamba2,
        family="SSM",
        summary="SSD: selective SSM with a scalar decay per head, its state wider; gated norm (Dao & Gu 2024)",
        year=2024,
        channel_mlp=False,  # as Mamba: the block's gated expansion is its MLP (the paper's LMs, Mamba2ForCausalLM)
        step_cost=1.9,  # docs/adding-a-mixer.md, section 7 (its state, n = 64, is 4x Mamba's)
        width_multiple=width_multiple,
    )
)
