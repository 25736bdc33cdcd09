r"""Greedy decoding and beam search for every encoder–decoder, batched over sentences and beams.

Notation: ``b`` sentences, ``k`` beams per sentence, ``v`` vocabulary, ``n`` decoding steps taken (at most
``max_len``), ``N`` rows given to the step function (``b`` for greedy, ``b k`` for beam search, row
``r`` = sentence ``r // k``, beam ``r % k``). ``Y`` a hypothesis, ``|Y|`` its tokens, eos included, bos not.

A model takes part through two functions:

    step(last (N,) long, state) -> (log p(· | prefix) (N, v), new state, extra (N, ...) or None)
    reorder(state, rows (N,) long) -> the state of those rows (a beam continues its parent's state)

``extra`` is anything per row to collect along the returned hypotheses, e.g. attention weights (N, s).

Beam search, one loop over time and none over sentences. Each step extends every unfinished beam by every
token and continues every finished beam by pad at no cost (log p unchanged), then keeps the k best of the
k·v candidates of each sentence by *raw* log p(Y). All k beams start from the same bos, so only beam 0 is
alive at first (the others at -inf) and the first step picks k distinct tokens. The final choice uses
GNMT's length penalty (Wu et al. 2016, arXiv 1609.08144, eq. 14):

    score(Y) = log p(Y) / lp(|Y|),    lp(|Y|) = ((5 + |Y|) / 6)^α        (α = 0: no normalization)

Finished hypotheses, the exact rule. A beam that emits eos stays in the beam while it ranks among the k best
by raw log p; it is pushed out only by k candidates of higher raw log p (so a finished beam is never lost to
a candidate it beats on raw log p). Pushed out, it is not forgotten: each sentence keeps the best
*finished* hypothesis by score(Y) among all that ever entered its beam (ties: the earliest, then the one
ranked higher). The result is that hypothesis, or the best by score(Y) of the beams still unfinished after
``max_len`` steps (cut there, |Y| = max_len) if one scores strictly higher. Hence: the result is the best
by score(Y) of every complete hypothesis the search has held; a beam wide enough that no candidate is ever
pushed out (k ≥ the hypotheses alive at any step, finished ones included) is exhaustive search; k = 1 is
greedy decoding. The search stops once every beam of every sentence is finished (or dead, at -inf), or
after ``max_len`` steps. A sentence is finished early once no unfinished beam can still beat its best
finished hypothesis: log p only falls as a hypothesis grows and lp(|Y|) <= lp(max_len), so an unfinished
beam of log p L ends at best at L / lp(max_len) (α >= 0); the result is the one the full search would give. Compared with choosing among the k beams left at the end only (the Transformer's
loop before this module), keeping the best finished hypothesis changes no step of the search and can only
raise the returned score.

Greedy decoding takes the argmax at each step; a row that emitted eos continues with pad until every row
has; its score is the raw log p(Y) (no length penalty, so it equals beam search with k = 1 and α = 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from seqlab.models.generation import evaluating, widened
from seqlab.validation import check_nonnegative, check_positive_ints

__all__ = [
    "Decoded",
    "ReorderFn",
    "StepFn",
    "beam_rows",
    "beam_search",
    "greedy_search",
    "length_penalty_gnmt",
    "never",
    "search",
    "search_model",
]

StepFn = Callable[[Tensor, Any], tuple[Tensor, Any, Tensor | None]]
"""step(last_tokens (N,) long, state) -> (log-probs (N, v) float, new state, extra (N, ...) or None)."""
ReorderFn = Callable[[Any, Tensor], Any]
"""reorder(state, rows (N,) long) -> the state of those rows (rows may repeat)."""


@dataclass
class Decoded:
    tokens: Tensor
    """(b, 1 + n) long: bos first, then the tokens, pad after eos."""
    scores: Tensor
    """(b,) the final score of each returned sequence: log p / lp(|Y|) for beam search, log p for greedy."""
    lengths: Tensor
    """(b,) tokens generated, eos included, bos excluded."""
    extras: Tensor | None
    """(b, n, ...) the step's extras along each returned hypothesis, zeros after eos; None without extras."""


def length_penalty_gnmt(lengths: Tensor, alpha: float) -> Tensor:
    """lp(|Y|) = ((5 + |Y|) / 6)^α (Wu et al. 2016, arXiv 1609.08144, eq. 14); floating, lengths' shape."""
    lengths = lengths if lengths.is_floating_point() else lengths.to(torch.get_default_dtype())
    return ((5.0 + lengths) / 6.0) ** alpha


def _penalized(score: Tensor, length: int, alpha: float) -> Tensor:
    """log p / lp(|Y|) for hypotheses of one length, the penalty computed in the scores' dtype."""
    return score / length_penalty_gnmt(torch.tensor(float(length), dtype=score.dtype), alpha)


def beam_rows(batch_size: int, beam_size: int, device=None) -> Tensor:
    """(b k,) the rows that expand a batch's state for :func:`beam_search`: row r copies sentence r // k."""
    _check_sizes(batch_size=batch_size, beam_size=beam_size)
    return torch.arange(batch_size, device=device).repeat_interleave(beam_size)


def _check_sizes(**sizes) -> None:
    for name, hint in (("max_len", " (max_new_tokens for generate)"), ("length_penalty", "")):
        if name in sizes and sizes[name] is None:  # check_nonnegative lets None through
            raise ValueError(f"{name} must be a number >= 0{hint}, got None")
    ns = SimpleNamespace(**sizes)
    check_positive_ints(ns, tuple(n for n in ("batch_size", "beam_size") if n in sizes))
    check_nonnegative(ns, tuple(n for n in ("max_len",) if n in sizes))
    check_nonnegative(ns, tuple(n for n in ("length_penalty",) if n in sizes), numbers=True)


class _Steps:
    """Calls the step function and checks what it returns against the first step: the log-probs (N, v) of
    one floating dtype, the extras None at every step or (N, ...) of one shape; collects the extras."""

    def __init__(self, step: StepFn, rows: int):
        self.step, self.rows = step, rows
        self.vocab: int | None = None
        self.extras: list[Tensor | None] = []

    def __call__(self, last: Tensor, state: Any) -> tuple[Tensor, Any]:
        out = self.step(last, state)
        if not isinstance(out, tuple) or len(out) != 3:
            raise ValueError(f"step must return (log_probs, state, extra), got {type(out).__name__}")
        logp, state, extra = out
        want = f"({self.rows}, {'v' if self.vocab is None else self.vocab})"
        got = tuple(logp.shape) if isinstance(logp, Tensor) else type(logp).__name__
        if (
            not isinstance(logp, Tensor)
            or not logp.is_floating_point()
            or logp.dim() != 2
            or logp.size(0) != self.rows
            or self.vocab not in (None, logp.size(1))
        ):
            raise ValueError(f"step returned log-probs of shape {got}, expected {want} of a floating dtype")
        self.vocab = logp.size(1)
        self._check_extra(extra)
        self.extras.append(extra)
        return logp, state

    def spread(self, rows: Tensor, n: int) -> None:
        """Put the last step's extras (one per row called) at their ``rows`` among ``n``, zeros elsewhere."""
        extra = self.extras[-1]
        if extra is not None and extra.size(0) != n:
            self.extras[-1] = extra.new_zeros(n, *extra.shape[1:]).index_copy(0, rows, extra)

    def _check_extra(self, extra: Tensor | None) -> None:
        first = self.extras[0] if self.extras else extra
        if first is None and extra is None:
            return
        want = "None" if first is None else f"{(self.rows, *first.shape[1:])}"
        got = tuple(extra.shape) if isinstance(extra, Tensor) else repr(extra)
        if (
            first is None
            or not isinstance(extra, Tensor)
            or extra.dim() < 1
            or extra.shape[1:] != first.shape[1:]
            or extra.size(0) != self.rows
        ):
            raise ValueError(f"step returned extra of shape {got}, expected {want} (the same at every step)")


def _zero_rows(x: Tensor, keep: Tensor) -> Tensor:
    """x (N, ...) with the rows where keep (N,) is False set to zero."""
    return torch.where(
        keep.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros((), dtype=x.dtype, device=x.device)
    )


def greedy_search(
    step: StepFn,
    state: Any,
    *,
    batch_size: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len: int,
    device=None,
) -> Decoded:
    """The argmax token at each step, for ``batch_size`` rows at once, until every row has emitted eos or
    ``max_len`` tokens; scores are the raw log p(Y). See the module docstring."""
    _check_sizes(batch_size=batch_size, max_len=max_len)
    b = batch_size
    last = torch.full((b,), bos_id, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    score = torch.zeros(b, device=device)
    length = torch.zeros(b, dtype=torch.long, device=device)
    steps, tokens, alive = _Steps(step, b), [], []
    for _ in range(max_len):
        logp, state = steps(last, state)  # (b, v)
        best = logp.argmax(-1)  # (b,)
        score = score + logp.gather(1, best[:, None]).squeeze(1).masked_fill(done, 0.0)
        tok = best.masked_fill(done, pad_id)
        alive.append(~done)
        length += (~done).long()
        tokens.append(tok)
        done = done | (tok == eos_id)
        last = tok
        if bool(done.all()):
            break
    ids = torch.stack([torch.full_like(last, bos_id), *tokens], dim=1)  # (b, 1 + n)
    extras = None
    if steps.extras and steps.extras[0] is not None:
        extras = torch.stack([_zero_rows(e, a) for e, a in zip(steps.extras, alive, strict=True)], 1)
    return Decoded(ids, score, length, extras)  # extras (b, n, ...)


def beam_search(
    step: StepFn,
    state: Any,
    reorder: ReorderFn,
    *,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len: int,
    length_penalty: float = 0.6,
    device=None,
) -> Decoded:
    """Beam search with ``beam_size`` beams for ``batch_size`` sentences at once; ``state`` is already
    expanded to b k rows (row r = sentence r // k, beam r % k; :func:`beam_rows` gives the rows to expand
    with). ``length_penalty`` is GNMT's α. The rule for finished hypotheses is in the module docstring."""
    _check_sizes(batch_size=batch_size, beam_size=beam_size, max_len=max_len, length_penalty=length_penalty)
    b, k = batch_size, beam_size
    last = torch.full((b * k,), bos_id, dtype=torch.long, device=device)
    score = torch.zeros(b, k, device=device)  # raw log p of each beam
    score[:, 1:] = float("-inf")  # all beams start identical: only beam 0 is alive
    done = score.isneginf()  # a dead beam counts as finished: it continues with pad, at -inf
    best = _BestFinished(b, device)
    steps, history = _Steps(step, b * k), []  # history: (tokens, parents), (b, k) each, per step
    active = torch.arange(b, device=device)  # sentences still searched; the state holds their k rows each
    for t in range(max_len):
        logp, state = steps(last, state)  # (a k, v) for the a active sentences
        rows = (active[:, None] * k + torch.arange(k, device=device)).view(-1)  # (a k,) rows among b k
        logp = logp.new_zeros(b * k, logp.size(1)).index_copy(0, rows, logp)  # finished rows: never read
        steps.spread(rows, b * k)
        parent, tok, score = _top_k(logp.view(b, k, -1), score, done)  # (b, k) each
        was_done = done.gather(1, parent)
        tok = tok.masked_fill(was_done, pad_id)
        done = was_done | (tok == eos_id) | score.isneginf()
        finished_now = done & ~was_done & (tok == eos_id) & ~score.isneginf()  # |Y| = t + 1
        best.update(finished_now, _penalized(score, t + 1, length_penalty), t)
        done = done | _settled(best, score, done, max_len, length_penalty)[:, None]
        history.append((tok, parent))
        # a sentence whose beams are all finished leaves the batch: the step is not called for it again
        position = torch.full((b,), -1, dtype=torch.long, device=device)
        position[active] = torch.arange(active.numel(), device=device)
        active = (~done.all(1)).nonzero().squeeze(1)  # (a',)
        if active.numel() == 0:
            break
        parents = position[active][:, None] * k + parent[active]  # (a', k) rows of the state held now
        state = reorder(state, parents.view(-1))  # each beam continues its parent
        last = tok[active].view(-1)
        steps.rows = active.numel() * k
    # the beams still unfinished were cut at max_len, |Y| = n; the best of them against the best finished
    n = len(history)
    cut = _penalized(score, n, length_penalty).masked_fill(done, float("-inf"))  # (b, k)
    cut_score, cut_slot = cut.max(-1)  # (b,)
    use_cut = (cut_score > best.score) | (best.step < 0)
    end_step = torch.where(use_cut, n - 1, best.step)
    end_slot = torch.where(use_cut, cut_slot, best.slot)
    tokens, extras = _backtrack(history, steps.extras, end_step, end_slot, k, pad_id)
    tokens = torch.cat([torch.full_like(end_step[:, None], bos_id), tokens], dim=1)  # (b, 1 + n)
    return Decoded(tokens, torch.where(use_cut, cut_score, best.score), end_step + 1, extras)


def _settled(best: _BestFinished, score: Tensor, done: Tensor, max_len: int, alpha: float) -> Tensor:
    """(b,) sentences whose best finished hypothesis no unfinished beam can still beat. log p only falls as a
    hypothesis grows and lp(|Y|) <= lp(max_len) for α >= 0, so an unfinished beam of log p L <= 0 ends at
    best at L / lp(max_len); once the best finished score reaches that for every beam, the search of that
    sentence is over (its beams are marked finished: the result cannot change, only the work stops)."""
    reach = _penalized(score, max_len, alpha).masked_fill(done, float("-inf")).amax(-1)  # (b,)
    return (best.step >= 0) & (best.score >= reach)


def _top_k(logp: Tensor, score: Tensor, done: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """logp (b, k, v), score and done (b, k) -> the k best candidates of each sentence by raw log p:
    (parent beams, tokens, scores), (b, k) each. A finished beam's only candidate is itself, at no cost."""
    b, k, v = logp.shape
    finished = torch.full((v,), float("-inf"), dtype=logp.dtype, device=logp.device)
    finished[0] = 0.0  # its one continuation (token column 0, written as pad by the caller) is free
    logp = torch.where(done[..., None], finished, logp)  # (b, k, v)
    cand = (score[..., None] + logp).reshape(b, k * v)  # (b, k v)
    top, idx = cand.topk(k, dim=-1)  # (b, k), best first
    return idx // v, idx % v, top


class _BestFinished:
    """Per sentence, the best finished hypothesis by log p / lp(|Y|) so far: its score, the step that emitted
    its eos (-1: none yet; |Y| = step + 1) and its beam slot at that step; all (b,)."""

    def __init__(self, b: int, device):
        self.score = torch.full((b,), float("-inf"), device=device)
        self.step = torch.full((b,), -1, dtype=torch.long, device=device)
        self.slot = torch.zeros(b, dtype=torch.long, device=device)

    def update(self, finished_now: Tensor, score: Tensor, t: int) -> None:
        """finished_now and score (length-penalized), (b, k), after step t: keep any strictly better."""
        cand, slot = score.masked_fill(~finished_now, float("-inf")).max(-1)  # (b,): first of equal ones
        better = cand > self.score
        self.score = torch.where(better, cand, self.score)
        self.step = torch.where(better, t, self.step)
        self.slot = torch.where(better, slot, self.slot)


def _backtrack(
    history: list[tuple[Tensor, Tensor]],
    extras: list[Tensor | None],
    end_step: Tensor,
    end_slot: Tensor,
    k: int,
    pad_id: int,
) -> tuple[Tensor, Tensor | None]:
    """Follow each sentence's chosen hypothesis from (end_step, end_slot) back through its parents:
    tokens (b, n), pad after end_step, and the extras of its rows (b, n, ...), zeros after end_step."""
    b, n = end_step.size(0), len(history)
    sentence = torch.arange(b, device=end_step.device)
    slot = end_slot
    tokens, collected = [], []
    for t in range(n - 1, -1, -1):
        tok, parent = history[t]  # (b, k) each
        on = end_step >= t  # (b,): the hypothesis has a token at step t
        up = parent[sentence, slot]  # (b,)
        tokens.append(torch.where(on, tok[sentence, slot], pad_id))
        if extras[t] is not None:
            collected.append(_zero_rows(extras[t][sentence * k + up], on))  # the parent's row made it
        slot = torch.where(on, up, slot)
    if not tokens:
        return torch.empty(b, 0, dtype=torch.long, device=end_step.device), None
    ex = torch.stack(collected[::-1], dim=1) if collected else None  # (b, n, ...)
    return torch.stack(tokens[::-1], dim=1), ex


def search(
    step: StepFn,
    state: Any,
    reorder: ReorderFn,
    *,
    batch_size: int,
    beam_size: int,
    expand: ReorderFn | None = None,
    **options,
) -> Decoded:
    """Greedy search when ``beam_size`` is 1, else :func:`beam_search` from ``state`` (one row per sentence)
    expanded to k rows per sentence by ``expand(state, rows)`` (default ``reorder``). ``options``: the ids,
    ``max_len``, ``length_penalty`` and ``device`` of the two searches (greedy has no length penalty)."""
    _check_sizes(beam_size=beam_size, max_len=options.get("max_len", 0))
    if beam_size == 1:
        options.pop("length_penalty", None)
        return greedy_search(step, state, batch_size=batch_size, **options)
    rows = beam_rows(batch_size, beam_size, options.get("device"))  # (b k,)
    state = (expand or reorder)(state, rows)
    return beam_search(step, state, reorder, batch_size=batch_size, beam_size=beam_size, **options)


def never(logp: Tensor, *ids: int) -> Tensor:
    """log-probs (N, v) with the given tokens made impossible (-inf): a decoder never emits pad or bos, which
    are inputs only, however little it has been trained."""
    logp[:, list(ids)] = float("-inf")
    return logp


def search_model(
    model,
    start: Callable[[], Any],
    reorder: ReorderFn,
    *,
    batch_size: int,
    beam_size: int,
    max_len: int,
    length_penalty: float,
    device,
    expand: ReorderFn | None = None,
) -> Decoded:
    """:func:`search` in eval mode (restored after) over ``model.step(tokens, state) -> (logits, state, extra)``
    from ``start()``, never choosing pad or bos; the ids come from ``model.config`` (pad_id, bos_id, eos_id)."""
    c = model.config

    def step(tokens: Tensor, state: Any):
        logits, state, extra = model.step(tokens, state)
        return never(widened(logits).log_softmax(-1), c.pad_id, c.bos_id), state, extra

    with evaluating(model):
        return search(
            step,
            start(),
            reorder,
            expand=expand,
            batch_size=batch_size,
            beam_size=beam_size,
            bos_id=c.bos_id,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            max_len=max_len,
            length_penalty=length_penalty,
            device=device,
        )
