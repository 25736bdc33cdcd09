"""Matched parameter budgets: the width of each mixer's model chosen so every family gets the same budget.

Every family is built on the same backbone (``seqlab.models.lm``) with the same depth, channel mixer ratio
and vocabulary; only ``d_model`` moves. What differs per mixer comes from its registration
(``seqlab.layers.mixer_spec``), never from a name here: the block layout (``channel_mlp``: Mamba's block
carries its own gated expansion, in_proj to 2 x expand x d with a silu gate, and replaces both attention and
the MLP in its paper, in MambaForCausalLM and in seqlab's presets) and the step of d_model
(``width_multiple``: attention's heads need an even width for RoPE). Each mixer keeps its own default fields.
Counting happens on the meta device, so nothing is allocated.

The time a run costs is budgeted here too: :func:`run_cost` in relative units, and a :class:`Calibration`
(a few training steps timed on this machine) that turns units into seconds.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from seqlab.layers.mixer import make_mixer_config, mixer_spec
from seqlab.models import build, make_config
from seqlab.tasks.base import torch_threads

if TYPE_CHECKING:
    from seqlab.lab.suite import Entry, Suite
    from seqlab.training import TrainConfig

log = logging.getLogger("seqlab.lab")


def layout(mixer: str) -> dict[str, Any]:
    """The mixer's departure from the shared block: ``{"d_ff": 0}`` where its block has no channel MLP."""
    return {} if mixer_spec(mixer).channel_mlp else {"d_ff": 0}


def lm_fields(mixer: str, d_model: int, base: dict[str, Any]) -> dict[str, Any]:
    """The LM config fields of one lab model: ``base`` (depth, the task's sizes), the mixer, its width and
    its :func:`layout`. No field of the mixer's own config is named: each mixer keeps its defaults."""
    return {**base, **layout(mixer), "mixer": mixer, "d_model": d_model}


def width_multiple(mixer: str) -> int:
    """The step of d_model for ``mixer`` at its default config (attention: 2 x n_heads)."""
    return mixer_spec(mixer).width_multiple(make_mixer_config(mixer))


def width_range(step: int, lo: int = 16, hi: int = 256) -> range:
    """The widths from ``lo`` to ``hi`` that are multiples of ``step`` (a mixer's :func:`width_multiple`): the
    d_model values the speech and video suites search."""
    return range(step * -(-lo // step), hi + 1, step)


def count(mixer: str, d_model: int, base: dict[str, Any]) -> int:
    model = build("lm", make_config("lm", lm_fields(mixer, d_model, base)), device=torch.device("meta"))
    return sum(p.numel() for p in model.parameters())


def match_width(
    mixer: str, budget: int, base: dict[str, Any], multiple: int | None = None, lo: int = 8, hi: int = 2048
) -> tuple[int, int]:
    """(d_model, parameters) with the parameter count closest to ``budget``; d_model a multiple of ``multiple``
    (default: the mixer's registered width step)."""
    multiple = multiple or width_multiple(mixer)
    best: tuple[int, int] | None = None
    a, b = lo // multiple, hi // multiple
    while a <= b:  # parameter count grows with d_model: binary search, then look at both neighbours
        mid = (a + b) // 2
        n = count(mixer, mid * multiple, base)
        if n < budget:
            a = mid + 1
        else:
            b = mid - 1
    for m in (b, a):
        if lo // multiple <= m <= hi // multiple:
            n = count(mixer, m * multiple, base)
            if best is None or abs(n - budget) < abs(best[1] - budget):
                best = (m * multiple, n)
    if best is None:
        raise ValueError(f"no width in [{lo}, {hi}] for mixer {mixer!r}")
    return best


def lab_model_fields(mixer: str, suite: Suite, overrides: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(LM config fields, parameters) of ``mixer``'s model in ``suite``: the suite's depth, the task's sizes
    (``overrides``, e.g. vocab_size) and the width that matches the suite's budget."""
    base = {"n_layers": suite.n_layers, **overrides}
    d_model, params = match_width(mixer, suite.budget, base)
    return lm_fields(mixer, d_model, base), params


def build_lab_model(mixer: str, suite: Suite, overrides: dict[str, Any], seed: int):
    """(model, d_model, parameters): ``mixer``'s model in ``suite`` (:func:`lab_model_fields`), seeded."""
    fields, params = lab_model_fields(mixer, suite, overrides)
    torch.manual_seed(seed)
    return build("lm", make_config("lm", fields)), fields["d_model"], params


def _tokens_per_step(entry: Entry) -> int:
    args = entry.task_args
    return args.get("batch_size", 32) * (args.get("seq_len", 64) + args.get("n_tokens", 0))


def run_cost(mixer: str, entry: Entry) -> float:
    """A run's rough cost: steps x tokens per step x the mixer's relative step cost."""
    return mixer_spec(mixer).step_cost * entry.steps * _tokens_per_step(entry)


@dataclass(frozen=True)
class Calibration:
    """A few training steps of one run, timed on this machine before the runs start."""

    mixer: str
    entry: Entry
    step_s: float
    """Seconds per training step of that run."""
    setup_s: float
    """Seconds to build its task, model and trainer and take the first (warm-up) step."""

    @property
    def per_cost(self) -> float:
        """Seconds per unit of :func:`run_cost`."""
        return self.step_s * self.entry.steps / run_cost(self.mixer, self.entry)


def calibrate(
    suite: Suite,
    mixer: str,
    entry: Entry,
    config: TrainConfig,
    threads: int | None = None,
    budget_s: float = 2.0,
) -> Calibration:
    """Time training steps of ``mixer`` on ``entry`` with the ordinary trainer and ``config`` (at least 3,
    for about ``budget_s`` seconds), with ``threads`` torch threads as the runs will have."""
    from seqlab.tasks import create_task
    from seqlab.training import Trainer

    seed = config.seed
    with torch_threads(threads):
        t0 = time.perf_counter()
        task = create_task(entry.task, **entry.task_args, seed=seed)
        model, _, _ = build_lab_model(mixer, suite, task.model_overrides(), seed)
        trainer = Trainer(model.train(), task, config)
        trainer.train_step()  # the first step pays for lazy initialization
        setup = time.perf_counter() - t0
        n, t1 = 0, time.perf_counter()
        while n < 3 or (n < entry.steps and time.perf_counter() - t1 < budget_s):
            trainer.train_step()
            n += 1
        return Calibration(mixer, entry, (time.perf_counter() - t1) / n, setup)


def makespan(seconds: list[float], workers: int) -> float:
    """Wall time of runs of these lengths on ``workers`` processes, longest first to the least-loaded one."""
    loads = [0.0] * max(1, workers)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(loads, loads[0] + s)
    return max(loads)


# ---- the timed suites (translation, captioning): each model gets the same minutes ----------------------

MIN_STEPS = 50
"""The fewest steps a model of the translation and captioning suites trains, whatever ``minutes`` fits."""
MAX_MINUTES = 24 * 60
"""The most minutes of training a model of those suites may be given: a day each."""


def check_budget(minutes: float, threads: int | None, models: int) -> None:
    """``--minutes`` and ``--threads`` of a suite that trains ``models`` for ``minutes`` each, refused before
    any work when out of range."""
    if not 0 < minutes <= MAX_MINUTES:  # NaN too
        raise ValueError(
            f"--minutes is each model's training time: more than 0 and at most {MAX_MINUTES} (a day; the suite "
            f"trains {models} models), got {minutes:g}"
        )
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"--threads is each run's torch threads, a positive whole number; got {threads!r}")


def floored_steps(label: str, minutes: float, step_s: float) -> int:
    """The steps that fit in ``minutes`` at ``step_s`` seconds a step, at least :data:`MIN_STEPS` (said)."""
    fit = int(60 * minutes / step_s)
    if fit < MIN_STEPS:
        log.warning(
            "%s: %g min fits %d steps here (%.2f s a step); it trains the suite's minimum, %d steps (about %.0f s)",
            label,
            minutes,
            fit,
            step_s,
            MIN_STEPS,
            MIN_STEPS * step_s,
        )
    return max(MIN_STEPS, fit)
