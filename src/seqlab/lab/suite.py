"""The suites of ``seqlab compare``: which tasks, at which settings, for how many steps.

Each entry trains every mixer (by default every registered one, ``seqlab.layers.list_mixers()``) on one task
setting with the same budget of steps, batch and learning rate, and reads one headline metric at the end.
``quick`` (the default, under 10 minutes on 2 CPU cores with ``--jobs 2``) shows the directions with fewer
steps and shorter sequences; ``full`` (under an hour) runs the settings where the published orderings
appear: the adding problem to T=200, selective copying over regions of 64 and 128, recall, induction heads
tested at 4x the training length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    task: str
    setting: str
    """A short label for the table, e.g. 'T=100'."""
    task_args: dict[str, Any]
    steps: int
    metric: str
    """The headline metric, a key of the task's evaluate() (e.g. 'val_accuracy')."""
    higher_is_better: bool = True
    lr: float = 2e-3
    x_value: float | None = None
    """Where this setting sits on the plot's x axis (e.g. the sequence length)."""
    extra_metrics: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Suite:
    name: str
    budget: int
    """Parameters per model; each mixer's width is chosen to match it."""
    n_layers: int
    entries: tuple[Entry, ...]
    decode_contexts: tuple[int, ...] = (64, 512, 2048, 8192)
    """Context lengths at which decode latency and state size are measured."""
    throughput_lengths: tuple[int, ...] = (256, 1024)
    """Sequence lengths of the training-throughput measurement; activation memory is taken at the longest."""
    gradient_length: int = 100
    """Length T of the adding problem in the gradient-flow plot of the recurrent cells."""
    gradient_steps: int = 0
    """Training steps before the plot's second panel; 0: at initialization only."""
    timing_cap_s: float = 30.0
    """Seconds each systems timing (decode; throughput at each length) may repeat to bring its spread down."""


def _adding(T: int, steps: int, batch: int = 32) -> Entry:
    args = {"seq_len": T, "batch_size": batch}
    return Entry("adding", f"T={T}", args, steps, "val_mse", higher_is_better=False, lr=3e-3, x_value=T)


def _selective_copy(T: int, k: int, steps: int, batch: int = 32) -> Entry:
    args = {"seq_len": T, "n_tokens": k, "batch_size": batch}
    return Entry("selective_copy", f"T={T}, {k} tokens", args, steps, "val_accuracy", lr=3e-3, x_value=T)


def _recall(pairs: int, steps: int) -> Entry:
    args = {"n_pairs": pairs, "n_queries": pairs, "batch_size": 32}
    return Entry("associative_recall", f"pairs={pairs}", args, steps, "val_accuracy", lr=3e-3, x_value=pairs)


def _induction(T: int, steps: int) -> Entry:
    args = {"seq_len": T, "test_seq_len": 4 * T, "batch_size": 32}
    return Entry("induction", f"train {T}, test {4 * T}", args, steps, "val_accuracy", x_value=T)


def _shakespeare(steps: int) -> Entry:
    args = {"seq_len": 128, "batch_size": 16, "sampling": "random"}
    return Entry("shakespeare", "chars", args, steps, "val_loss", higher_is_better=False)


def _mnist1d(steps: int) -> Entry:
    return Entry("seq_image", "mnist1d", {"source": "mnist1d", "batch_size": 32}, steps, "val_accuracy")


# Both suites train 2-layer models at a 60k-parameter budget with one torch thread per run (``--jobs 2`` on
# 2 cores); the step counts below were chosen from measured learning curves on such a machine: Mamba's
# chunked scan is the costly step (about 8x an LSTM's), so the suites spend steps where an ordering appears.
QUICK = Suite(
    name="quick",
    budget=60_000,
    n_layers=2,
    entries=(
        _adding(50, 500),
        _selective_copy(64, 4, 800),
        _recall(8, 800),
        _induction(64, 500),
        _shakespeare(200),
        _mnist1d(300),
    ),
    decode_contexts=(64, 1024, 8192),
    throughput_lengths=(1024,),
    gradient_length=60,
    gradient_steps=300,  # the plot's point: after training the gated cells still carry the gradient back
)

FULL = dataclasses.replace(
    QUICK,  # the same models: the budget and depth of the quick suite
    name="full",
    entries=(
        _adding(50, 500),
        _adding(100, 1000),
        _adding(200, 1000),
        _selective_copy(64, 4, 1500),
        _selective_copy(128, 4, 2500),
        _recall(8, 1200),
        _induction(64, 1000),
        _shakespeare(600),
        _mnist1d(800),
    ),
    decode_contexts=(64, 512, 2048, 8192),
    throughput_lengths=(256, 1024, 4096),
    gradient_length=200,
    gradient_steps=300,
)

SUITES = {"quick": QUICK, "full": FULL}
"""The suites of every mixer on the synthetic probes, Shakespeare and MNIST-1D (``seqlab.lab.compare``)."""

OTHER_SUITES = {
    "translation": "four encoder-decoders on the Bible pairs, --minutes each (2 at a time by default)",
    "captioning": "Show and Tell, Show-Attend-Tell and ViT + Transformer on generated scenes, --minutes each",
    "video": "every mixer on actions, frame events, captions and long-range actions (8-30 min)",
    "timeseries": "every mixer against naive, seasonal-naive and linear forecasts; --tasks picks data sets",
    "speech": "every mixer on spoken keywords and CTC digit strings (15-45 min)",
}
"""The suites with their own runners (``seqlab.lab.translation``, ``captioning``, ``video``, ``timeseries``,
``speech``): name -> what they compare."""


def suite_names() -> list[str]:
    """Every suite ``seqlab compare --suite`` takes."""
    return [*SUITES, *OTHER_SUITES]
