"""One fast/reference switch for every layer with two paths (STYLE.md: "one way to do one thing").

A layer with a fast path (a fused kernel, a chunked or FFT form) and a reference path (the equations written
out, usually a loop over time) offers the same three things:

* ``fast_path: bool = True``, a constructor argument: False makes ``forward`` take the reference path;
* ``forward_ref(...)``, forward's signature, always the reference path;
* ``why_not_fast_path(x=None) -> str | None``: None when ``forward`` would take the fast path for ``x``,
  otherwise the reason. When the fast path is wanted (``fast_path=True``) but cannot be taken, ``forward``
  logs the reason once per layer class and reason, on the logger of the layer's module.

Nothing on the layer records which path the last call took: a test compares against ``forward_ref``, or
patches one path with ``monkeypatch`` to see that the other ran.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from torch import Tensor, nn

__all__ = ["FastPathMixin", "hook_reason"]

_logged: set[tuple[str, str]] = set()  # (layer class, reason) pairs already logged: each is said once


class FastPathMixin:
    """``why_not_fast_path`` and the once-only log for an ``nn.Module`` with a ``fast_path`` attribute.

    Subclasses extend ``why_not_fast_path`` with their own reasons (calling ``super()`` first) and call
    ``self._take_fast_path(x)`` in ``forward`` to choose the path.
    """

    fast_path: bool = True

    def why_not_fast_path(self, x: Tensor | None = None) -> str | None:
        """Why ``forward`` would take the reference path for this input, or None if it takes the fast one."""
        return None if self.fast_path else "fast_path=False was set on this layer"

    def _take_fast_path(self, x: Tensor | None = None) -> bool:
        """True for the fast path; a wanted fast path that cannot be taken says why, once."""
        reason = self.why_not_fast_path(x)
        if reason is None:
            return True
        key = (type(self).__qualname__, reason)
        if self.fast_path and key not in _logged:  # an opt-out (fast_path=False) needs no explanation
            _logged.add(key)
            logging.getLogger(type(self).__module__).info(
                "%s takes the reference path: %s", type(self).__name__, reason
            )
        return False


def hook_reason(named_modules: Iterable[tuple[str, nn.Module]]) -> str | None:
    """Why a fused path that skips these modules' calls would skip a forward hook a user registered (global, or
    on one of the modules), or None when it skips nothing."""
    hooks = nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return "global forward hooks are registered"
    for name, m in named_modules:
        if m._forward_hooks or m._forward_pre_hooks:
            return f"module {name or 'model'} has forward hooks"
    return None
