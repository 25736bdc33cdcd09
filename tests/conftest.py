"""Shared test settings and fixtures.

The test models are tiny: one intra-op thread is faster for them than two, and it keeps the suite's timings
stable when the machine is shared.

The property tests (hypothesis) draw the same examples on every run, so that a run of the suite (and CI) passes
or fails on the code alone; ``HYPOTHESIS_PROFILE=explore`` draws fresh ones, to look for new failures (pin each
one found with ``@example``).
"""

import os

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def _graph_names(t: torch.Tensor) -> set[str]:
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.add(type(f).__name__)
        todo += [g for g, _ in f.next_functions]
    return names


@pytest.fixture
def graph_names():
    """The names of the autograd nodes behind a tensor (``graph_names(y)``): which kernel a path ran."""
    return _graph_names
