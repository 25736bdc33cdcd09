"""The report of ``seqlab compare``: results.json, the textbook table with measured numbers, and plots.

Families and block layouts come from the mixer registry (``seqlab.layers.mixer_spec``), so a newly
registered mixer appears in its family's column without a change here.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import re
from collections import defaultdict
from pathlib import Path

import torch

from seqlab.lab.records import Record, first_value, select, write_figure, write_output, write_results
from seqlab.lab.suite import Entry, Suite
from seqlab.layers.mixer import mixer_spec
from seqlab.viz.figures import (
    FAMILY_COLOURS,
    chance_line,
    mixer_family,
    mixer_styles,
    outside_legend,
    plain_log_axis,
    plain_number,
    pyplot,
    unique_handles,
)

__all__ = ["chance_loss", "cpu_name", "hardware_slug", "write_plots", "write_results", "write_table"]


def _fmt(value: float | None, metric: str) -> str:
    if value is None or value != value:
        return "–"
    if metric == "state_bytes" or metric == "activation_bytes":
        for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if value >= size:
                return f"{value / size:.1f} {unit}"
        return f"{value:.0f} B"
    if metric == "train_tokens_per_s":
        return f"{value:,.0f}"
    if metric == "latency_ms":
        return f"{value:.3f}"
    if metric == "val_accuracy":
        return f"{100 * value:.1f}%"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def flat_ratio(records: list[Record], mixer: str) -> float | None:
    """Decode latency at the longest context over that at the shortest; None without two contexts."""
    rows = sorted(select(records, mixer=mixer, task="decode", metric="latency_ms"), key=lambda r: r.x_value)
    return rows[-1].value / rows[0].value if len(rows) >= 2 and rows[0].value > 0 else None


CLAIMS = {
    "RNN": ("sequential in t", "O(1) per token, fixed state", "fades with distance; gates help"),
    "Transformer": ("parallel over t", "O(t) per token, KV cache grows", "direct access to any position"),
    "SSM": ("parallel over t", "O(1) per token, fixed state", "LTI: fixed kernel; selective: content-based"),
}
"""What the textbooks assert per family: training, decoding, memory (the table's first rows)."""


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_slug(name: str, words: int | None = None) -> str:
    """A file-name form of a CPU or GPU name: "Intel(R) Xeon(R) Processor" -> intel-xeon-processor; ``words``
    keeps only the first few (intel-xeon)."""
    plain = re.sub(r"\((r|tm)\)", "", name.lower())
    parts = re.sub(r"[^a-z0-9]+", "-", plain).strip("-").split("-")
    return "-".join(parts[:words])


def _cell(records: list[Record], mixer: str, fmt: str, **match) -> str | None:
    """The formatted value of the mixer's record matching ``match``; None when there is none."""
    hit = select(records, mixer=mixer, **match)
    return _fmt(hit[0].value, fmt) if hit else None


def _entry_label(entry: Entry) -> str:
    return f"{entry.task} {entry.setting}: {entry.metric} {'↑' if entry.higher_is_better else '↓'}"


def _family(mixer: str) -> str:
    return mixer_spec(mixer).family


def _family_table(suite: Suite, mixers: list[str], records: list[Record]) -> list[str]:
    """The textbook table: one column per family, the claim, then each member's measured number per row."""
    families = [f for f in CLAIMS if any(_family(m) == f for m in mixers)]
    lines = ["| | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]

    def row(label: str, value) -> None:  # value(mixer) -> its cell text, or None
        cells = []
        for f in families:
            parts = [f"{m} {v}" for m in mixers if _family(m) == f and (v := value(m)) is not None]
            cells.append("<br>".join(parts) or "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for i, what in enumerate(("training", "decoding", "memory")):
        lines.append(f"| textbook: {what} | " + " | ".join(CLAIMS[f][i] for f in families) + " |")
    longest = max(suite.throughput_lengths)
    row(
        f"training tokens/s (t={longest})",
        lambda m: _cell(records, m, "train_tokens_per_s", task="throughput", setting=f"t={longest}"),
    )
    c0, c1 = suite.decode_contexts[0], suite.decode_contexts[-1]
    row(
        f"decode latency, context {c1} / {c0}",
        lambda m: None if (x := flat_ratio(records, m)) is None else f"{x:.2f}×",
    )

    def state(m: str) -> str | None:
        a, b = (
            _cell(records, m, "state_bytes", task="decode", setting=f"context={c}", metric="state_bytes")
            for c in (c0, c1)
        )
        return f"{a} → {b}" if a and b else None

    row(f"state at context {c0} → {c1}", state)
    for entry in suite.entries:
        row(
            _entry_label(entry),
            lambda m, e=entry: _cell(records, m, e.metric, task=e.task, setting=e.setting),
        )
    return lines


def _intro(suite: Suite, mixers: list[str], jobs: int) -> str:
    own = [m for m in mixers if not mixer_spec(m).channel_mlp]  # blocks that carry their own expansion
    layout = (
        f"; {', '.join(own)} without the MLP, as in {'its paper' if len(own) == 1 else 'their papers'}"
        if own
        else ""
    )
    schedule = (
        f"trained {jobs} runs at a time with one torch thread each"
        if jobs > 1
        else "trained one run at a time"
    )
    return (
        f"Measured on {cpu_name()}, torch {torch.__version__}; every model is the shared backbone "
        f"(norm, token mixer, residual, norm, MLP, residual{layout}) with {suite.n_layers} layers at a budget "
        f"of {suite.budget:,} parameters, {schedule}. Speed and memory were measured afterwards with "
        f"{torch.get_num_threads()} threads, the models taking turns round by round until each timing's "
        f"interquartile range was under 10% of its median or its time cap ran out."
    )


def _mixer_table(
    suite: Suite, mixers: list[str], records: list[Record], verdicts: dict[str, str] | None = None
) -> list[str]:
    """One column per mixer: parameters, speed, memory, decoding, then each suite entry's metric; ``verdicts``
    from ``seqlab.lab.decode.scaling_verdict`` (else the medians' ratio against 1.2×)."""
    lines = [
        "| | " + " | ".join(f"{m} ({_family(m)})" for m in mixers) + " |",
        "|---|" + "---:|" * len(mixers),
    ]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def cells(fmt: str, **match) -> list[str]:
        return [_cell(records, m, fmt, **match) or "–" for m in mixers]

    p = {m: next((r.params for r in records if (r.mixer, r.task) == (m, "throughput")), 0) for m in mixers}
    row("parameters (the systems rows' model)", [f"{p[m]:,}" if p[m] else "–" for m in mixers])
    for length in suite.throughput_lengths:
        row(
            f"training tokens/s, b=8, t={length}",
            cells("train_tokens_per_s", task="throughput", setting=f"t={length}"),
        )
    longest = max(suite.throughput_lengths)
    row(f"activation memory (saved for backward), b=8, t={longest}", cells("activation_bytes", task="memory"))
    for ctx in suite.decode_contexts:
        row(
            f"decode ms/token at context {ctx}",
            cells("latency_ms", task="decode", setting=f"context={ctx}", metric="latency_ms"),
        )
    c0, c1 = suite.decode_contexts[0], suite.decode_contexts[-1]
    ratios = [flat_ratio(records, m) for m in mixers]
    row(
        f"decode latency {c1} / {c0}",
        [
            "–" if r is None else f"{r:.2f}× ({(verdicts or {}).get(m) or ('flat' if r <= 1.2 else 'grows')})"
            for m, r in zip(mixers, ratios, strict=True)
        ],
    )
    for ctx in (c0, c1):
        row(
            f"state size at context {ctx}",
            cells("state_bytes", task="decode", setting=f"context={ctx}", metric="state_bytes"),
        )
    for entry in suite.entries:
        row(_entry_label(entry), cells(entry.metric, task=entry.task, setting=entry.setting))
    return lines


def write_table(
    out: Path,
    suite: Suite,
    mixers: list[str],
    records: list[Record],
    jobs: int = 1,
    verdicts: dict[str, str] | None = None,
) -> Path:
    """``out/table.md``: the textbook table by family, measured, then every mixer's numbers."""
    lines = [
        f"# seqlab compare --suite {suite.name}",
        "",
        _intro(suite, mixers, jobs),
        "",
        "## The textbook table, measured",
        "",
        *_family_table(suite, mixers, records),
        "",
        "## Every mixer",
        "",
        *_mixer_table(suite, mixers, records, verdicts),
        "",
        "Decode latency is the median time of one `step` after reading the context; 'flat' means the ratio of "
        "the two contexts' timings, round by round, stays within 1.2× over its interquartile range, 'grows' "
        "above it, 'unclear' otherwise. State size counts every tensor of the carried state. "
        "Activation memory counts the bytes autograd saves for the backward pass of one forward.",
    ]
    return write_output(out / "table.md", "\n".join(lines) + "\n")


def _x_ticks(ax, values) -> None:
    """Tick a log x axis exactly at the measured ``values``, written out (64, 1,024, 8,192)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(sorted(set(values)), [plain_number(v) for v in sorted(set(values))])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _decode_plot(plt, mixers: list[str], records: list[Record], path: Path) -> Path:
    """Decode latency and state bytes against the context already read, log-log, one legend at the right."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    styles = mixer_styles(mixers)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    contexts = []
    for m in mixers:
        for ax, metric in zip(axes, ("latency_ms", "state_bytes"), strict=True):
            rows = sorted(select(records, mixer=m, task="decode", metric=metric), key=lambda r: r.x_value)
            if rows:
                contexts += [r.x_value for r in rows]
                ax.loglog([r.x_value for r in rows], [max(r.value, 1e-9) for r in rows], label=m, **styles[m])
    axes[0].set_ylabel("ms per generated token")
    plain_log_axis(axes[0])
    axes[1].set_ylabel("carried state")
    axes[1].yaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt(v, "state_bytes").replace(".0 ", " ")))
    axes[1].yaxis.set_minor_formatter(NullFormatter())
    for ax in axes:
        ax.set_xlabel("context length already read (tokens)")
        ax.grid(alpha=0.3, which="both")
        _x_ticks(ax, contexts)
    fig.suptitle("decoding: O(1) state vs a growing KV cache")
    fig.tight_layout()
    outside_legend(fig, *unique_handles(axes[:1]), title="mixer")
    return write_figure(fig, path)


def _throughput_plot(plt, suite: Suite, mixers: list[str], records: list[Record], path: Path) -> Path:
    """Training tokens/s per mixer as horizontal bars in the family's colour, one bar per sequence length."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    lengths = suite.throughput_lengths
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.32 * len(mixers) * len(lengths)))
    height = 0.8 / max(1, len(lengths))
    hatches = ("", "//", "..", "xx")
    colours = [FAMILY_COLOURS[mixer_family(m)] for m in mixers]
    for j, length in enumerate(lengths):
        vals = [first_value(records, 0, mixer=m, task="throughput", setting=f"t={length}") for m in mixers]
        y = [i + j * height for i in range(len(mixers))]
        bars = ax.barh(y, vals, height, color=colours, hatch=hatches[j % 4], edgecolor="white", linewidth=0.5)
        ax.bar_label(bars, [f" {v:,.0f}" for v in vals], fontsize=7)
    ax.set_yticks([i + height * (len(lengths) - 1) / 2 for i in range(len(mixers))], mixers)
    ax.invert_yaxis()  # the registry's order, top to bottom
    ax.margins(x=0.15)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("training tokens/s (batch 8; higher is faster)")
    ax.set_title("training throughput (forward + backward + step)")
    ax.grid(alpha=0.3, axis="x")
    labels = list(dict.fromkeys(mixer_family(m) for m in mixers))  # the families, in the mixers' order
    handles = [Patch(color=FAMILY_COLOURS[f]) for f in labels]
    if len(lengths) > 1:
        handles += [Patch(facecolor="#bbbbbb", hatch=hatches[j % 4]) for j in range(len(lengths))]
        labels += [f"t={t}" for t in lengths]
    fig.tight_layout()
    outside_legend(fig, handles, labels)
    return write_figure(fig, path)


def _length_plot(plt, suite: Suite, mixers: list[str], records: list[Record], path: Path) -> Path | None:
    """The headline metric against the sequence length, one panel per task with several settings."""
    by_task: dict[str, list[Entry]] = defaultdict(list)
    for e in suite.entries:
        by_task[e.task].append(e)
    multi = {t: es for t, es in by_task.items() if len(es) > 1 and all(e.x_value for e in es)}
    if not multi:
        return None
    styles = mixer_styles(mixers)
    fig, axes = plt.subplots(1, len(multi), figsize=(5 * len(multi), 4), squeeze=False)
    for ax, (task, es) in zip(axes[0], multi.items(), strict=True):
        for m in mixers:
            pts = [(e.x_value, first_value(records, mixer=m, task=task, setting=e.setting)) for e in es]
            pts = [(x, v) for x, v in pts if v is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=m, **styles[m])
        ax.set_xlabel("sequence length")
        ax.set_ylabel(f"{es[0].metric} ({'higher' if es[0].higher_is_better else 'lower'} is better)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    outside_legend(fig, *unique_handles(axes[0]), title="mixer")
    return write_figure(fig, path)


def chance_loss(entry: Entry) -> float | None:
    """The training loss of a guess that ignores the input on ``entry``'s task: the task's ``baseline_loss``
    (uniform over the possible answers), ``baseline_mse`` (predicting the mean), else ln(vocab_size) (uniform
    over the vocabulary); None when the task says none of these or cannot be built here."""
    return _chance_loss(entry.task, json.dumps(entry.task_args, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _chance_loss(task_name: str, args: str) -> float | None:
    from seqlab.tasks import create_task
    from seqlab.tasks.base import MissingDependencyError

    try:
        task = create_task(task_name, **json.loads(args))
    except (MissingDependencyError, OSError, ValueError):
        return None
    for name in ("baseline_loss", "baseline_mse"):
        value = getattr(task, name, None)
        if isinstance(value, int | float):
            return float(value)
    vocab = task.model_overrides().get("vocab_size")
    return math.log(vocab) if vocab else None


def _curves_plot(plt, suite: Suite, mixers: list[str], records: list[Record], path: Path) -> Path:
    """Training loss against step, one panel per task setting, its chance level dashed, one legend below."""
    entries = list(suite.entries)
    cols = min(3, len(entries))
    rows_n = (len(entries) + cols - 1) // cols
    styles = mixer_styles(mixers)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.5 * rows_n), squeeze=False)
    for ax, e in zip(axes.flat, entries, strict=False):
        for m in mixers:
            hit = select(records, mixer=m, task=e.task, setting=e.setting)
            if hit and hit[0].curve:
                steps, losses = zip(*hit[0].curve, strict=True)
                style = {k: v for k, v in styles[m].items() if k != "marker"}
                ax.plot(steps, losses, label=m, lw=1.2, **style)
        ax.set_title(f"{e.task} {e.setting}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss" + (" (MSE)" if e.metric.endswith("mse") else ""))
        ax.set_yscale("log")
        chance_line(ax, chance_loss(e), label="chance (a guess that ignores the input)")
        plain_log_axis(ax)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(entries) :]:
        ax.axis("off")
    fig.tight_layout()
    handles, labels = unique_handles(axes.flat)
    outside_legend(fig, handles, labels, where="below", ncol=min(len(labels), 5))
    return write_figure(fig, path, dpi=100)


def write_plots(out: Path, suite: Suite, mixers: list[str], records: list[Record]) -> list[Path]:
    """decode.png, throughput.png, accuracy_vs_length.png (where a task has several lengths) and
    training_curves.png in ``out``; returns the paths written."""
    plt = pyplot()
    paths = [
        _decode_plot(plt, mixers, records, out / "decode.png"),
        _throughput_plot(plt, suite, mixers, records, out / "throughput.png"),
        _length_plot(plt, suite, mixers, records, out / "accuracy_vs_length.png"),
        _curves_plot(plt, suite, mixers, records, out / "training_curves.png"),
    ]
    return [p for p in paths if p is not None]
