r"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", arXiv 2006.16236): softmax(q kᵀ)
replaced by the kernel φ(q)ᵀφ(k), φ = elu + 1, which turns causal attention into a recurrence with an O(1) state.

Notation: ``b`` batch, ``t`` time, ``d`` model width, ``h`` heads, ``k`` head dim (feature size), ``e`` value dim.

    y_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + eps),   S_i = Σ_{j<=i} φ(k_j) v_jᵀ  (k x e),   z_i = Σ_{j<=i} φ(k_j)   (eq. 16-20)

The recurrent form updates (S, z) one position at a time: O(1) state and work per step. The parallel form
computes the same numbers chunk by chunk: inside a chunk of c positions the masked quadratic form
(φ(Q) φ(K)ᵀ ⊙ causal) V, across chunks the carried (S, z); O(t c k + t k²) work, no (t, k, k) tensor.
The chunked form is :class:`LinearAttention`'s fast path and the recurrent one its reference
(``forward_ref``, ``fast_path=False``; ``seqlab.layers.fastpath``). On the CPU (float32, float64) the fast
path runs the recurrent form in C++ instead (``seqlab.kernels.linear_attention``: one pass forward, two back):
per position O(k e) on an O(k e) state does less there than the chunked form's batched products. Measured on a
2-core AMD EPYC (``benchmarks/bench_mixer_kernels.py``): 1.5x the layer's forward + backward at the step-cost
shape of ``docs/adding-a-mixer.md`` (heads of 18), 2.0x a lab LM's training step (heads of 12, whose state
stays in registers).

A padding ``mask`` (b, t), True at real positions, padding on the right, zeroes the padded inputs and their
keys φ(k): (S, z) sum over the real positions only, so each sequence's outputs and state are its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.linear_attention import (
    check_causal_args,
    linear_attention_recurrent,
    linear_attention_recurrent_ref,
)
from seqlab.kernels.linear_attention import why_not_kernel as why_not_recurrence_kernel
from seqlab.layers.checks import check_batch_size, check_causal_step, check_input, check_state
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.linear import Linear, linear
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.layers.packed_proj import packed_in_proj, reset_packed_in_proj
from seqlab.validation import check_divisible, check_positive_floats, check_positive_ints

__all__ = [
    "LinearAttention",
    "linear_attention_causal",
    "linear_attention_noncausal_ref",
    "linear_attention_recurrent_ref",
]


def _elu1(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0  # φ(x) = elu(x) + 1 > 0, so the normalizer φ(q)ᵀz is positive


def _check_causal_args(q, k, v, state, chunk_size) -> None:
    """:func:`linear_attention_causal`'s arguments: chunk_size an integer >= 1, then what
    :func:`seqlab.kernels.linear_attention.check_causal_args` checks. Shapes and dtypes only."""
    owner = "linear_attention_causal"
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{owner}: chunk_size must be a positive integer, got {chunk_size!r}")
    check_causal_args(owner, q, k, v, state)


def linear_attention_causal(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: tuple[Tensor, Tensor] | None = None,
    chunk_size: int = 64,
    eps: float = 1e-6,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Chunked parallel causal linear attention. q, k: features φ(·) (b, h, t, k); v (b, h, t, e).

    state: (S (b, h, k, e), z (b, h, k)) carried in from earlier positions, or None (zeros).
    Returns y (b, h, t, e) and the state after the last position. ``chunk_size``: positions per chunk, >= 1.
    """
    _check_causal_args(q, k, v, state, chunk_size)
    b, h, t, kd = q.shape
    if state is None:
        S = q.new_zeros(b, h, kd, v.size(-1))
        z = q.new_zeros(b, h, kd)
    else:
        S, z = state
    if t == 0:  # no position: no output, the state unchanged
        return v.new_zeros(b, h, 0, v.size(-1)), (S, z)
    outs = []
    for start in range(0, t, chunk_size):
        qc, kc, vc = (x[:, :, start : start + chunk_size] for x in (q, k, v))  # (b, h, c, ·)
        a = (qc @ kc.transpose(-2, -1)).tril()  # (b, h, c, k) x (b, h, k, c) -> (b, h, c, c), causal in-chunk
        num = qc @ S + a @ vc  # (b, h, c, k) x (b, h, k, e) + (b, h, c, c) x (b, h, c, e) -> (b, h, c, e)
        den = (qc @ z.unsqueeze(-1)) + a.sum(-1, keepdim=True)  # (b, h, c, k) x (b, h, k, 1) -> (b, h, c, 1)
        outs.append(num / (den + eps))
        S = S + kc.transpose(-2, -1) @ vc  # (b, h, k, c) x (b, h, c, e) -> (b, h, k, e)
        z = z + kc.sum(-2)  # (b, h, k)
    return torch.cat(outs, dim=2), (S, z)


def linear_attention_noncausal_ref(
    q: Tensor, k: Tensor, v: Tensor, state: tuple[Tensor, Tensor] | None = None, eps: float = 1e-6
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Non-causal linear attention with the weights written out: y_i = Σ_j (φ(q_i)·φ(k_j)) v_j / (Σ_j φ(q_i)·φ(k_j)
    + eps), every j, plus a carried state's φ(q_i)ᵀ S_0 and φ(q_i)ᵀ z_0. Shapes as :func:`linear_attention_causal`."""
    w = q @ k.transpose(-2, -1)  # (b, h, t, k) x (b, h, k, t) -> (b, h, t, t)
    num, den = w @ v, w.sum(-1, keepdim=True)  # (b, h, t, e), (b, h, t, 1)
    S, z = k.transpose(-2, -1) @ v, k.sum(-2)  # the state after all positions: (b, h, k, e), (b, h, k)
    if state is not None:
        num = num + q @ state[0]  # (b, h, t, k) x (b, h, k, e)
        den = den + q @ state[1].unsqueeze(-1)  # (b, h, t, k) x (b, h, k, 1)
        S, z = S + state[0], z + state[1]
    return num / (den + eps), (S, z)


class LinearAttention(FastPathMixin, nn.Module):
    r"""Multi-head linear attention (Katharopoulos et al. 2020, arXiv 2006.16236), a token mixer.

        q, k, v = x W_q, x W_k, x W_v  (b, h, t, k);   φ(u) = elu(u) + 1
        causal:      y_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + eps),  S_i = Σ_{j<=i} φ(k_j) v_jᵀ,  z_i = Σ_{j<=i} φ(k_j)
        non-causal:  the same with the sums over all j
        out = [y_1; ...; y_h] W_o

    ``y, (S, z) = attn(x, state=None, mask=None)``: x (b, t, d); state S (b, h, k, k), z (b, h, k): the O(1)
    summary of the past that ``step`` updates per position (a carried state adds to both sums).
    ``mask`` (b, t) boolean, True at real positions, padding on the right: padded inputs are zeroed and their
    φ(k) too, so padded keys add nothing to S and z; the outputs at real positions and the returned (S, z)
    equal those of each sequence run alone. Parameters are laid out like :class:`MultiheadAttention`'s
    (``in_proj_weight`` stacks [W_q; W_k; W_v], ``out_proj``).

    Two paths (``seqlab.layers.fastpath``): ``forward`` uses the chunked parallel form
    (:func:`linear_attention_causal`; on the CPU the recurrence in C++, the module docstring; non-causal: the
    sums as two products); ``forward_ref`` (and ``fast_path=False``) the recurrent form position by position
    (non-causal: the t x t weights written out).

    Examples::

        >>> attn = LinearAttention(16, n_heads=2)
        >>> y, (S, z) = attn(torch.randn(3, 7, 16))
        >>> y.shape, S.shape, z.shape
        (torch.Size([3, 7, 16]), torch.Size([3, 2, 8, 8]), torch.Size([3, 2, 8]))
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        bias: bool = False,
        causal: bool = True,
        eps: float = 1e-6,
        chunk_size: int = 64,
        device=None,
        dtype=None,
        *,
        fast_path: bool = True,
    ):
        super().__init__()
        self.d_model, self.n_heads, self.head_dim, self.eps, self.chunk_size = (
            d_model,
            n_heads,
            head_dim,
            eps,
            chunk_size,
        )
        check_positive_ints(self, ("d_model", "n_heads", "chunk_size"), prefix="LinearAttention: ")
        check_positive_ints(self, ("head_dim",), prefix="LinearAttention: ", allow_none=True)
        check_positive_floats(self, ("eps",), prefix="LinearAttention: ")
        if head_dim is None:
            check_divisible(d_model, n_heads, ", or give head_dim")
            head_dim = d_model // n_heads
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.causal, self.eps, self.chunk_size, self.fast_path = causal, eps, chunk_size, fast_path
        self.in_proj_weight, self.in_proj_bias = packed_in_proj(3 * n_heads * head_dim, d_model, bias, **kw)
        self.out_proj = Linear(n_heads * head_dim, d_model, bias=bias, **kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_packed_in_proj(self.in_proj_weight, self.in_proj_bias)
        self.out_proj.reset_parameters()

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        """Zeros: S (b, h, k, k), z (b, h, k); ``device`` and ``dtype`` default to the parameters'."""
        check_batch_size("LinearAttention", batch_size)
        w = self.in_proj_weight
        kw = {"device": device or w.device, "dtype": dtype or w.dtype}
        h, kd = self.n_heads, self.head_dim
        return torch.zeros(batch_size, h, kd, kd, **kw), torch.zeros(batch_size, h, kd, **kw)

    def _check_state(self, state: tuple[Tensor, Tensor] | None, x: Tensor) -> None:
        if state is not None:
            b, h, kd = x.size(0), self.n_heads, self.head_dim
            check_state("LinearAttention", state, {"S": (b, h, kd, kd), "z": (b, h, kd)}, x, x.dtype)

    def _features(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """x (b, t, d) -> φ(q), φ(k), v, each (b, h, t, k); padded positions contribute no key."""
        b, t, _ = x.shape
        if mask is not None:
            mask = check_padding_mask(mask, b, t, x.device)
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)  # padded inputs (even NaN) never enter a product
        qkv = linear(x, self.in_proj_weight, self.in_proj_bias)  # (b, t, d) -> (b, t, 3 h k)
        qkv = qkv.view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, b, h, t, k)
        q, k, v = _elu1(qkv[0]), _elu1(qkv[1]), qkv[2]
        if mask is not None:
            k = k.masked_fill(~mask[:, None, :, None], 0.0)  # (b, 1, t, 1): padded keys add nothing to S, z
        return q, k, v

    def _out(self, y: Tensor) -> Tensor:
        b, h, t, kd = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(b, t, h * kd))  # (b, t, h k) -> (b, t, d)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None):
        check_input("LinearAttention", x, self.d_model, self.in_proj_weight)
        self._check_state(state, x)
        if not self._take_fast_path(x):
            return self.forward_ref(x, state, mask)
        q, k, v = self._features(x, mask)  # (b, h, t, k) each
        if self.causal and why_not_recurrence_kernel(q) is None:  # the CPU: seqlab.kernels.linear_attention
            y, state = linear_attention_recurrent(q, k, v, state, self.eps)
            return self._out(y), state
        if self.causal:
            y, state = linear_attention_causal(q, k, v, state, self.chunk_size, self.eps)
            return self._out(y), state
        S = k.transpose(-2, -1) @ v  # (b, h, k, t) x (b, h, t, k) -> (b, h, k, k)
        z = k.sum(-2)  # (b, h, k)
        if state is not None:
            S, z = S + state[0], z + state[1]
        y = (q @ S) / ((q @ z.unsqueeze(-1)) + self.eps)  # (b, h, t, k) / (b, h, t, 1)
        return self._out(y), (S, z)

    def forward_ref(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None):
        """The reference: causal, the recurrent form position by position; non-causal, the weights written out."""
        check_input("LinearAttention", x, self.d_model, self.in_proj_weight)
        self._check_state(state, x)
        q, k, v = self._features(x, mask)
        if self.causal:
            y, state = linear_attention_recurrent_ref(q, k, v, state, self.eps)
        else:
            y, state = linear_attention_noncausal_ref(q, k, v, state, self.eps)
        return self._out(y), state

    def step(self, x_t: Tensor, state: tuple[Tensor, Tensor] | None = None):
        """x_t (b, d) -> y_t (b, d): one O(1) update of (S, z)."""
        check_causal_step(self)
        check_input("LinearAttention.step", x_t, self.d_model, self.in_proj_weight, step=True, what="x_t")
        self._check_state(state, x_t)
        q, k, v = self._features(x_t.unsqueeze(1), None)  # (b, h, 1, k)
        y, state = linear_attention_recurrent_ref(q, k, v, state, self.eps)
        return self._out(y).squeeze(1), state

    def extra_repr(self) -> str:
        s = f"{self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, causal={self.causal}"
        return s + (", fast_path=False" if not self.fast_path else "")


@dataclass
class LinearAttentionMixerConfig:
    n_heads: int = 4
    head_dim: int | None = None
    """Per-head width; None means d_model // n_heads."""

    def __post_init__(self):
        check_positive_ints(self, ("n_heads",))
        check_positive_ints(self, ("head_dim",), allow_none=True)


def _build_linear_attention(
    d_model: int, c: LinearAttentionMixerConfig, *, dropout: float, device=None, dtype=None
) -> LinearAttention:
    return LinearAttention(d_model, c.n_heads, head_dim=c.head_dim, causal=True, device=device, dtype=dtype)


register_mixer(
    MixerSpec(
        "linear-attention",
        LinearAttentionMixerConfig,
        _build_linear_attention,
        family="Transformer",
        summary="causal linear attention, elu + 1 features, O(1) state (Katharopoulos et al. 2020)",
        year=2020,
        step_cost=1.1,  # a lab run's training step: 1.07x the LSTM's (docs/adding-a-mixer.md, section 7)
        width_multiple=lambda c: 2 * c.n_heads,
    )
)
