"""A clip as a strip of frames, with the true and the predicted label under each frame (a frame-level model), the
clip's true and predicted action or caption above it, and for an attentive caption model which frames each
word looked at (temporal attention, Yao et al. 2015, arXiv 1502.08029, Figure 4).

Notation: ``t`` frames, ``c`` channels, ``S`` frame side, ``n`` words.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from seqlab.viz.figures import pyplot, save_figure

__all__ = ["MAX_FRAMES_DRAWN", "plot_clip"]

MAX_FRAMES_DRAWN = 48
"""A longer clip is drawn as one frame in k (a 1,000-frame clip made a figure 850 inches wide)."""


def _pixels(frame: Tensor):
    """uint8 or [0, 1] float (c, S, S) -> an array imshow draws: (S, S) grey or (S, S, 3)."""
    x = frame.float() / 255.0 if not frame.is_floating_point() else frame.float().clamp(0, 1)
    return (x[0] if x.size(0) == 1 else x.permute(1, 2, 0)).numpy()


def _check_attention(words: list[str] | None, attention: Tensor | None, t: int) -> None:
    if (words is None) != (attention is None):
        raise ValueError("words and attention go together: the attention has one row per word")
    if attention is not None and tuple(attention.shape) != (len(words), t):
        raise ValueError(
            f"attention must be (words, frames) = ({len(words)}, {t}), got {tuple(attention.shape)}"
        )


def plot_clip(
    frames: Tensor,
    path: str | Path,
    title: str = "",
    true_labels: list[str] | None = None,
    predicted: list[str] | None = None,
    words: list[str] | None = None,
    attention: Tensor | None = None,
) -> Path:
    """Draw a clip's frames (t, c, S, S) in a row (one in k of a clip longer than ``MAX_FRAMES_DRAWN``); under
    frame i, ``true_labels[i]`` and ``predicted[i]`` (red where they differ); with ``words`` and ``attention``
    (n, t), a heat map of each word's weights over all t frames below the strip (each row sums to one)."""
    if frames.dim() != 4:
        raise ValueError(f"frames must be (t, c, S, S), got {tuple(frames.shape)}")
    t = frames.size(0)
    for name, labels in (("true_labels", true_labels), ("predicted", predicted)):
        if labels is not None and len(labels) != t:
            raise ValueError(f"{name} needs one label per frame ({t}), got {len(labels)}")
    _check_attention(words, attention, t)
    plt = pyplot()
    stride = -(-t // MAX_FRAMES_DRAWN)  # 1 up to MAX_FRAMES_DRAWN frames
    drawn = list(range(0, t, stride))
    rows = 1 if attention is None else 2
    heights = [1.0] if attention is None else [1.0, 0.25 * len(words) + 0.4]
    fig = plt.figure(
        figsize=(max(6.0, 0.85 * len(drawn)), 1.6 + (0 if attention is None else 0.25 * len(words) + 0.6))
    )
    grid = fig.add_gridspec(rows, len(drawn), height_ratios=heights, hspace=0.45, wspace=0.05)
    for column, i in enumerate(drawn):
        ax = fig.add_subplot(grid[0, column])
        ax.imshow(_pixels(frames[i]), cmap="gray", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(str(i), fontsize=7)
        if true_labels is not None or predicted is not None:
            truth = true_labels[i] if true_labels is not None else ""
            guess = predicted[i] if predicted is not None else ""
            wrong = true_labels is not None and predicted is not None and truth != guess
            ax.set_xlabel(f"{truth}\n{guess}", fontsize=6, color="tab:red" if wrong else "black")
    if attention is not None:
        ax = fig.add_subplot(grid[1, :])
        ax.imshow(attention.detach().float().cpu().numpy(), aspect="auto", cmap="magma", vmin=0)
        ax.set_yticks(range(len(words)), words, fontsize=7)
        # a column per frame, the drawn ones named
        ax.set_xticks(drawn, [str(i) for i in drawn], fontsize=6)
        ax.set_xlabel("frame each word attends to", fontsize=7)
    notes = [] if stride == 1 else [f"one frame in {stride} of {t} drawn"]
    if true_labels is not None or predicted is not None:
        notes.append("under each frame: true, then predicted (red: wrong)")
    if notes:
        fig.text(0.01, 0.02, "; ".join(notes), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.8 if title else 0.92, bottom=0.12)
    return save_figure(
        fig, path, tight=False
    )  # a gridspec placed by hand: tight_layout warned and misplaced it
