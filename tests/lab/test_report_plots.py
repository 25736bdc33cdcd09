"""The compare plots: legends outside the data, plain tick labels, chance lines, bars in the family palette."""

import pytest

from seqlab.lab import report
from seqlab.lab.records import Record
from seqlab.lab.suite import Entry, Suite, _adding
from seqlab.viz.figures import FAMILY_COLOURS, plain_number

MIXERS = ["gru", "lstm", "attention", "mamba"]
SUITE = Suite(
    "plots",
    8_000,
    1,
    (
        _adding(12, 6),
        _adding(24, 6),
        Entry("copy", "T=5", {"seq_len": 5, "batch_size": 4}, 4, "val_accuracy"),
    ),
    decode_contexts=(64, 1024),
    throughput_lengths=(256, 1024),
)


def _records() -> list[Record]:
    out = []
    for i, m in enumerate(MIXERS):
        common = {"mixer": m, "params": 1000, "seconds": 1.0}
        for c in SUITE.decode_contexts:
            for metric, value in (("latency_ms", 0.5 + i + c / 1e4), ("state_bytes", 100.0 * (i + 1) * c)):
                out.append(
                    Record(
                        **common, task="decode", setting=f"context={c}", metric=metric, value=value, x_value=c
                    )
                )
        for t in SUITE.throughput_lengths:
            out.append(
                Record(
                    **common,
                    task="throughput",
                    setting=f"t={t}",
                    metric="train_tokens_per_s",
                    value=1e4 * (i + 1),
                )
            )
        for e in SUITE.entries:
            curve = [[s, 2.0 / (s + i)] for s in range(1, 7)]
            out.append(
                Record(
                    **common,
                    task=e.task,
                    setting=e.setting,
                    metric=e.metric,
                    value=0.5,
                    x_value=e.x_value,
                    curve=curve,
                )
            )
    return out


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """{file name: figure} of every plot write_plots draws, captured before it is saved and closed."""
    drawn = {}
    save = report.write_figure

    def capture(fig, path, **kwargs):
        fig.canvas.draw()
        drawn[path.name] = fig
        return save(fig, path, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "write_figure", capture)
        paths = report.write_plots(tmp_path_factory.mktemp("plots"), SUITE, MIXERS, _records())
    assert sorted(p.name for p in paths) == sorted(drawn)
    return drawn


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize(
    "name", ["decode.png", "throughput.png", "accuracy_vs_length.png", "training_curves.png"]
)
def test_one_legend_outside_every_panel(figures, name):
    fig = figures[name]
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    box = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        if ax.axison:
            assert not _overlaps(box, ax.get_window_extent()), f"{name}: the legend covers a panel"


def test_log_axes_have_plain_decimal_tick_labels(figures):
    for name in ("decode.png", "training_curves.png"):
        for ax in figures[name].axes:
            if ax.axison and ax.get_yscale() == "log":
                labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)]
                assert labels and not any("times" in s or "^" in s or "$" in s for s in labels), labels
    assert [plain_number(x) for x in (1e-4, 0.25, 2, 8192, 1e-5)] == ["0.0001", "0.25", "2", "8,192", "1e-5"]


def test_training_curves_draw_the_chance_level(figures):
    panels = [ax for ax in figures["training_curves.png"].axes if ax.axison]
    chance = [
        [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label().startswith("chance")] for ax in panels
    ]
    assert chance[0] == chance[1] == [pytest.approx(1 / 6)]  # adding: predicting the mean, MSE 1/6
    assert len(chance[2]) == 1 and chance[2][0] > 0  # copy: its baseline loss
    labels = [t.get_text() for t in figures["training_curves.png"].legends[0].get_texts()]
    assert labels[: len(MIXERS)] == MIXERS and labels[-1].startswith("chance")


def test_throughput_bars_are_horizontal_in_the_family_colours(figures):
    from matplotlib.colors import to_hex

    (ax,) = figures["throughput.png"].axes
    bars = ax.patches
    assert len(bars) == len(MIXERS) * len(SUITE.throughput_lengths)
    assert [t.get_text() for t in ax.get_yticklabels()] == MIXERS  # names on the y axis: they never collide
    expected = ["RNN", "RNN", "Transformer", "SSM"] * len(SUITE.throughput_lengths)
    assert [to_hex(b.get_facecolor()) for b in bars] == [FAMILY_COLOURS[f].lower() for f in expected]
