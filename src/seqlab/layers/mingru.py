r"""minGRU (Feng, Tung, Ahmed, Bengio & Hajimirsadeghi 2024, "Were RNNs All We Needed?", arXiv 2410.01201).

Notation: ``b`` batch, ``t`` time, ``d`` model width, ``e`` hidden width (``d_inner = expand * d``),
``m`` chunks and ``l`` positions per chunk in the scan.

A GRU whose gates read only the input, never h_{t-1} (the paper's Section 3.1, "minGRU"):

    z_t = σ(Linear_z(x_t))                       # update gate, (b, e)
    h̃_t = g(Linear_h(x_t))                       # candidate, g(u) = u + 0.5 for u >= 0, σ(u) for u < 0
    h_t = (1 - z_t) ⊙ h_{t-1} + z_t ⊙ h̃_t         # = a_t ⊙ h_{t-1} + b_t with a_t = 1 - z_t, b_t = z_t ⊙ h̃_t

Nothing on the right reads h_{t-1} except the product with a_t, so the recurrence is linear and its solution
is a prefix sum:

    h_t = (Π_{r≤t} a_r) h_0 + Σ_{s≤t} (Π_{s<r≤t} a_r) b_s
        = exp(A_t) h_0 + exp(A_t + logcumsumexp_{s≤t}(log b_s - A_s)),       A_t = Σ_{r≤t} log a_r

with log a_t = log σ(-k_t) = -softplus(k_t) and log b_t = log σ(k_t) + log g(u_t) for the gate and
candidate pre-activations k_t, u_t. g keeps h̃ > 0, so log b_t exists (the paper's log-space minGRU).
``forward`` evaluates this with ``torch.logcumsumexp``, in parallel over t; ``forward_ref`` is the first
equations as a loop over time and ``step`` one iteration of it, O(1) per token. Both compute 1 - z_t as
σ(-k_t): 1 - σ(k) rounds to 0 for k > 17 in float32, where σ(-k) and the scan's log σ(-k) stay exact.

The block: x (b, t, d) -> ``in_proj`` (b, t, 2e), rows [Linear_z; Linear_h] -> h (b, t, e) -> ``out_proj``
back to (b, t, d) when expand > 1; with expand = 1 the output is h itself (positive whenever h_0 >= 0).

Choices, and where they depart from the paper:

* g is used everywhere, not only in the log-space version (the paper's plain minGRU has h̃ = Linear_h(x)):
  the loop, ``step`` and the scan compute one function, so each is tested against the others.
* The scan runs in chunks of ``chunk_size`` positions; the paper scans the whole sequence at once. A_t falls
  without bound as t grows, and A_t + logcumsumexp(... - A_s) cancels two numbers of size |A_t| (about 10⁵
  over 2,000 positions of saturated gates, where a float32 exponent keeps two or three digits). Within a
  chunk |A_t| <= l · max|log a|, and the state crosses chunk borders exactly, through the exp(A_t) h_0 term.
  Measured at t = 2,000, inputs x10, float32 against the float64 loop: 9e-4 relative error in one piece,
  3e-5 to 4e-5 in chunks of 64. The scan's arithmetic is at least float32, whatever the input dtype.
* The initial state enters as exp(A_t) h_0, outside the logarithm, where the paper's code prepends log h_0
  to the scan: that needs h_0 > 0, and ``init_state``'s zeros (or a state of any sign) would give -inf or NaN.
* ``out_proj`` has no bias; both projections keep nn.Linear's initialization, and the gate gets no bias
  offset (z starts near 1/2 on average, as with an unmodified LSTM forget gate).
* ``mask`` (b, t), True at real positions, padding on the right: z_t = 0 at padding, so h holds and the
  returned state is the state after each sequence's last real position; outputs at padding are zero, and
  padded inputs are never read (even NaN there changes nothing).

Default ``expand=2``: the recurrence is elementwise, so the hidden width is all the memory the layer has;
doubling it costs 2e·d + e·d = 6d² parameters, under an LSTM's 8d² at the same d_model, and the down
projection it brings mixes channels and gives the output both signs.

Two fast paths. On the CPU (float32 and float64, bfloat16 computed in float32) ``forward`` runs the recurrence
in linear space as one C++ pass over the sequence each way (``seqlab.kernels.mingru_scan``): elementwise work,
vectorized over channels, the loop's own arithmetic, no logarithms. Elsewhere (CUDA, or with the kernel switched
off by ``SEQLAB_DISABLE_KERNELS=mingru_scan`` or unbuildable) it runs the log-space scan above, the paper's method
for parallel hardware, where the loop's t sequential steps are what costs.

Cost on CPU, forward + backward of the mixer at the lab's sizes (b = 32, t = 128, d = 72, one thread, against
an LSTM, torch's fused kernel; ``benchmarks/bench_mixer_kernels.py``): the kernel 0.73-0.88x the LSTM's time,
the log-space scan 5-6.5x (``torch.logcumsumexp`` and its backward, two more logcumsumexps, are most of it), the
loop (``fast_path=False``) about 1.5x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.kernels.mingru_scan import _g, mingru_scan  # _g: the candidate's g(u)
from seqlab.kernels.mingru_scan import why_not_kernel as why_not_scan_kernel
from seqlab.layers.checks import check_batch_size, check_input, check_state
from seqlab.layers.discretization import _wide  # float32 for half precision, as the SSM scans
from seqlab.layers.fastpath import FastPathMixin
from seqlab.layers.linear import Linear
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import MixerSpec, register_mixer
from seqlab.validation import check_positive_ints

__all__ = ["MinGRU", "log_space_scan", "log_space_scan_ref"]


def _log_g(u: Tensor) -> Tensor:
    """log g(u), without a NaN in the branch not taken (torch.where differentiates both)."""
    return torch.where(u >= 0, torch.log(F.relu(u) + 0.5), F.logsigmoid(u))


def _check_scan_args(owner: str, log_a, log_b, h0, chunk_size) -> None:
    """log_a, log_b floating (b, t, e) of one shape, h0 floating (b, e), chunk_size an integer >= 1: a
    ValueError naming the expected and the given otherwise (shapes and dtypes only)."""
    got = {
        n: tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        for n, x in (("a", log_a), ("b", log_b))
    }
    if not isinstance(log_a, Tensor) or log_a.dim() != 3:
        raise ValueError(f"{owner} expects log_a of shape (b, t, e), got {got['a']}")
    if not isinstance(log_b, Tensor) or log_b.shape != log_a.shape:
        raise ValueError(f"{owner} expects log_b of log_a's shape (b, t, e) = {got['a']}, got {got['b']}")
    b, _, e = log_a.shape
    if not isinstance(h0, Tensor) or tuple(h0.shape) != (b, e):
        h0_got = tuple(h0.shape) if isinstance(h0, Tensor) else type(h0).__name__
        raise ValueError(f"{owner} expects h0 of shape (b, e) = {(b, e)}, got {h0_got}")
    for name, x in (("log_a", log_a), ("log_b", log_b), ("h0", h0)):
        if not x.is_floating_point():
            raise ValueError(f"{owner} expects floating log_a, log_b and h0, got {name} of {x.dtype}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{owner}: chunk_size must be a positive integer, got {chunk_size!r}")


def log_space_scan(log_a: Tensor, log_b: Tensor, h0: Tensor, chunk_size: int = 64) -> Tensor:
    r"""h_t = a_t ⊙ h_{t-1} + b_t for every t at once, from log a_t <= 0 and log b_t (so b_t > 0).

    log_a, log_b (b, t, e); h0 (b, e), any sign (zeros for a fresh state) -> h (b, t, e).
    Per chunk of l positions: h_s = exp(A_s) h_in + exp(A_s + logcumsumexp_{r≤s}(log b_r - A_r)),
    A_s = Σ_{r≤s} log a_r within the chunk; h_in, the state entering the chunk, is carried by a loop over the
    m = ⌈t / l⌉ chunks (see the module docstring for why chunks). ``chunk_size``: l, an integer >= 1.
    """
    _check_scan_args("log_space_scan", log_a, log_b, h0, chunk_size)
    b, t, e = log_a.shape
    l = max(1, min(chunk_size, t))
    m = math.ceil(t / l)
    pad = m * l - t
    if pad:  # a = b = 1 past the end: positions that are computed, then cut off
        log_a, log_b = (F.pad(v, (0, 0, 0, pad)) for v in (log_a, log_b))  # (b, m·l, e)
    log_a = log_a.view(b, m, l, e)  # (b, t', e) -> (b, m, l, e)
    log_b = log_b.view(b, m, l, e)
    A = log_a.cumsum(2)  # A_s within each chunk: (b, m, l, e)
    decay = torch.exp(A)  # Π_{r≤s} a_r, in (0, 1]: (b, m, l, e)
    local = torch.exp(A + torch.logcumsumexp(log_b - A, dim=2))  # h_s from a zero state: (b, m, l, e)
    h_in = [h0]  # the state entering each chunk, m x (b, e)
    for j in range(m - 1):
        h_in.append(decay[:, j, -1] * h_in[-1] + local[:, j, -1])  # h at the chunk's last position
    h = local + decay * torch.stack(h_in, 1)[:, :, None]  # (b, m, l, e) + (b, m, l, e) * (b, m, 1, e)
    return h.reshape(b, m * l, e)[:, :t]  # (b, t, e)


def log_space_scan_ref(log_a: Tensor, log_b: Tensor, h0: Tensor, chunk_size: int = 64) -> Tensor:
    """The same recurrence as a loop over t in linear space (``chunk_size`` is checked and unused)."""
    _check_scan_args("log_space_scan_ref", log_a, log_b, h0, chunk_size)
    h, hs = h0, []
    for a_t, b_t in zip(log_a.exp().unbind(1), log_b.exp().unbind(1), strict=True):  # t x (b, e)
        h = a_t * h + b_t
        hs.append(h)
    return torch.stack(hs, 1)  # (b, t, e)


class MinGRU(FastPathMixin, nn.Module):
    r"""minGRU as a token mixer (Feng et al. 2024, arXiv 2410.01201, Section 3.1 and its log-space version).

        k, u = in_proj(x) (b, t, 2e),   z = σ(k),   h̃ = g(u)
        h_t = (1 - z_t) ⊙ h_{t-1} + z_t ⊙ h̃_t        (parallel over t: log-space scan, module docstring)
        y = out_proj(h)  (e -> d; only when expand > 1)

    Shapes: x (b, t, d) -> y (b, t, d); state h (b, e), e = expand · d_model, the hidden state after the
    last (real) position. ``in_proj.weight`` is (2e, d), rows stacked [Linear_z; Linear_h]; ``bias`` gives
    ``in_proj`` its bias (the paper's Linear layers have one); ``chunk_size`` is the scan's chunk length l.

    ``forward`` takes the log-space scan unless ``fast_path=False``; ``forward_ref`` is always the loop
    (same signature, same numbers); ``why_not_fast_path()`` says which one ``forward`` takes and why.

    Examples::

        >>> mixer = MinGRU(16, expand=2)
        >>> y, h = mixer(torch.randn(4, 10, 16))           # y (4, 10, 16), h (4, 32)
        >>> y_t, h = mixer.step(torch.randn(4, 16), h)     # one more position, O(1)
    """

    def __init__(
        self,
        d_model: int,
        expand: int = 2,
        bias: bool = True,
        chunk_size: int = 64,
        *,
        fast_path: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.d_model, self.expand, self.chunk_size = d_model, expand, chunk_size
        check_positive_ints(self, ("d_model", "expand", "chunk_size"), prefix="MinGRU: ")
        kw = {"device": device, "dtype": dtype}
        self.d_inner = e = expand * d_model
        self.fast_path = fast_path
        self.in_proj = Linear(d_model, 2 * e, bias=bias, **kw)  # [Linear_z; Linear_h]
        self.out_proj = Linear(e, d_model, bias=False, **kw) if expand > 1 else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialization for both projections (see the module docstring)."""
        self.in_proj.reset_parameters()
        if self.out_proj is not None:
            self.out_proj.reset_parameters()

    # ---- state and input checks -----------------------------------------------------------------------

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> Tensor:
        """h_0 = 0, (b, e)."""
        check_batch_size("MinGRU", batch_size)
        w = self.in_proj.weight
        return torch.zeros(batch_size, self.d_inner, device=device or w.device, dtype=dtype or w.dtype)

    def _check_state(self, state: Tensor | None, x: Tensor) -> Tensor:
        if state is None:
            return self.init_state(x.size(0), device=x.device, dtype=x.dtype)
        check_state("MinGRU", state, {"h": (x.size(0), self.d_inner)}, x, x.dtype, "(b, expand * d_model)")
        return state

    def _prepare(self, x: Tensor, state: Tensor | None, mask: Tensor | None):
        """Validate a forward's inputs; return x, h_0 (zeros if None) and the mask."""
        check_input("MinGRU", x, self.d_model, self.in_proj.weight)
        if mask is not None:  # None again when nothing is padded: then exactly the unmasked numbers
            mask = check_padding_mask(mask, x.size(0), x.size(1), x.device)
        return x, self._check_state(state, x), mask

    # ---- the two paths ----------------------------------------------------------------------------------

    def forward(
        self, x: Tensor, state: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (b, t, d), h_0 (b, e) or None, mask (b, t) or None -> y (b, t, d), h (b, e)."""
        x, h0, mask = self._prepare(x, state, mask)
        if not self._take_fast_path(x):  # fast_path=False (why_not_fast_path, seqlab.layers.fastpath)
            return self._loop(x, h0, mask)
        ku = _wide(self._projection(x, mask))  # (b, t, 2e), [k | u], at least float32
        # padding is on the right: the h computed there is never read (outputs zeroed, h_last gathered below)
        if why_not_scan_kernel(ku) is None:  # the CPU: one fused pass (seqlab.kernels.mingru_scan)
            h = mingru_scan(ku, _wide(h0)).to(x.dtype)  # (b, t, e)
        else:
            k, u = ku.chunk(2, dim=-1)  # 2 x (b, t, e)
            log_a = -F.softplus(k)  # log(1 - z) = log σ(-k)
            log_b = k + log_a + _log_g(u)  # log z + log h̃, with log σ(k) = k + log σ(-k)
            h = log_space_scan(log_a, log_b, _wide(h0), self.chunk_size).to(x.dtype)  # (b, t, e)
        if mask is None:
            return self._out(h), h[:, -1]
        lengths = mask.sum(1)  # (b,)
        last = (lengths - 1).clamp(min=0)[:, None, None].expand(-1, 1, self.d_inner)  # (b, 1, e)
        h_last = h.gather(1, last).squeeze(1)  # h at each row's last real position: (b, e)
        h_last = torch.where(lengths[:, None] > 0, h_last, h0)  # a row with no real position keeps h_0
        return self._out(h, mask), h_last

    def forward_ref(
        self, x: Tensor, state: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The reference path, whatever ``fast_path`` says: the equations as a loop over time."""
        x, h0, mask = self._prepare(x, state, mask)
        return self._loop(x, h0, mask)

    def _projection(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """Gate and candidate pre-activations [k | u]: (b, t, d) x (d, 2e) -> (b, t, 2e)."""
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)  # padded inputs never enter the arithmetic
        return self.in_proj(x)

    def _loop(self, x: Tensor, h: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        k, u = self._projection(x, mask).chunk(2, dim=-1)  # 2 x (b, t, e)
        z, one_minus_z, h_tilde = torch.sigmoid(k), torch.sigmoid(-k), _g(u)  # σ(-k), not 1 - σ(k): see step
        if mask is not None:
            z = z * mask[..., None]  # z_t = 0 at padding: h_t = h_{t-1}
            one_minus_z = one_minus_z.masked_fill(~mask[..., None], 1.0)
        hs = []
        for z_t, keep_t, h_tilde_t in zip(z.unbind(1), one_minus_z.unbind(1), h_tilde.unbind(1), strict=True):
            h = keep_t * h + z_t * h_tilde_t  # (1 - z_t) ⊙ h_{t-1} + z_t ⊙ h̃_t, each (b, e)
            hs.append(h)
        return self._out(torch.stack(hs, 1), mask), h  # (b, t, e) -> (b, t, d)

    def _out(self, h: Tensor, mask: Tensor | None = None) -> Tensor:
        y = h if self.out_proj is None else self.out_proj(h)  # (b, t, e) x (e, d) -> (b, t, d)
        return y if mask is None else y.masked_fill(~mask[..., None], 0.0)  # padding outputs zero

    # ---- one position at a time ----------------------------------------------------------------------

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x_t (b, d), h (b, e) -> y_t (b, d), h' (b, e): one iteration of the loop, O(1) in the context."""
        check_input("MinGRU.step", x_t, self.d_model, self.in_proj.weight, step=True, what="x_t")
        h = self._check_state(state, x_t)
        k, u = self.in_proj(x_t).chunk(2, dim=-1)  # (b, d) x (d, 2e) -> 2 x (b, e)
        # 1 - z as σ(-k): 1 - σ(k) rounds to 0 for k > 17 in float32 (37 in float64), where σ(-k) is exact
        h = torch.sigmoid(-k) * h + torch.sigmoid(k) * _g(u)
        return self._out(h), h

    def extra_repr(self) -> str:
        s = f"{self.d_model}, d_inner={self.d_inner}, chunk_size={self.chunk_size}"
        return s + (", fast_path=False" if not self.fast_path else "")


# ---- registration as a token mixer (seqlab.layers.mixer) -------------------------------------------------


@dataclass
class MinGRUMixerConfig:
    expand: int = 2
    """Hidden width d_inner = expand * d_model (see the module docstring for why 2)."""

    def __post_init__(self):
        check_positive_ints(self, ("expand",))


def _build_mingru(d_model: int, c: MinGRUMixerConfig, *, dropout: float, device=None, dtype=None) -> MinGRU:
    # no dropout inside the layer, like the other recurrent mixers: the backbone has its own
    return MinGRU(d_model, c.expand, device=device, dtype=dtype)


register_mixer(
    MixerSpec(
        "mingru",
        MinGRUMixerConfig,
        _build_mingru,
        family="RNN",
        summary="minGRU, gates from the input only, parallel log-space scan (Feng et al. 2024)",
        year=2024,
        step_cost=0.9,  # a lab run's training step: 0.88x the LSTM's (docs/adding-a-mixer.md, section 7)
    )
)
