"""The O(1) vs O(N) row of the textbook table, measured: per-token decoding latency and state size against
the length of the context already read.

For each model and context length c the model reads c random tokens (the prefill, chunked). A timed unit
then continues that prefix by one untimed token (where a KV cache is copied into a buffer of its own) and
``n_steps`` timed single-token ``step`` calls, so every repeat decodes at context c + 1 .. c + n_steps. The
units of every (model, context) pair run round-robin (:func:`seqlab.lab.records.interleave`) until their
spread is small or a time cap is hit; the median and its interquartile range are reported. The state size is
the number of bytes of every tensor in the state after the prefill: constant for recurrent and state-space
mixers, growing with c for attention's KV cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from seqlab.lab.records import SPREAD_LIMIT, Spread, interleave

FLAT = 1.2
"""Decode latency within this factor of the shortest context's counts as flat."""


def state_bytes(state: Any) -> int:
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, tuple | list):
        return sum(state_bytes(s) for s in state)
    return 0


def _prefill(model, ids: Tensor, chunk: int):
    state = None
    for s in range(0, ids.size(1), chunk):  # chunked prefill: same state, bounded memory (law 2)
        _, state = model(ids[:, s : s + chunk], state=state, return_state=True)
    return state


def _decode_unit(model, tok: Tensor, prefix, n_steps: int, clock: Callable[[], float]) -> Callable[[], float]:
    """A unit of :func:`interleave`: one untimed step from the prefix, then ``n_steps`` timed; s per token."""

    @torch.no_grad()
    def unit() -> float:
        logits, state = model.step(tok, prefix)  # a KV cache leaves the shared prefix here, untimed
        nxt = logits.argmax(-1)
        t0 = clock()
        for _ in range(n_steps):
            logits, state = model.step(nxt, state)
            nxt = logits.argmax(-1)
        return (clock() - t0) / n_steps

    return unit


@torch.no_grad()
def decode_profiles(
    models: dict[str, Any],
    vocab_size: int,
    contexts=(64, 512, 2048, 8192),
    n_steps: int = 32,
    rounds: int = 5,
    time_cap_s: float = 30.0,
    batch_size: int = 1,
    seed: int = 0,
    prefill_chunk: int = 2048,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[dict[str, Any]]]:
    """{model name: [{context, latency_ms, latency_iqr_ms, latency_ms_samples, state_bytes}]}.

    Every (model, context) pair is one contender of :func:`interleave` (at least ``rounds`` rounds, then
    until the spread is below :data:`SPREAD_LIMIT` or ``time_cap_s`` has passed on ``clock``).
    """
    units, sizes = {}, {}
    for name, model in models.items():
        model.eval()
        g = torch.Generator().manual_seed(seed)
        device = next(model.parameters()).device
        for c in contexts:
            ids = torch.randint(0, vocab_size, (batch_size, c), generator=g).to(device)
            prefix = _prefill(model, ids, prefill_chunk)
            sizes[name, c] = state_bytes(prefix)
            tok = torch.randint(0, vocab_size, (batch_size,), generator=g).to(device)
            units[name, c] = _decode_unit(model, tok, prefix, n_steps, clock)
    spreads = interleave(units, min_rounds=rounds, time_cap_s=time_cap_s, clock=clock)
    return {name: [_row(c, spreads[name, c], sizes[name, c]) for c in contexts] for name in models}


def _row(context: int, spread: Spread, size: int) -> dict[str, Any]:
    return {
        "context": context,
        "latency_ms": 1e3 * spread.median,
        "latency_iqr_ms": 1e3 * spread.iqr,
        "latency_ms_samples": [1e3 * s for s in spread.samples],
        "state_bytes": size,
    }


def decode_profile(model, vocab_size: int, contexts=(64, 512, 2048, 8192), **kwargs) -> list[dict[str, Any]]:
    """:func:`decode_profiles` of one model."""
    return decode_profiles({"model": model}, vocab_size, contexts, **kwargs)["model"]


def scaling_verdict(short: Spread, long: Spread, flat: float = FLAT, limit: float = SPREAD_LIMIT) -> str:
    """'flat', 'grows' or 'unclear (...)': the latency ratio long / short, judged with its spread.

    Timings taken in the same rounds (:func:`seqlab.lab.records.interleave`: sample i of every contender comes
    from round i) are compared round by round: a slow phase of the machine slows both timings of a round
    alike, so the ratios of a round's two timings spread far less than either timing does. The ratio's range
    is then the quartiles of those per-round ratios; otherwise q1(long) / q3(short) .. q3(long) / q1(short).
    'grows' when the whole range lies above ``flat``; 'flat' when it lies within 1/``flat`` .. ``flat`` (and,
    unpaired, neither timing is noisy: spread over ``limit``); otherwise 'unclear (noisy)' for a wide range
    and 'unclear (near the line)' for a tight one that straddles (or lies below) the band.
    """
    if len(short.samples) == len(long.samples) >= 5 and min(short.samples) > 0:
        ratios = Spread(tuple(b / a for a, b in zip(short.samples, long.samples, strict=True)))
        lo, _, hi = ratios.quartiles()
        noisy = ratios.noisy(limit)
    else:
        s1, _, s3 = short.quartiles()
        l1, _, l3 = long.quartiles()
        if not (s1 > 0 and s3 > 0):
            return "unclear (noisy)"
        lo, hi = l1 / s3, l3 / s1
        noisy = short.noisy(limit) or long.noisy(limit)
        if noisy and lo <= flat:  # unpaired, a noisy timing settles nothing but a clear rise
            return "unclear (noisy)"
    if lo > flat:
        return "grows"
    if 1 / flat <= lo and hi <= flat:
        return "flat"
    return "unclear (noisy)" if noisy else "unclear (near the line)"


def row_spread(row: dict[str, Any]) -> Spread:
    """The :class:`Spread` of a decode row's latency (ms per token)."""
    return Spread(tuple(row.get("latency_ms_samples") or (row["latency_ms"],)))
