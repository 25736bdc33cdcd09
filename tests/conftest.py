"""Shared test settings and fixtures.

The test models are tiny: one intra-op thread is faster for them than two, and it keeps the suite's timings
stable when the machine is shared.

The property tests (hypothesis) draw the same examples on every run, so that a run of the suite (and CI) passes
or fails on the code alone; ``HYPOTHESIS_PROFILE=explore`` draws fresh ones, to look for new failures (pin each
one found with ``@example``).
"""

import contextlib
import os
import warnings

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


class _FailedBuild:
    """A kernel whose build fails as on a machine without a C++ compiler (``failed_build``)."""

    MESSAGE = "error: c++: command not found"

    def __init__(self, monkeypatch):
        self._monkeypatch = monkeypatch

    def __call__(self, extension) -> None:
        """Forget ``extension``'s loaded module (a CppExtension) and make its next build fail."""

        def no_compiler():
            raise RuntimeError(self.MESSAGE)

        self._monkeypatch.setattr(extension, "_loaded", {})
        self._monkeypatch.setattr(extension, "_compile", no_compiler)

    @staticmethod
    @contextlib.contextmanager
    def warns_once(what: str):
        """Inside: the code that uses the kernel, any number of times. After: exactly one warning that ``what``
        could not be built, naming the compiler's error."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        mine = [w for w in caught if f"{what} could not be built" in str(w.message)]
        assert len(mine) == 1 and "command not found" in str(mine[0].message), [
            str(w.message) for w in caught
        ]


@pytest.fixture
def failed_build(monkeypatch):
    """``failed_build(EXTENSION)`` makes that kernel's build fail (no compiler); ``with
    failed_build.warns_once("LayerNorm kernel"):`` checks the one warning a user gets for it."""
    return _FailedBuild(monkeypatch)


@pytest.fixture
def torch_threads():
    """``torch_threads(n)`` runs torch's intra-op work on n threads for the rest of the test (any number of
    calls); the suite's own count comes back after it, passed or failed."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
