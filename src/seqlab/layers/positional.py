r"""Positional information for attention, which on its own is blind to order (permutation-equivariant).

Notation: ``b`` batch, ``t`` positions, ``d`` model width, ``h`` heads, ``k`` head dim, ``p`` a position.

Absolute encodings, added to the token embeddings:

* Sinusoidal (Vaswani et al. 2017, arXiv 1706.03762, section 3.5), interleaved as in the paper:

      PE[p, 2i]   = sin(p / base^(2i/d))
      PE[p, 2i+1] = cos(p / base^(2i/d))          base = 10000

* Learned absolute (GPT-2, BERT): a table ``(max_seq_len, d)`` initialised N(0, 0.02).
* 2-D sinusoidal for a grid of image patches (MAE, He et al. 2021, arXiv 2111.06377): half of the channels
  encode the column and half the row, each half ``[sin | cos]`` (not interleaved), as MAE's
  ``get_2d_sincos_pos_embed`` lays them out.

Relative, applied to queries and keys inside attention:

* Rotary (RoPE, Su et al. 2021, arXiv 2104.09864, eq. 34): pairs of channels of q and k are rotated by an
  angle proportional to the position, ``θ_i = base^(-2i/k)``, so that ``<R(m) q, R(n) k>`` depends on m - n only.
  Two layouts of the pairs exist and checkpoints depend on which one was trained:
  ``interleaved=False`` (default) pairs channel ``i`` with ``i + k/2`` ("rotate half": GPT-NeoX, HF Llama);
  ``interleaved=True`` pairs ``2i`` with ``2i + 1`` (the paper, GPT-J, Meta's original Llama code).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn

from seqlab.validation import check_positive_floats, check_positive_ints

__all__ = [
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_2d_table",
    "sinusoidal_table",
]


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> Tensor:
    """(n_positions, d_model) float32: PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(same angle)."""
    for name, n in (("n_positions", n_positions), ("d_model", d_model)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"sinusoidal_table: {name} must be an integer >= 0, got {n!r}")
    if d_model % 2:
        raise ValueError(f"d_model must be even for sinusoidal positions, got {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (t, 1)
    inv = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    angle = pos * inv  # (t, 1) * (d/2,) -> (t, d/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1)  # (t, d/2, 2): sin and cos side by side
    return pe.flatten(1).float()  # (t, d), interleaved [sin, cos, sin, cos, ...]


def _sincos_halves(pos: Tensor, dim: int, base: float) -> Tensor:
    """MAE's 1-D encoding: (n,) positions -> (n, dim) as [sin(p ω) | cos(p ω)], ω_i = base^(-i / (dim/2))."""
    omega = base ** (-torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))  # (dim/2,)
    angle = pos.double().unsqueeze(1) * omega  # (n, dim/2)
    return torch.cat([angle.sin(), angle.cos()], dim=1)  # (n, dim)


def sinusoidal_2d_table(grid_h: int, grid_w: int, d_model: int, base: float = 10000.0) -> Tensor:
    """(grid_h * grid_w, d_model) float32 for patches in row-major order (patch r * grid_w + c).

    Channels [0, d/2) encode the column c, channels [d/2, d) the row r, each as [sin | cos] (MAE's layout).
    """
    if d_model % 4:
        raise ValueError(f"d_model must be divisible by 4 for 2-D sinusoidal positions, got {d_model}")
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")  # (gh, gw) each
    col = _sincos_halves(cols.flatten(), d_model // 2, base)  # (gh*gw, d/2)
    row = _sincos_halves(rows.flatten(), d_model // 2, base)  # (gh*gw, d/2)
    return torch.cat([col, row], dim=1).float()  # (gh*gw, d)


def _check_positions(owner: str, x: Tensor, d: int, offset) -> int:
    """x (..., t, d) floating and offset an int >= 0 -> t (a negative offset would read rows from the end)."""
    if not isinstance(x, Tensor) or x.dim() < 2 or x.size(-1) != d or not x.is_floating_point():
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{owner} adds positions to x (..., t, {d}) of floats, got {got}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(
            f"{owner}: offset must be an int >= 0 (the position of x's first row), got {offset!r}"
        )
    return x.size(-2)


def _check_rope_offset(x: Tensor, offset, positions) -> None:
    """RotaryEmbedding's offset: an int or a 0-d integer tensor, >= 0 (a tensor's value is read only on the CPU,
    where it costs no device sync: a KV cache's position); positions: integers of shape (t,) or (b, t)."""
    is_int_tensor = isinstance(offset, Tensor) and offset.dim() == 0 and not offset.is_floating_point()
    if isinstance(offset, bool) or not (isinstance(offset, int) or is_int_tensor):
        got = f"{offset.dtype} of shape {tuple(offset.shape)}" if isinstance(offset, Tensor) else repr(offset)
        raise ValueError(f"RotaryEmbedding: offset must be an int or a 0-d integer tensor >= 0, got {got}")
    if (isinstance(offset, int) or offset.device.type == "cpu") and offset < 0:
        raise ValueError(f"RotaryEmbedding: offset must be a position >= 0, got {offset!r}")
    if positions is None:
        return
    b, t = (x.size(0) if x.dim() == 4 else None), x.size(-2)
    ok = isinstance(positions, Tensor) and not positions.is_floating_point() and positions.dtype != torch.bool
    ok = ok and (
        tuple(positions.shape) == (t,) or (positions.dim() == 2 and tuple(positions.shape) == (b, t))
    )
    if not ok:
        got = (
            f"{positions.dtype} of shape {tuple(positions.shape)}"
            if isinstance(positions, Tensor)
            else type(positions).__name__
        )
        raise ValueError(
            f"RotaryEmbedding: positions must be integers of shape (t,) = ({t},) or (b, t) = ({b}, {t}), got {got}"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """x (b, t, d) -> x + PE[offset : offset + t], then dropout (the paper applies dropout to the sum)."""

    def __init__(self, d_model: int, max_seq_len: int = 4096, base: float = 10000.0, dropout: float = 0.0):
        super().__init__()
        args = SimpleNamespace(d_model=d_model, max_seq_len=max_seq_len, base=base)
        check_positive_ints(args, ("d_model", "max_seq_len"), prefix="SinusoidalPositionalEncoding: ")
        check_positive_floats(args, ("base",), prefix="SinusoidalPositionalEncoding: ")
        self.register_buffer("pe", sinusoidal_table(max_seq_len, d_model, base), persistent=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = _check_positions("SinusoidalPositionalEncoding", x, self.pe.size(1), offset)
        if offset + t > self.pe.size(0):
            raise ValueError(f"positions up to {offset + t} exceed max_seq_len={self.pe.size(0)}; raise it")
        return self.drop(x + self.pe[offset : offset + t].to(x.dtype))  # (b, t, d) + (t, d)


class LearnedPositionalEmbedding(nn.Module):
    """x (b, t, d) -> x + weight[offset : offset + t]; weight (max_seq_len, d) initialised N(0, 0.02) as GPT-2."""

    def __init__(self, max_seq_len: int, d_model: int, device=None, dtype=None):
        super().__init__()
        args = SimpleNamespace(d_model=d_model, max_seq_len=max_seq_len)
        check_positive_ints(args, ("max_seq_len", "d_model"), prefix="LearnedPositionalEmbedding: ")
        self.weight = nn.Parameter(torch.empty(max_seq_len, d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = _check_positions("LearnedPositionalEmbedding", x, self.weight.size(1), offset)
        if offset + t > self.weight.size(0):
            raise ValueError(f"positions up to {offset + t} exceed max_seq_len={self.weight.size(0)}")
        return x + self.weight[offset : offset + t]  # (b, t, d) + (t, d)


class RotaryEmbedding(nn.Module):
    r"""Rotary position embedding (RoPE) for queries and keys of shape (b, h, t, k).

    For each pair (x_a, x_b) of channels with frequency θ_i = base^(-2i / rotary_dim) and position p:

        x_a' = x_a cos(p θ_i) - x_b sin(p θ_i)
        x_b' = x_b cos(p θ_i) + x_a sin(p θ_i)

    Pairs are (i, i + rotary_dim/2) with ``interleaved=False`` (HF Llama's ``rotate_half``) and (2i, 2i+1) with
    ``interleaved=True``. ``rotary_dim`` < head_dim rotates only the first ``rotary_dim`` channels (GPT-NeoX's
    partial rotary); the rest pass through. Angles are computed in float32 from the positions on each call
    (cheap next to the projections), so there is no length limit and no table to grow; the rotation runs in
    float32, or in float64 for float64 inputs.

    Call: ``rope(x, offset=0)`` rotates positions offset, offset + 1, ...; ``offset`` may be an int or a 0-d
    tensor (a KV cache's position); ``positions`` (t,) or (b, t) gives arbitrary positions (left padding).
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        interleaved: bool = False,
        rotary_dim: int | None = None,
        device=None,
    ):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        check_positive_ints(self, ("head_dim",), prefix="RotaryEmbedding: ")
        check_positive_floats(self, ("base",), prefix="RotaryEmbedding: ")  # base <= 0: NaN angles
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary_dim}")
        self.head_dim, self.rotary_dim, self.base, self.interleaved = head_dim, rotary_dim, base, interleaved
        self.register_buffer("inv_freq", self._frequencies(device), persistent=False)  # (rotary_dim/2,)

    def _frequencies(self, device) -> Tensor:
        """θ_i = base^(-2i / rotary_dim), (rotary_dim/2,) float32."""
        r = self.rotary_dim
        return self.base ** (-torch.arange(0, r, 2, dtype=torch.float32, device=device) / r)

    def _apply(self, fn, recurse=True):
        """Moves and casts of the module (``.to``, ``.half()``, ``.bfloat16()``) keep θ float32: a bfloat16 θ
        was off by up to 0.4%, so the same weights rotated otherwise after a cast than when built in bfloat16."""
        super()._apply(fn, recurse)
        self.inv_freq = self._frequencies(self.inv_freq.device)
        return self

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions (..., t) -> cos, sin (..., t, rotary_dim/2), float32."""
        angle = positions.float().unsqueeze(-1) * self.inv_freq  # (..., t, 1) * (r/2,) -> (..., t, r/2)
        return angle.cos(), angle.sin()

    def forward(self, x: Tensor, offset: int | Tensor = 0, positions: Tensor | None = None) -> Tensor:
        """x (b, h, t, k) -> x rotated, same shape and dtype."""
        if not isinstance(x, Tensor) or x.size(-1) != self.head_dim or not x.is_floating_point():
            got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(
                f"RotaryEmbedding expects floats with head dim {self.head_dim} in the last axis, got {got}"
            )
        _check_rope_offset(x, offset, positions)
        t = x.size(-2)
        if positions is None:
            positions = torch.arange(t, device=x.device) + offset  # (t,)
        cos, sin = self.cos_sin(positions.to(x.device))  # (t, r/2) or (b, t, r/2)
        if cos.dim() == 3:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (b, 1, t, r/2): the same angles for every head
        return self.rotate(x, cos, sin)

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x (b, h, t, k) rotated by given angles: cos, sin broadcastable to (b, h, t, rotary_dim/2)."""
        r = self.rotary_dim
        xr, rest = x[..., :r].to(torch.promote_types(x.dtype, torch.float32)), x[..., r:]  # float64 stays
        if self.interleaved:
            a, b = xr[..., 0::2], xr[..., 1::2]  # (b, h, t, r/2) each: the pairs (2i, 2i+1)
        else:
            a, b = xr[..., : r // 2], xr[..., r // 2 :]  # (b, h, t, r/2) each: the pairs (i, i + r/2)
        a2, b2 = a * cos - b * sin, b * cos + a * sin
        # interleaved: (b, h, t, r/2, 2) -> (b, h, t, r); rotate-half: [a2 | b2] (b, h, t, r)
        out = torch.stack([a2, b2], dim=-1).flatten(-2) if self.interleaved else torch.cat([a2, b2], dim=-1)
        out = out.to(x.dtype)
        return out if rest.size(-1) == 0 else torch.cat([out, rest], dim=-1)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}"
        )
