r"""The event of each frame of a track (``frame_events``): the per-frame labels of ``seqlab.tasks.clips``.

Events (``EVENTS``) are a pure function of the target's integer positions p_t and visibility v_t, with
d_t = p_t - p_{t-1} and ``last`` the latest non-zero d of the current visible run:
    absent    not v_t
    appeared  v_t and (t = 0 or not v_{t-1})
    still     v_t, v_{t-1} and d_t = 0
    turned    v_t, v_{t-1}, d_t ≠ 0 and d_t · last < 0   (bounces; zigzag kinks, since |Δy| > |Δx|)
    moving    otherwise: v_t, v_{t-1}, d_t ≠ 0, and no earlier step in the run or d_t · last >= 0
No single frame decides its event: it takes the previous frame, and "turned" the whole visible run.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EVENTS", "frame_events"]

EVENTS = ("absent", "appeared", "still", "moving", "turned")


def frame_events(positions, visible) -> np.ndarray:
    """(t,) int64 indices into EVENTS for a track: positions (t, 2) integers, visible (t,) bool."""
    pos, vis = np.asarray(positions), np.asarray(visible, dtype=bool)
    if pos.ndim != 2 or pos.shape[1] != 2 or vis.shape != pos.shape[:1]:
        raise ValueError(f"expected positions (t, 2) and visible (t,), got {pos.shape} and {vis.shape}")
    absent, appeared, still, moving, turned = range(len(EVENTS))
    points, shown = pos.astype(np.int64).tolist(), vis.tolist()
    out, last = [], None  # last: the latest non-zero step of the current visible run
    for i, ((x, y), v) in enumerate(zip(points, shown, strict=True)):
        if not v or i == 0 or not shown[i - 1]:
            out.append(appeared if v else absent)
            last = None
            continue
        dx, dy = x - points[i - 1][0], y - points[i - 1][1]
        if dx == 0 and dy == 0:
            out.append(still)
            continue
        out.append(turned if last is not None and dx * last[0] + dy * last[1] < 0 else moving)
        last = (dx, dy)
    return np.asarray(out, dtype=np.int64)
