"""Attention maps: the weights softmax(q kᵀ / √k) of chosen layers and heads, drawn as heatmaps.

Rows are queries (the position being predicted from), columns keys (the positions it reads); a causal
model's map is lower-triangular. The weights come from the model's ``attention_maps(ids, layers)``, which
takes the explicit (``need_weights``) path of :class:`seqlab.layers.attention.MultiheadAttention`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from seqlab.viz.figures import pyplot, save_figure

__all__ = ["plot_alignment", "plot_attention", "plot_attention_grid", "token_labels", "write_attention_maps"]


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """One printable label per token: the decoded token, with whitespace made visible."""
    out = []
    for i in ids:
        s = tokenizer.decode([i])
        out.append(s.replace("\n", "⏎").replace(" ", "␣") or "∅")
    return out


def plot_attention(weights: Tensor, labels: list[str], path: str | Path, title: str = "") -> Path:
    """weights (t_q, t_k) -> one PNG heatmap with the tokens along both axes."""
    plt = pyplot()

    w = weights.detach().float().cpu().numpy()
    t = w.shape[0]
    size = min(12.0, 2.0 + 0.25 * t)
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=max(float(w.max()), 1e-6))
    if t <= 64:  # beyond that the tick labels are unreadable
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, path, dpi=100)


def plot_alignment(
    weights: Tensor, source: list[str], target: list[str], path: str | Path, title: str = ""
) -> Path:
    """An encoder–decoder's attention (n_target, n_source) as Bahdanau et al. 2015 draw it (Figure 3):
    source tokens across the top, target tokens down the side, white = weight 1, black = 0."""
    plt = pyplot()

    w = weights.detach().float().cpu().numpy()
    if w.shape != (len(target), len(source)):
        raise ValueError(
            f"weights {w.shape} do not match {len(target)} target and {len(source)} source tokens"
        )
    fig, ax = plt.subplots(figsize=(min(14.0, 1.5 + 0.32 * len(source)), min(14.0, 1.2 + 0.32 * len(target))))
    ax.imshow(w, cmap="gray", vmin=0.0, vmax=1.0, aspect="auto")
    visible = [[t.replace(" ", "␣") or "∅" for t in side] for side in (source, target)]
    ax.set_xticks(range(len(source)), visible[0], rotation=90, fontsize=8)
    ax.set_yticks(range(len(target)), visible[1], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_title(title, fontsize=9, pad=10)
    return save_figure(fig, path, dpi=110)


def plot_attention_grid(
    maps: dict[int, dict[int, Tensor]], labels: list[str], path: str | Path, title: str = ""
) -> Path:
    """{layer: {head: (t, t) weights}} -> one PNG overview: a row per layer, a column per head, one colour scale."""
    plt = pyplot()

    layers = list(maps)
    n_cols = max(len(heads) for heads in maps.values())
    t = len(labels)
    cell = min(3.0, max(1.6, 0.09 * t))
    fig, axes = plt.subplots(
        len(layers), n_cols, figsize=(cell * n_cols + 1.2, cell * len(layers) + 0.8), squeeze=False
    )
    vmax = max(float(w.max()) for heads in maps.values() for w in heads.values())
    for row, layer in zip(axes, layers, strict=True):
        heads = list(maps[layer].items())
        for col, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(heads):
                ax.axis("off")
                continue
            h, w = heads[col]
            im = ax.imshow(w.detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=max(vmax, 1e-6))
            ax.set_title(f"layer {layer}, head {h}", fontsize=8)
        if t <= 24:  # tokens on the first column's rows; longer texts are read from the per-head files
            row[0].set_yticks(range(t), labels, fontsize=6)
    axes[-1][0].set_xlabel("key (attended to)", fontsize=8)
    axes[0][0].set_ylabel("query", fontsize=8)
    fig.colorbar(im, ax=axes, fraction=0.02, label="attention weight")
    fig.suptitle(title or "attention weights: a row per layer, a column per head")
    return save_figure(fig, path, dpi=100, tight=False)  # cropped to what was drawn, colour bar included


@torch.no_grad()
def write_attention_maps(
    model,
    tokenizer,
    text: str,
    out_dir: str | Path,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    per_head: bool = False,
    overview: str | Path | None = None,
) -> list[Path]:
    """Run ``text`` through ``model`` and write the overview of the chosen layers (rows) and heads (columns) to
    ``overview`` (default ``out_dir/attention.png``); with ``per_head`` also ``out_dir/layer{L}-head{H}.png`` per
    map, larger and with every token. Returns the paths, the overview first."""
    if not hasattr(model, "attention_maps"):
        raise ValueError(
            f"{type(model).__name__} has no attention maps (a language model with attention is needed; an "
            "encoder–decoder's attention over its source: `seqlab viz alignment`)"
        )
    ids = tokenizer.encode(text)
    if ids.numel() == 0:
        raise ValueError("the text is empty: give at least one token")
    device = next(model.parameters()).device
    model.eval()
    maps = model.attention_maps(ids[None].to(device), layers)  # {layer: (1, h, t, t)}
    labels = token_labels(tokenizer, ids.tolist())
    chosen: dict[int, dict[int, Tensor]] = {}
    for layer, w in maps.items():
        n_heads = w.size(1)
        picked = list(range(n_heads)) if heads is None else heads
        bad = [h for h in picked if not 0 <= h < n_heads]
        if bad:
            raise ValueError(
                f"heads {bad} out of range: layer {layer} has {n_heads} heads (0 ... {n_heads - 1})"
            )
        chosen[layer] = {h: w[0, h] for h in picked}  # {head: (t, t)}
    title = f"attention weights on {len(labels)} tokens: a row per layer, a column per head (rows: queries)"
    overview = Path(out_dir) / "attention.png" if overview is None else overview
    written = [plot_attention_grid(chosen, labels, overview, title)]
    for layer, by_head in chosen.items() if per_head else ():
        for h, weights in by_head.items():
            path = Path(out_dir) / f"layer{layer}-head{h}.png"
            written.append(plot_attention(weights, labels, path, f"layer {layer}, head {h}"))
    return written
