"""Positional encodings made visible: what each scheme writes, and what attention can read from it.

Four panels, all computed from seqlab's own layers (``seqlab.layers.positional``):

1. The sinusoidal table P (Vaswani et al. 2017, sec. 3.5), positions x channels:
   P[p, 2i] = sin(p / base^(2i/d)), P[p, 2i+1] = cos(p / base^(2i/d)); fast channels on the left, slow ones
   on the right, so every position gets a distinct code.
2. P Pᵀ: the dot product of two positions' codes depends only on their distance (a band along the
   diagonal), the property that lets a linear map attend by relative offset.
3. RoPE (Su et al. 2021, arXiv 2104.09864): the score ⟨R_m q, R_n k⟩ for one fixed pair q = k of unit-norm
   random vectors, against the offset m - n. It is the same at every absolute position (relative by
   construction) and its envelope decays with distance, the "long-term decay" of the paper's sec. 3.4.3.
4. The 2-D sinusoidal code of a patch grid (ViT-style, half the channels for rows, half for columns): the
   dot product of every patch's code with the code of one chosen patch (marked +), which falls off with the
   2-D distance between the two patches.

The panels sit in a 2 x 2 grid (1210 x 990 pixels at the default size).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from seqlab.layers.positional import RotaryEmbedding, sinusoidal_2d_table, sinusoidal_table
from seqlab.viz.figures import pyplot, save_figure


def rope_scores(head_dim: int, max_offset: int, base: float = 10000.0, seed: int = 0) -> Tensor:
    """⟨RoPE(q, m), RoPE(k, n)⟩ for m - n = 0 .. max_offset, with q = k a unit random vector: (max_offset + 1,).

    Computed at two absolute positions (n = 0 and n = 1000) and averaged; the two agree to rounding, which
    the tests check (the score depends on the offset only).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(head_dim, generator=g)
    q = q / q.norm()
    rope = RotaryEmbedding(head_dim, base=base)
    offsets = torch.arange(max_offset + 1)
    scores = []
    for start in (0, 1000):
        x = q.expand(max_offset + 1, head_dim)[None, None]  # (1, 1, t, k)
        rq = rope(x, positions=start + offsets)[0, 0]  # query at positions start + offset
        rk = rope(q[None, None, None], positions=torch.tensor([start]))[0, 0, 0]  # key at position start
        scores.append(rq @ rk)  # (t,)
    return torch.stack(scores).mean(0)


def plot_positions(
    out: str | Path,
    n_positions: int = 128,
    d_model: int = 64,
    base: float = 10000.0,
    grid: int = 14,
) -> Path:
    """Write the four panels, 2 x 2, to ``out`` (PNG); returns the path."""
    if n_positions < 2 or d_model < 2 or d_model % 4 or grid < 2:
        raise ValueError(
            f"need n_positions >= 2, grid >= 2 and d_model a positive multiple of 4 (2-D codes split it in "
            f"four); got n_positions={n_positions}, d_model={d_model}, grid={grid}"
        )
    if n_positions > 8192 or d_model > 4096 or grid > 64:  # a figure, not a table: beyond these it is noise
        raise ValueError(  # (and the grid's similarity map is grid^4 floats: 10000 ran out of memory)
            f"draw at most 8192 positions, d_model 4096 and a grid of 64; got n_positions={n_positions}, "
            f"d_model={d_model}, grid={grid}"
        )
    plt = pyplot()

    table = sinusoidal_table(n_positions, d_model, base)  # (t, d)
    sim = table @ table.T  # (t, d) x (d, t) -> (t, t)
    rope = rope_scores(d_model, n_positions - 1, base)
    codes = sinusoidal_2d_table(grid, grid, d_model, base)  # (grid * grid, d)
    centre = (grid // 2) * grid + grid // 3
    patch_sim = (codes @ codes[centre]).view(grid, grid)  # (grid, grid)

    fig, axes = plt.subplots(2, 2, figsize=(11, 9))
    axes = axes.flat
    im = axes[0].imshow(table.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    axes[0].set(title=f"sinusoidal table P, d={d_model}", xlabel="channel (fast ← → slow)", ylabel="position")
    fig.colorbar(im, ax=axes[0], fraction=0.046, label="P[position, channel]")
    im = axes[1].imshow(sim.numpy(), cmap="viridis")
    axes[1].set(
        title="P Pᵀ: dot product of two positions' codes\n(depends only on their distance)",
        xlabel="position",
        ylabel="position",
    )
    fig.colorbar(im, ax=axes[1], fraction=0.046, label="dot product")
    axes[2].plot(rope.numpy())
    axes[2].set(
        title="RoPE: score ⟨R_m q, R_n q⟩ against the offset m − n",
        xlabel="offset m − n (the same at every absolute position)",
        ylabel="score (1 at offset 0)",
    )
    axes[2].grid(alpha=0.3)
    im = axes[3].imshow(patch_sim.numpy(), cmap="viridis")
    axes[3].plot(centre % grid, centre // grid, "r+", markersize=14, mew=2)
    axes[3].set(
        title=f"2-D sinusoidal codes, {grid}×{grid} patches:\neach patch's code · the code of the patch marked +",
        xlabel="patch column",
        ylabel="patch row",
    )
    fig.colorbar(im, ax=axes[3], fraction=0.046, label="dot product (high: near the marked patch)")
    return save_figure(fig, out)
