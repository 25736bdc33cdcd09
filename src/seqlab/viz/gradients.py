"""The vanishing gradient made visible: ‖∂L/∂h_t‖ against t for RNN, LSTM and GRU.

The loss is read at the last position only (the adding problem: the answer is due at the end), so every
gradient that reaches an early hidden state has travelled back through the recurrence, multiplied at each
step by the Jacobian ∂h_{t+1}/∂h_t (Bengio et al. 1994; Pascanu et al. 2013, arXiv 1211.5063). For a tanh RNN
that product shrinks geometrically; the LSTM's additive cell path (c_t = f ⊙ c_{t-1} + i ⊙ g) and the GRU's
interpolation (h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}) let it survive.

The hidden states are taken from a step-by-step unroll of the model's own recurrent layer (``step``), so each
h_t is a node of the graph and ``h_t.grad`` is the full derivative ∂L/∂h_t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seqlab.viz import GRADIENT_CELLS
from seqlab.viz.figures import mixer_styles, pyplot, save_figure

MAX_GRADIENT_LENGTH = 5_000
MAX_GRADIENT_D_MODEL = 512
MAX_GRADIENT_CELLS = 640_000
"""Bounds of the figure's unroll: every step keeps its graph and hidden state for ``retain_grad``, so memory grows
with length x d_model (on CPU, 10,000 x 64 peaked at 2.4 GB and 2,000 x 1,024 at 6.2 GB; 1e8 steps used all
23 GB of a machine). length x d_model is at most MAX_GRADIENT_CELLS: about 2.5 GB at the peak."""


@dataclass
class GradientFlow:
    cell: str
    trained_steps: int
    norms: list[float]
    """Mean over the batch of ‖∂L/∂h_t‖₂, for t = 1..T (last layer's hidden state)."""
    final_mse: float

    def summary(self) -> str:
        """One line: how much of the gradient at the last position reaches the first, and the val MSE."""
        ratio = self.norms[0] / self.norms[-1] if self.norms[-1] else float("nan")
        return (
            f"{self.cell:<5} trained {self.trained_steps:>5} steps: |dL/dh_1| / |dL/dh_T| = {ratio:.2e}, "
            f"val MSE {self.final_mse:.4f}"
        )


def _hidden(state) -> Tensor:
    """The hidden state tensor of the top layer's recurrence, as it sits in the model's state (so that its
    gradient is the full dL/dh_t): (l, b, H) with the top layer last. The LM's state is a list of per-layer
    states, each h or (h, c) of shape (1, b, H); a stacked recurrent layer's is h or (h, c) of (L, b, H)."""
    if isinstance(state, list):
        state = state[-1]
    return state[0] if isinstance(state, tuple) else state  # the LSTM's h, not its cell c


def gradient_norms(model, task, batch_index: int = 0) -> tuple[list[float], float]:
    """‖∂L/∂h_t‖ for one validation batch of ``task`` through a stacked recurrent LM with feature inputs."""
    batch = task.get_batch("val", batch_index)
    x, y = batch["x"], batch["y"]
    was_training = model.training
    model.eval()
    hs: list[Tensor] = []
    state = model.init_state(x.size(0))
    for t in range(x.size(1)):
        _, state = model.step(x[:, t], state)
        h = _hidden(state)  # (l, b, H)
        h.retain_grad()
        hs.append(h)
    pred = model.head(hs[-1][-1]).squeeze(-1)  # read the answer from h_T itself, so h_T is on the loss path
    loss = torch.nn.functional.mse_loss(pred, y.view(-1))
    loss.backward()
    model.train(was_training)
    norms = [h.grad[-1].norm(dim=-1).mean().item() for h in hs]  # last layer, mean over the batch
    model.zero_grad(set_to_none=True)
    return norms, loss.item()


def gradient_flow(
    cells: tuple[str, ...] = GRADIENT_CELLS,
    seq_len: int = 200,
    d_model: int = 64,
    train_steps: int = 0,
    seed: int = 0,
    progress: bool = False,
) -> list[GradientFlow]:
    """Measure ‖∂L/∂h_t‖ on the adding problem for each cell, at initialization or after ``train_steps``."""
    from seqlab.models import create
    from seqlab.tasks.synthetic import AddingTask
    from seqlab.training import TrainConfig, Trainer

    results = []
    for cell in cells:
        torch.manual_seed(seed)
        task = AddingTask(seq_len=seq_len, batch_size=32, seed=seed)
        model = create(f"test-{cell}-lm", **task.model_overrides(), d_model=d_model, n_layers=1)
        if train_steps > 0:
            cfg = TrainConfig(
                steps=train_steps,
                lr=3e-3,
                warmup_steps=min(50, train_steps),
                eval_every=0,
                eval_batches=4,
                progress=progress,
                seed=seed,
            )
            Trainer(model, task, cfg).fit()
        norms, mse = gradient_norms(model, task)
        results.append(GradientFlow(cell, train_steps, norms, mse))
    return results


def gradient_flow_groups(
    cells: tuple[str, ...],
    seq_len: int,
    d_model: int,
    train_steps: int,
    seed: int = 0,
    progress: bool = False,
) -> list[list[GradientFlow]]:
    """The flows at initialization and, when ``train_steps`` > 0, after that much training: one plot panel each.
    Sizes past :data:`MAX_GRADIENT_LENGTH`, :data:`MAX_GRADIENT_D_MODEL` or :data:`MAX_GRADIENT_CELLS` are a
    ValueError, before any work."""
    check_size(seq_len, d_model)
    groups = [gradient_flow(cells, seq_len, d_model, 0, seed)]
    if train_steps > 0:
        groups.append(gradient_flow(cells, seq_len, d_model, train_steps, seed, progress=progress))
    return groups


def check_size(seq_len: int, d_model: int) -> None:
    """A ValueError naming the bounds when the unroll of ``seq_len`` steps of width ``d_model`` would not fit."""
    if not (2 <= seq_len <= MAX_GRADIENT_LENGTH and 1 <= d_model <= MAX_GRADIENT_D_MODEL) or (
        seq_len * d_model > MAX_GRADIENT_CELLS
    ):
        raise ValueError(
            f"the gradient figure unrolls at most {MAX_GRADIENT_LENGTH:,} steps (length >= 2) of width at most "
            f"{MAX_GRADIENT_D_MODEL} with length x d_model <= {MAX_GRADIENT_CELLS:,} (about 2.5 GB; every step "
            f"is kept for its gradient); got length {seq_len:,}, d_model {d_model:,}"
        )


FLOOR = 1e-30
"""Where an exactly zero ‖∂L/∂h_t‖ is drawn: a log axis has no zero, so the plot clamps it here and says so."""


def plot_gradient_flow(groups: list[list[GradientFlow]], path, title: str | None = None) -> None:
    """One panel per group, log-scale ‖∂L/∂h_t‖ against t: pass ``gradient_flow_groups(...)`` with
    ``train_steps`` > 0 for the two panels "at initialization" and "after N training steps". A gradient that is
    exactly zero is drawn at :data:`FLOOR` inside a hatched band labelled as such, not as a measured value."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False, sharey=True)
    styles = mixer_styles(
        [r.cell for group in groups for r in group]
    )  # the family palette: shades of RNN blue
    for ax, group in zip(axes[0], groups, strict=True):
        for r in group:
            ax.semilogy(
                range(1, len(r.norms) + 1),
                [max(n, FLOOR) for n in r.norms],
                label=f"{r.cell} (val MSE {r.final_mse:.3f})",
                color=styles[r.cell]["color"],
                linestyle=styles[r.cell]["linestyle"],
            )
        steps = group[0].trained_steps if group else 0
        ax.set_title("at initialization" if steps == 0 else f"after {steps} training steps")
        ax.set_xlabel("position t (loss read at the last position)")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    if any(n <= FLOOR for group in groups for r in group for n in r.norms):
        for ax in axes[0]:
            _mark_floor(ax)
    axes[0][0].set_ylabel("‖∂L/∂h_t‖")
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def _mark_floor(ax) -> None:
    """A hatched band at the bottom of the panel up to just above :data:`FLOOR`, labelled as clamped zeros."""
    ax.set_ylim(bottom=FLOOR / 100)
    ax.axhspan(FLOOR / 100, FLOOR * 10, facecolor="none", edgecolor="0.6", hatch="///", lw=0, zorder=0)
    ax.axhline(FLOOR, color="0.4", ls=":", lw=1)
    ax.annotate(
        "zero (clamped for the log scale)",
        (0.5, FLOOR * 10),
        xycoords=("axes fraction", "data"),
        xytext=(0, 2),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=8,
        color="0.25",
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
    )
