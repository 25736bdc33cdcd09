"""What every seqlab plot shares: pyplot on a file-only backend, writing a finished figure, one colour per model
family, plain decimal tick labels on log axes and one legend outside the data.

The family palette is Okabe & Ito's colour-blind-safe set; members of a family get shades of its colour and
their own line style and marker, so a line is identifiable in grey print too. The HTML report
(``seqlab.lab.report_html``) tints its tables with the same colours.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from pathlib import Path

logger = logging.getLogger(__name__)

FAMILY_COLOURS = {"RNN": "#0072B2", "Transformer": "#D55E00", "SSM": "#009E73", "other": "#6E6E6E"}
"""One colour per mixer family (``seqlab.layers.mixer_spec(name).family``); 'other' for anything else."""

LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def pyplot():
    """matplotlib.pyplot on the Agg backend (PNG files, no display), imported on first use: matplotlib is the
    ``lab`` extra, so importing seqlab never needs it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110, tight: bool = True) -> Path:
    """Lay out ``fig`` (``tight``: tight_layout, unless it has a layout engine; a figure placed by hand on a
    gridspec passes False and is cropped to what was drawn), write it to ``path`` (creating the folder) and close it; returns the path.

    A figure with a figure-level legend (:func:`outside_legend`) is cropped to what was drawn, legend included.
    Characters the font lacks (a Chinese sentence in DejaVu Sans) are drawn as boxes: one logged warning names
    them, instead of matplotlib's warning per glyph with its source path.
    """
    path = Path(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if tight and fig.get_layout_engine() is None:
            fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi, bbox_inches="tight" if fig.legends or not tight else None)
    pyplot().close(fig)
    missing = []
    for w in caught:
        if (m := re.search(r"Glyph (\d+) .*missing from", str(w.message))) and chr(int(m[1])) not in missing:
            missing.append(chr(int(m[1])))
        elif not m:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # not ours to hide
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        logger.warning("%s: the font has no glyph for %s; drawn as boxes", path, shown)
    return path


def mixer_family(name: str) -> str:
    """The registered family of mixer ``name`` (RNN, Transformer, SSM), else 'other'."""
    from seqlab.layers.mixer import mixer_spec

    try:
        return mixer_spec(name).family
    except ValueError:
        return "other"


def shade(colour: str, amount: float) -> str:
    """``colour`` (#rrggbb) mixed toward white (amount > 0) or black (amount < 0) by ``|amount|`` in [0, 1]."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    target = 255 if amount > 0 else 0
    mixed = [round(c + (target - c) * abs(amount)) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def mixer_styles(mixers: list[str]) -> dict[str, dict[str, str]]:
    """{mixer: {color, linestyle, marker}}: the family's colour in shades, dark to light in the given order,
    and a line style and marker per member. Pass as ``ax.plot(..., **styles[m])``."""
    by_family: dict[str, list[str]] = {}
    for m in mixers:
        by_family.setdefault(mixer_family(m), []).append(m)
    styles = {}
    for family, members in by_family.items():
        base = FAMILY_COLOURS.get(family, FAMILY_COLOURS["other"])
        n = len(members)
        for i, m in enumerate(members):
            amount = -0.3 + 0.65 * i / (n - 1) if n > 1 else 0.0
            styles[m] = {
                "color": shade(base, amount),
                "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
                "marker": MARKERS[i % len(MARKERS)],
            }
    return styles


def plain_number(x: float) -> str:
    """A tick label without powers of ten where a decimal reads as well: 0.0001, 0.25, 2, 8,192; 1e-05 below."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    if 1e-4 <= abs(x) < 1e6:
        text = f"{x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    exp = math.floor(math.log10(abs(x)))
    return f"1e{exp}" if math.isclose(abs(x), 10.0**exp) else f"{x:.1e}"


def plain_log_axis(ax, axis: str = "y") -> None:
    """Decimal tick labels (0.01, 0.5, 2) instead of 10⁻² or 5×10⁻¹ on a log axis ``axis`` ('x' or 'y');
    minor ticks are labelled too when the axis spans too few decades for the major ones to be enough."""
    from matplotlib.ticker import LogFormatter, LogLocator

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x, pos=None):
            return plain_number(x) if super().__call__(x, pos) else ""

    target = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    shown = [v for v in [*target.get_major_locator()(), *target.get_minor_locator()()] if lo <= v <= hi]
    if len(shown) < 4:  # a narrow axis (2.1 to 4.3): ticks at every half unit too
        target.set_minor_locator(LogLocator(subs=(1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9)))
    target.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    target.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 1)))


def outside_legend(fig, handles, labels, where: str = "right", ncol: int = 1, title: str | None = None):
    """One legend for the whole figure, outside every panel: at the 'right' of the figure or 'below' it."""
    if where == "below":
        return fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=ncol,
            title=title,
            frameon=False,
        )
    return fig.legend(
        handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), ncol=ncol, title=title, frameon=False
    )


def unique_handles(axes) -> tuple[list, list[str]]:
    """The legend entries of every panel in ``axes``, each label once, in order of first appearance."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


def chance_line(ax, chance: float | None, label: str = "chance") -> None:
    """A dashed black line at the chance level ``chance`` (nothing when None), its value written above it, or
    below it near the top of the panel. Call it after setting the axis scale."""
    if chance is None:
        return
    ax.axhline(chance, color="black", ls=(0, (5, 3)), lw=1, label=label)
    lo, hi = ax.get_ylim()
    below = (math.log(hi / chance) if ax.get_yscale() == "log" else hi - chance) < 0.12 * (
        math.log(hi / lo) if ax.get_yscale() == "log" else hi - lo
    )
    ax.annotate(
        f"chance {chance:.3g}",
        (1, chance),
        xycoords=("axes fraction", "data"),
        xytext=(-2, -3 if below else 3),
        textcoords="offset points",
        ha="right",
        va="top" if below else "bottom",
        fontsize=7,
    )
