"""The suites of ``seqlab compare``: which tasks, at which settings, for how many steps.

Each entry trains every mixer on one task setting with the same budget of steps, batch and learning rate,
and reads one headline metric at the end. ``quick`` (the default, about 10 minutes on 2 CPU cores) shows the
directions at small sizes; ``full`` (about an hour) runs the settings where the published orderings appear.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIXER_ORDER = ("rnn", "lstm", "gru", "attention", "linear-attention", "s4d", "mamba")
FAMILY = {
    "rnn": "RNN",
    "lstm": "RNN",
    "gru": "RNN",
    "attention": "Transformer",
    "linear-attention": "Transformer",
    "s4d": "SSM",
    "mamba": "SSM",
}


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
    throughput_lengths: tuple[int, ...] = (256, 1024)
    gradient_length: int = 100
    gradient_steps: int = 0


def _adding(T: int, steps: int, batch: int = 32) -> Entry:
    return Entry(
        "adding",
        f"T={T}",
        {"seq_len": T, "batch_size": batch},
        steps,
        "val_mse",
        higher_is_better=False,
        lr=3e-3,
        x_value=T,
    )


QUICK = Suite(
    name="quick",
    budget=60_000,
    n_layers=2,
    entries=(
        _adding(50, 250),
        Entry(
            "selective_copy",
            "T=64",
            {"seq_len": 64, "n_tokens": 8, "batch_size": 32},
            250,
            "val_accuracy",
            x_value=64,
        ),
        Entry(
            "associative_recall",
            "pairs=8",
            {"n_pairs": 8, "n_queries": 8, "batch_size": 32},
            250,
            "val_accuracy",
            x_value=8,
        ),
        Entry(
            "induction",
            "train 64, test 256",
            {"seq_len": 64, "test_seq_len": 256, "batch_size": 32},
            250,
            "val_accuracy",
            x_value=64,
        ),
        Entry(
            "shakespeare",
            "chars",
            {"seq_len": 128, "batch_size": 16, "sampling": "random"},
            200,
            "val_loss",
            higher_is_better=False,
        ),
        Entry("seq_image", "mnist1d", {"source": "mnist1d", "batch_size": 32}, 250, "val_accuracy"),
    ),
    decode_contexts=(64, 1024, 8192),
    throughput_lengths=(1024,),
    gradient_length=60,
)

FULL = Suite(
    name="full",
    budget=200_000,
    n_layers=2,
    entries=(
        _adding(100, 1500),
        _adding(200, 1500),
        Entry(
            "selective_copy",
            "T=256",
            {"seq_len": 256, "n_tokens": 16, "batch_size": 32},
            1500,
            "val_accuracy",
            x_value=256,
        ),
        Entry(
            "associative_recall",
            "pairs=16",
            {"n_pairs": 16, "n_queries": 16, "batch_size": 32},
            1500,
            "val_accuracy",
            x_value=16,
        ),
        Entry(
            "induction",
            "train 128, test 512",
            {"seq_len": 128, "test_seq_len": 512, "batch_size": 32},
            1500,
            "val_accuracy",
            x_value=128,
        ),
        Entry(
            "shakespeare",
            "chars",
            {"seq_len": 256, "batch_size": 16, "sampling": "random"},
            800,
            "val_loss",
            higher_is_better=False,
        ),
        Entry(
            "seq_image",
            "fashion-mnist rows",
            {"source": "fashion_mnist", "mode": "rows", "batch_size": 64},
            800,
            "val_accuracy",
        ),
    ),
    decode_contexts=(64, 512, 2048, 8192),
    throughput_lengths=(256, 1024, 4096),
    gradient_length=200,
    gradient_steps=300,
)

SUITES = {"quick": QUICK, "full": FULL}
