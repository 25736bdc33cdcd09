"""Sampling from causal models through their ``init_state`` / ``step`` interface.

The prompt is read in one parallel (or fused) forward pass; every new token then costs one ``step``:
O(1) in the context length for recurrent and state-space models, O(t) for attention with a KV cache.

A model whose positions are a learned table (``model.context_limit``, e.g. GPT-2's 1,024) cannot step past
its last position. When the cache is full, generation slides: it re-reads the last ``context_limit // 2``
tokens into a fresh cache and goes on stepping, so every token is predicted from at least half a window of
context and the re-reading costs O(1) amortized forward passes per token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import Tensor, nn

STREAM_EVERY = 8  # tokens per stretch that a decoder looping in one call hands to generate's on_tokens


def widened(logits: Tensor) -> Tensor:
    """Logits in float32 at least, for their log-softmax: half precisions widened, float64 kept as it is."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def check_token_ids(ids: Tensor, vocab_size: int) -> None:
    """Token ids must be integers in [0, vocab_size): a clear error here instead of an IndexError in embedding."""
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.long, torch.int32):
        got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        hint = "; set d_input for features" if isinstance(ids, Tensor) and ids.is_floating_point() else ""
        raise ValueError(f"expected token ids as an int64 (or int32) tensor, got {got}{hint}")
    if ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))  # one pass over the ids
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"token ids must be in [0, {vocab_size}) for a vocabulary of {vocab_size}; "
                f"got values from {lo} to {hi}"
            )


def _is_real(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_step_tokens(owner: str, tokens: Tensor, batch: int, vocab_size: int) -> None:
    """A decoder step's input: one token id per row, (batch,), in the vocabulary (the state's batch)."""
    if not isinstance(tokens, Tensor) or tokens.shape != (batch,):
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(
            f"{owner}.step expects one token id per row, ({batch},) as the state holds, got {got}"
        )
    check_token_ids(tokens, vocab_size)


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not (_is_real(temperature) and 0 <= temperature < math.inf):  # NaN fails too
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    if top_p is not None and not (_is_real(top_p) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")


def is_greedy(temperature: float) -> bool:
    """Temperature 0, or one that float32 holds as 0 (below about 1e-45: the logits over it would be 0 / 0),
    decodes greedily."""
    return temperature == 0 or float(torch.tensor(temperature, dtype=torch.float32)) == 0.0


def _check_logits(logits: Tensor) -> None:
    """Logits (b, vocab) of real floats, none NaN or +inf and not all -inf in a row (one host sync)."""
    if (
        not isinstance(logits, Tensor)
        or logits.dim() != 2
        or logits.size(-1) == 0
        or not logits.is_floating_point()
    ):
        got = (
            f"{logits.dtype} of shape {tuple(logits.shape)}"
            if isinstance(logits, Tensor)
            else type(logits).__name__
        )
        raise ValueError(f"expected logits (b, vocab) of floats with vocab >= 1, got {got}")
    top = logits.amax(dim=-1)
    if bool(torch.isnan(logits).any() | ~torch.isfinite(top).all()):
        raise ValueError(
            "the logits hold NaN or +inf, or a row is all -inf (a diverged model?): there is no token to pick"
        )


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row of ``logits`` (b, vocab) -> (b,). ``temperature=0`` is greedy (argmax), and so is
    one that float32 rounds to 0 (:func:`is_greedy`). Computed in float32, or in float64 for float64 logits.

    top-k keeps the k most likely tokens; top-p (nucleus, Holtzman et al. 2019, arXiv 1904.09751) keeps the
    smallest set whose probability mass reaches p. Both filters may be combined; the most likely token
    always survives.
    """
    _check_sampling(temperature, top_k, top_p)
    _check_logits(logits)
    if is_greedy(temperature):
        return logits.argmax(dim=-1)
    logits = widened(logits)  # half precisions to float32; float64 kept (a cast to float32 could overflow it)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # the top at 0: no overflow at any T
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (b, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above this one
        drop_sorted = mass_before >= top_p  # the top token has mass_before 0 and is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@contextmanager
def evaluating(model):
    """``model.eval()`` inside the block; afterwards every module's own train/eval flag as it was before (a part
    frozen in eval mode stays there). A model-like object that is not an ``nn.Module`` gets ``train(was)``."""
    flags = [(m, m.training) for m in model.modules()] if isinstance(model, nn.Module) else None
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        if flags is None:
            model.train(was_training)
        else:
            for m, flag in flags:
                m.training = flag


def check_request(
    prompt_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None
) -> None:
    """The arguments of :func:`generate`, checked before any work (even when no token is drawn)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    _check_sampling(temperature, top_k, top_p)
    ok = isinstance(prompt_ids, Tensor) and prompt_ids.dim() in (1, 2) and prompt_ids.dtype == torch.long
    if not ok or prompt_ids.size(-1) == 0:
        got = (
            f"{prompt_ids.dtype} of shape {tuple(prompt_ids.shape)}"
            if isinstance(prompt_ids, Tensor)
            else type(prompt_ids).__name__
        )
        raise ValueError(f"prompt_ids must be a non-empty long tensor (b, t) or (t,), got {got}")


@torch.inference_mode()
def generate(
    model,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    on_tokens: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """prompt_ids (b, t) or (t,) long -> (b, t + max_new_tokens): the prompt followed by the continuation.

    ``on_tokens``, if given, is called with each stretch of new tokens (b, k) as soon as it is drawn, for a
    caller that shows the sample as it grows: every token, or every STREAM_EVERY tokens on a decoder that runs
    its loop in one call (run in stretches then: the same tokens and draws as one call)."""
    check_request(prompt_ids, max_new_tokens, temperature, top_k, top_p)  # before any work
    tell = on_tokens or (lambda new: None)
    squeeze = prompt_ids.dim() == 1
    ids = prompt_ids.unsqueeze(0) if squeeze else prompt_ids
    limit = getattr(model, "context_limit", None)  # None: the state can grow (or stays O(1)) without bound
    with evaluating(model):
        window = ids if limit is None else ids[:, -limit:]
        logits, state = model(window, return_state=True)  # (b, t, vocab): read the prompt in one pass
        logits, held = logits[:, -1], window.size(1)  # held: positions in the state
        out = [ids]
        # a decoder that runs the whole loop in one call: greedy, or sampled with sample_next's law and draws
        loops = getattr(model, "loops", None)
        if loops is not None and max_new_tokens > 1 and loops(state, max_new_tokens - 1):
            nxt = sample_next(logits, temperature, top_k, top_p, generator)  # (b,)
            out.append(nxt[:, None])
            tell(out[-1])
            stretch = STREAM_EVERY if on_tokens is not None else max_new_tokens
            sampling = (temperature, top_k, top_p, generator)
            out += _looped(model, nxt, state, max_new_tokens - 1, sampling, stretch, tell)
            max_new_tokens = 0
        for i in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, top_p, generator)  # (b,)
            out.append(nxt[:, None])
            tell(out[-1])
            if i == max_new_tokens - 1:
                break
            if limit is not None and held >= limit:  # the position table is used up: slide the window
                tail = torch.cat(out, dim=1)[:, -(limit // 2 or 1) :]
                logits, state = model(tail, return_state=True)
                logits, held = logits[:, -1], tail.size(1)
            else:
                logits, state = model.step(nxt, state)  # (b, vocab)
                held += 1
    res = torch.cat(out, dim=1)
    return res[0] if squeeze else res


def _looped(model, nxt: Tensor, state: int, n: int, sampling: tuple, stretch: int, tell) -> list[Tensor]:
    """n tokens after ``nxt`` (b,) from a decoder that loops in one call (``greedy``/``sample`` from its
    position ``state``), ``stretch`` at a time, each stretch handed to ``tell`` as it comes."""
    temperature, top_k, top_p, generator = sampling
    out = []
    while n > 0:
        k = min(n, stretch)
        if is_greedy(temperature):
            rest = model.greedy(nxt, state, k)  # (b, k)
        else:
            rest = model.sample(nxt, state, k, temperature, top_k, top_p, generator)
        out.append(rest)
        tell(rest)
        n, state, nxt = n - k, state + k, rest[:, -1]
    return out
