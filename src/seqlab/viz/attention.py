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

__all__ = ["plot_alignment", "plot_attention", "token_labels", "write_attention_maps"]


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


@torch.no_grad()
def write_attention_maps(
    model,
    tokenizer,
    text: str,
    out_dir: str | Path,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
) -> list[Path]:
    """Run ``text`` through ``model`` and write ``layer{L}-head{H}.png`` for the chosen layers and heads."""
    if not hasattr(model, "attention_maps"):
        raise ValueError(f"{type(model).__name__} has no attention maps (a GPT checkpoint is needed)")
    ids = tokenizer.encode(text)
    if ids.numel() == 0:
        raise ValueError("the text is empty: give at least one token")
    device = next(model.parameters()).device
    model.eval()
    maps = model.attention_maps(ids[None].to(device), layers)  # {layer: (1, h, t, t)}
    labels = token_labels(tokenizer, ids.tolist())
    written = []
    for layer, w in maps.items():
        n_heads = w.size(1)
        chosen = list(range(n_heads)) if heads is None else heads
        bad = [h for h in chosen if not 0 <= h < n_heads]
        if bad:
            raise ValueError(
                f"heads {bad} out of range: layer {layer} has {n_heads} heads (0 ... {n_heads - 1})"
            )
        for h in chosen:
            path = Path(out_dir) / f"layer{layer}-head{h}.png"
            written.append(plot_attention(w[0, h], labels, path, f"layer {layer}, head {h}"))
    return written
