"""Matched parameter budgets: the width of each mixer's model chosen so every family gets the same budget.

Every family is built on the same backbone (``seqlab.models.lm``) with the same depth, channel mixer ratio
and vocabulary; only ``d_model`` moves. What differs per mixer comes from its registration
(``seqlab.layers.mixer_spec``), never from a name here: the block layout (``channel_mlp``: Mamba's block
carries its own gated expansion, in_proj to 2 x expand x d with a silu gate, and replaces both attention and
the MLP in its paper, in MambaForCausalLM and in seqlab's presets) and the step of d_model
(``width_multiple``: attention's heads need an even width for RoPE). Each mixer keeps its own default fields.
Counting happens on the meta device, so nothing is allocated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from seqlab.layers.mixer import make_mixer_config, mixer_spec
from seqlab.models import build, make_config

if TYPE_CHECKING:
    from seqlab.lab.suite import Suite


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
