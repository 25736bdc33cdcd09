r"""Mamba: the selective state-space block (Gu & Dao 2023, arXiv 2312.00752, Figure 3 and Algorithm 2), a token
mixer. Δ, B and C are functions of the input ("selective"), which rules out S4D's convolution: the forward pass
is the selective scan of ``seqlab.layers.scan``.

Notation: ``b`` batch, ``t`` time, ``d`` model width, ``d_inner = expand · d`` channels, ``n`` SSM state size.

Two paths (``seqlab.layers.fastpath``): ``forward`` runs :func:`selective_scan` (custom backward) and, on CPU
without a padding mask, the convolution and its SiLU as one C++ kernel (``seqlab.kernels.causal_conv``);
``forward_ref`` (and ``fast_path=False``) the loop :func:`selective_scan_ref` and torch's conv1d.

Padding: ``mask`` (b, t), True at real positions, padding on the right. At a padded position the input is
zeroed, the conv input too, and Δ is set to 0, so that Ā = exp(0 · A) = 1 and B̄ x = Δ B x = 0: the SSM state
is held. The returned conv state is each row's last d_conv real conv inputs (with the carried conv state in
front, as in the unpadded case: zeros from ``init_state`` where a row is shorter than d_conv). So each row's
outputs at its real positions and its returned state equal those of the row run alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.causal_conv import causal_conv_silu
from seqlab.kernels.causal_conv import why_not_kernel as why_not_conv_kernel
from seqlab.layers.checks import check_batch_size, check_input, check_state
from seqlab.layers.discretization import _log_uniform, _wide
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.linear import Linear, linear
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.scan import selective_scan, selective_scan_ref
from seqlab.validation import check_positive_floats, check_positive_ints

__all__ = ["Mamba", "causal_conv", "causal_conv_step"]


def _check_args(m: Mamba) -> None:
    """The constructor's arguments, validated once they are attributes (``seqlab.validation``)."""
    check_positive_ints(m, ("d_model", "d_state", "d_conv", "expand"), prefix="Mamba: ")
    check_positive_ints(m, ("dt_rank", "chunk_size"), prefix="Mamba: ", allow_none=True)
    check_positive_floats(m, ("dt_min", "dt_max", "dt_init_floor"), prefix="Mamba: ")
    if m.dt_min > m.dt_max:
        raise ValueError(f"Mamba: dt_min={m.dt_min} must not exceed dt_max={m.dt_max}")


def causal_conv(xs: Tensor, conv_state: Tensor, conv1d: nn.Conv1d, mask: Tensor | None, fast: bool):
    """silu(causal depthwise conv1d) of xs (b, t, c) after the carried conv_state (b, c, d_conv) -> (b, t, c), and the
    conv state to carry: the last d_conv conv inputs, per row up to its last real one (Mamba's and Mamba-2's
    convolution; padded inputs are zeros, as after a real end)."""
    k, c = conv_state.size(-1), xs.size(-1)
    if mask is not None:
        xs = xs.masked_fill(~mask[..., None], 0.0)
    # the previous d_conv - 1 inputs (zeros at the start) prefix the sequence
    if fast and mask is None and why_not_conv_kernel(xs) is None:  # one C++ pass on the (b, t, c) layout
        new_state = torch.cat([conv_state, xs[:, -k:].transpose(1, 2)], dim=-1)[..., -k:]
        w = conv1d.weight.view(c, k).t()  # (d_conv, c)
        return causal_conv_silu(xs, conv_state[..., 1:].transpose(1, 2), w, conv1d.bias), new_state
    full = torch.cat([conv_state, xs.transpose(1, 2)], dim=-1)  # (b, c, d_conv + t)
    ys = F.silu(F.conv1d(full[..., 1:], conv1d.weight, conv1d.bias, groups=c))  # (b, c, t)
    if mask is None:
        return ys.transpose(1, 2), full[..., -k:]
    # row i's last conv inputs end at full[i, :, len_i + d_conv - 1]
    idx = mask.sum(1, keepdim=True) + torch.arange(k, device=full.device)  # (b, d_conv)
    return ys.transpose(1, 2), full.gather(2, idx[:, None, :].expand(-1, c, -1))


def causal_conv_step(x_t: Tensor, conv_state: Tensor, conv1d: nn.Conv1d) -> tuple[Tensor, Tensor]:
    """One position of :func:`causal_conv`: x_t (b, c) -> silu(conv output) (b, c), the new conv_state."""
    conv_state = torch.cat([conv_state[..., 1:], x_t[..., None]], dim=-1)  # (b, c, d_conv)
    # depthwise conv, one output (as einsum, a call took 3x as long)
    y = (conv_state * conv1d.weight[:, 0]).sum(-1)
    if conv1d.bias is not None:
        y = y + conv1d.bias
    return F.silu(y), conv_state


class Mamba(FastPathMixin, nn.Module):
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
    A_log and D are meant to be trained without weight decay (``no_weight_decay`` names them).

    State: (conv_state (b, d_inner, d_conv), the last d_conv conv inputs, oldest first; ssm_state
    (b, d_inner, n)). ``step`` costs O(1) time and memory per token. ``mask``: see the module docstring.

    Examples::

        >>> mamba = Mamba(8, d_state=4)
        >>> y, (conv_state, ssm_state) = mamba(torch.randn(2, 10, 8))
        >>> y.shape, conv_state.shape, ssm_state.shape
        (torch.Size([2, 10, 8]), torch.Size([2, 16, 4]), torch.Size([2, 16, 4]))
    """

    no_weight_decay = ("A_log", "D")  # trained without weight decay (seqlab.training.optim.param_groups)

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
        *,
        fast_path: bool = True,
    ):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.dt_rank, self.dt_min, self.dt_max, self.dt_init_floor = dt_rank, dt_min, dt_max, dt_init_floor
        self.chunk_size, self.fast_path = chunk_size, fast_path
        _check_args(self)
        self.d_inner = di = expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if dt_rank is None else dt_rank
        self.in_proj = Linear(d_model, 2 * di, bias=bias, **kw)
        self.conv1d = nn.Conv1d(di, di, d_conv, groups=di, padding=d_conv - 1, bias=conv_bias, **kw)
        self.x_proj = Linear(di, self.dt_rank + 2 * d_state, bias=False, **kw)
        self.dt_proj = Linear(self.dt_rank, di, bias=True, **kw)
        self.A_log = nn.Parameter(torch.empty(di, d_state, **kw))
        self.D = nn.Parameter(torch.empty(di, **kw))
        self.out_proj = Linear(di, d_model, bias=bias, **kw)
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

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        """Zeros: conv_state (b, d_inner, d_conv), ssm_state (b, d_inner, n); defaults: the parameters'."""
        check_batch_size("Mamba", batch_size)
        kw = {"device": device or self.D.device, "dtype": dtype or self.D.dtype}
        return (
            torch.zeros(batch_size, self.d_inner, self.d_conv, **kw),
            torch.zeros(batch_size, self.d_inner, self.d_state, **kw),
        )

    def _check_state(self, state: tuple[Tensor, Tensor], x: Tensor) -> None:
        """A state as init_state makes it for x, or in float32 for a half-precision x (``step`` keeps the ssm
        state in the scan's precision)."""
        b, di = x.size(0), self.d_inner
        shapes = {"conv_state": (b, di, self.d_conv), "ssm_state": (b, di, self.d_state)}
        check_state("Mamba", state, shapes, x, (x.dtype, torch.promote_types(x.dtype, torch.float32)))

    def _in_proj(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """in_proj(x) split into the conv's input and the gate. As two products, one per half of the weight, the
        backward adds two (b, t, d) input gradients instead of concatenating two (b, t, d_inner) output
        gradients into one: less copying (a lab-width Mamba LM step about 3% faster, alternating in one process)."""
        w, bias = self.in_proj.weight, self.in_proj.bias
        halves = (None, None) if bias is None else bias.chunk(2)
        return tuple(linear(x, wh, bh) for wh, bh in zip(w.chunk(2), halves, strict=True))

    def _ssm_inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (..., d_inner) -> Δ before bias and softplus (..., d_inner), B and C (..., n)."""
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return linear(dt, self.dt_proj.weight), B, C  # the bias is added in float32 by the caller

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None):
        """x (b, t, d) -> y (b, t, d), (conv_state, ssm_state)."""
        return self._forward(x, state, mask, fast=self._take_fast_path(x))

    def forward_ref(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None):
        """``forward`` through :func:`selective_scan_ref`, whatever ``fast_path`` says."""
        return self._forward(x, state, mask, fast=False)

    def _forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None, mask: Tensor | None, fast: bool):
        check_input("Mamba", x, self.d_model, self.D)
        if state is not None:
            self._check_state(state, x)
        b, t, _ = x.shape
        if mask is not None and (mask := check_padding_mask(mask, b, t, x.device)) is not None:
            x = x.masked_fill(~mask[..., None], 0.0)  # padded inputs (even NaN) go no further
        conv_state, ssm_state = self.init_state(b, device=x.device, dtype=x.dtype) if state is None else state
        xs, z = self._in_proj(x)  # (b, t, d) -> 2 x (b, t, d_inner)
        if (
            fast
            and xs.dtype == torch.bfloat16
            and xs.device.type == "cpu"
            and torch.is_autocast_enabled("cpu")
        ):
            # CPU autocast: in_proj and out_proj (the large matmuls) run in bf16, the rest in float32 through
            # seqlab's kernels, which take float32 (torch's bf16 conv1d and the casts around the scan cost more
            # than the small x_proj and dt_proj save in bf16)
            with torch.autocast("cpu", enabled=False):
                wide = (t.float() for t in (xs, z, conv_state, ssm_state))
                y, new_state = self._mix(*wide, mask, fast)
            return self.out_proj(y), new_state
        y, new_state = self._mix(xs, z, conv_state, ssm_state, mask, fast)
        return self.out_proj(y), new_state

    def _mix(self, xs, z, conv_state, ssm_state, mask, fast: bool):
        """The causal conv and the selective scan on in_proj's halves xs, z (b, t, d_inner) -> y (b, t, d_inner),
        (conv_state, ssm_state)."""
        xs, new_conv_state = causal_conv(xs, conv_state, self.conv1d, mask, fast)
        delta, B, C = self._ssm_inputs(xs)
        # Δ = softplus(dt_proj(x)), in float32 at least: (b, t, d_inner); without a mask the fast scan adds the
        # bias and takes the softplus itself (fused into its kernels)
        fused = {"delta_bias": _wide(self.dt_proj.bias), "delta_softplus": True}
        if not (fast and mask is None):
            delta, fused = F.softplus(_wide(delta) + fused["delta_bias"]), {}
        if mask is not None:
            delta = delta.masked_fill(~mask[..., None], 0.0)  # Δ = 0: Ā = 1, B̄ x = 0, the state is held
        scan = selective_scan if fast else selective_scan_ref
        y, ssm_state = scan(
            xs,
            delta,
            -torch.exp(_wide(self.A_log)),  # A: (d_inner, n)
            B,
            C,
            D=_wide(self.D),
            z=z,
            initial_state=ssm_state,
            return_last_state=True,
            **fused,
            **({"chunk_size": self.chunk_size} if fast else {}),
        )
        return y, (new_conv_state, ssm_state.to(self.D.dtype))

    def step(
        self, x_t: Tensor, state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x_t (b, d) -> y_t (b, d): one position of the conv and of the recurrence, O(1) in the context.
        ``state`` None starts from :meth:`init_state`, as every mixer's step does."""
        check_input("Mamba.step", x_t, self.d_model, self.D, step=True, what="x_t")
        if state is None:
            state = self.init_state(x_t.size(0), device=x_t.device, dtype=x_t.dtype)
        self._check_state(state, x_t)
        conv_state, h = state
        xs, z = self.in_proj(x_t).chunk(2, dim=-1)  # 2 x (b, d_inner)
        xs, conv_state = causal_conv_step(xs, conv_state, self.conv1d)
        delta, B, C = self._ssm_inputs(xs)
        delta = F.softplus(delta + self.dt_proj.bias)  # (b, d_inner)
        A = -torch.exp(_wide(self.A_log))  # the recurrence in float32 at least, as the scan runs it
        wide = A.dtype
        delta, xs_w, B, C = (v.to(wide) for v in (delta, xs, B, C))
        dA = torch.exp(delta[..., None] * A)  # Ā = exp(Δ A): (b, d_inner, n)
        h_w = dA * h.to(wide) + (delta * xs_w)[..., None] * B[:, None, :]  # h = Ā h + Δ x B
        y = (torch.einsum("bin,bn->bi", h_w, C) + self.D.to(wide) * xs_w).to(xs.dtype)  # ⟨h, C⟩ + D x
        y = y * F.silu(z)
        return self.out_proj(y), (conv_state, h_w.to(h.dtype))

    def extra_repr(self) -> str:
        s = f"{self.d_model}, d_inner={self.d_inner}, d_state={self.d_state}, d_conv={self.d_conv}, "
        s += f"dt_rank={self.dt_rank}"
        return s + (", fast_path=False" if not self.fast_path else "")


@dataclass
class MambaMixerConfig:
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None
    """Rank of the Δ projection; None means ceil(d_model / 16), as in the paper."""

    def __post_init__(self):
        check_positive_ints(self, ("d_state", "d_conv", "expand"))
        check_positive_ints(self, ("dt_rank",), allow_none=True)


def _build_mamba(d_model: int, c: MambaMixerConfig, *, dropout: float, device=None, dtype=None) -> Mamba:
    return Mamba(d_model, c.d_state, c.d_conv, c.expand, dt_rank=c.dt_rank, device=device, dtype=dtype)


register_mixer(
    MixerSpec(
        "mamba",
        MambaMixerConfig,
        _build_mamba,
        family="SSM",
        summary="selective SSM with input-dependent Δ, B, C and a gated block (Gu & Dao 2023)",
        year=2023,
        # its block has its own gated expansion in place of the MLP (the paper, MambaForCausalLM); with an
        # MLP at the same budget it was too narrow to learn induction heads in the lab's steps (chance after
        # 800 steps, against 92% at 4x the training length without it)
        channel_mlp=False,
        step_cost=1.5,  # a lab run's training step: 1.49x the LSTM's (docs/adding-a-mixer.md, section 7)
    )
)
