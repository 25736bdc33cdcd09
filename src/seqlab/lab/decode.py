"""The O(1) vs O(N) row of the textbook table, measured: per-token decoding latency and state size against
the length of the context already read.

For each context length c the model reads c random tokens in one forward pass (the prefill), then
``n_steps`` single-token ``step`` calls are timed one by one; the median is reported. The state size is the
number of bytes of every tensor in the state after the prefill: constant for recurrent and state-space
mixers, growing with c for attention's KV cache.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import Tensor


def state_bytes(state: Any) -> int:
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, tuple | list):
        return sum(state_bytes(s) for s in state)
    return 0


@torch.no_grad()
def decode_profile(
    model,
    vocab_size: int,
    contexts=(64, 512, 2048, 8192),
    n_steps: int = 32,
    rounds: int = 7,
    batch_size: int = 1,
    seed: int = 0,
    prefill_chunk: int = 2048,
) -> list[dict[str, float]]:
    """[{context, latency_ms, state_bytes}] for each context length.

    Every context is read first; then, ``rounds`` times, each context in turn decodes ``n_steps`` tokens
    (the contexts alternate, so machine noise falls on all of them alike). The latency is the median over
    rounds of the block time divided by ``n_steps``.
    """
    model.eval()
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    states, sizes, toks = [], [], []
    for c in contexts:
        ids = torch.randint(0, vocab_size, (batch_size, c), generator=g).to(device)
        state = None
        for s in range(0, c, prefill_chunk):  # chunked prefill: same state, bounded memory (law 2)
            _, state = model(ids[:, s : s + prefill_chunk], state=state, return_state=True)
        states.append(state)
        sizes.append(state_bytes(state))
        toks.append(torch.randint(0, vocab_size, (batch_size,), generator=g).to(device))
    times: list[list[float]] = [[] for _ in contexts]
    for r in range(rounds + 1):
        for i in range(len(contexts)):
            tok, state = toks[i], states[i]
            t0 = time.perf_counter()
            for _ in range(n_steps):
                logits, state = model.step(tok, state)
                tok = logits.argmax(-1)
            if r > 0:  # the first round warms up
                times[i].append((time.perf_counter() - t0) / n_steps)
            toks[i], states[i] = tok, state
    return [
        {"context": c, "latency_ms": 1e3 * statistics.median(ts), "state_bytes": size}
        for c, ts, size in zip(contexts, times, sizes, strict=True)
    ]
