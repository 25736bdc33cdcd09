r"""Three token-level probes of in-context memory that separate recurrent, attention and state-space models.

* ``SelectiveCopyTask``: copy the few symbols scattered at random positions among blanks (Gu & Dao 2023,
  "Mamba", arXiv:2312.00752, sec. 4.1.1 and Fig. 2). The positions vary from example to example, so a
  linear time-invariant model (one fixed convolution kernel) cannot solve it; an input-dependent (selective)
  state or attention can.
* ``AssociativeRecallTask``: multi-query associative recall, MQAR (Arora et al. 2023, "Zoology",
  arXiv:2312.04927): read key-value pairs, then answer several key queries with their values.
* ``InductionHeadsTask``: after a trigger token, recall the token that followed the trigger's first
  occurrence (Olsson et al. 2022, "In-context Learning and Induction Heads"; used with test lengths beyond
  the training length in the Mamba paper, sec. 4.1.2 and Table 2).

All three are causal by construction: every answer is asked for at a position strictly after every token it
depends on, so a left-to-right model can answer it. Targets ``y`` have the shape of the input ``x`` and hold
``IGNORE_INDEX`` (-100, cross-entropy's default ``ignore_index``) everywhere except at the answer positions;
the loss is the cross-entropy over the answer positions only and ``accuracy`` the fraction of answer tokens
whose argmax is right. The chance baselines, for a model that guesses uniformly among the possible answers:

    selective_copy:      CE = log(n_symbols)        accuracy = 1 / n_symbols
    associative_recall:  CE = log(n_values)         accuracy = 1 / n_values
    induction:           CE = log(vocab_size - 1)   accuracy = 1 / (vocab_size - 1)

Notation: ``b`` batch, ``t`` time (sequence length), ``L`` the length of the context region, ``k`` the number
of answers per sequence, ``V`` vocabulary size.

Batches are pure functions of (seed, split, index) through ``base.generator_for`` and live on the CPU;
``loss`` moves them to the model's device. A model with a learned position table needs
``max_seq_len >= task.max_seq_len`` (for ``InductionHeadsTask`` that is the longer, validation length).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import Batch, Task, check_index, check_int, check_output, generator_for, model_device
from seqlab.tasks.synthetic import SymbolAlphabet

__all__ = ["IGNORE_INDEX", "AssociativeRecallTask", "InductionHeadsTask", "SelectiveCopyTask"]

IGNORE_INDEX = -100
"""Target value at positions that are not scored (F.cross_entropy's default ignore_index)."""


def _answer_loss(task: str, model, batch: Batch, vocab_size: int) -> tuple[Tensor, dict[str, float], None]:
    """Cross-entropy and accuracy over the positions where ``y != IGNORE_INDEX``."""
    device = model_device(model)
    x, y = batch["x"].to(device), batch["y"].to(device)
    b, t = x.shape
    v = vocab_size
    logits = check_output(task, model(x), (b, t, v), f"logits (b, t, vocab_size={v})")
    scored = y != IGNORE_INDEX  # (b, t) True at the answer positions
    answer_logits = logits[scored].float()  # (n_answers, v)
    answers = y[scored]  # (n_answers,)
    loss = F.cross_entropy(answer_logits, answers)
    with torch.no_grad():
        accuracy = (answer_logits.argmax(dim=-1) == answers).float().mean()
    return loss, {"loss": loss.item(), "accuracy": accuracy.item()}, None


class _AnswerTask(Task):
    """What the three probes share: token inputs over ``vocab_size``, the loss over the answer positions."""

    vocab_size: int
    total_len: int

    @property
    def max_seq_len(self) -> int:
        """The longest sequence of any split (a learned position table needs at least this many rows)."""
        return self.total_len

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        return _answer_loss(type(self).__name__, model, batch, self.vocab_size)


def _random_positions(b: int, n: int, k: int, g: torch.Generator) -> Tensor:
    """(b, k) sorted positions, k distinct ones per row drawn uniformly from range(n)."""
    return torch.rand(b, n, generator=g).argsort(dim=1)[:, :k].sort(dim=1).values


class SelectiveCopyTask(SymbolAlphabet, _AnswerTask):
    r"""Selective copying: write out, in order, the symbols scattered at random positions among blanks.

    Tokens: 0 blank, 1..n_symbols the alphabet, n_symbols + 1 the delimiter ("go"), so
    vocab_size = n_symbols + 2. With region length L = ``seq_len`` and k = ``n_tokens``, sequences have
    length L + 1 + k::

        position   0 .. L-1                           L           L+1 .. L+k
        input      blanks with s_1..s_k at p_1<..<p_k  delimiter   blank (k placeholders)
        target     -                                  -           s_1 .. s_k

    The k positions are distinct and uniform over the region, the symbols s_i ~ U{1, ..., n_symbols}
    independently; "-" is ``IGNORE_INDEX`` (not scored). Unlike the copy task (``synthetic.CopyTask``,
    Arjovsky et al. 2016) where the symbols always sit at the start, the gaps between them vary, so the model
    must decide from the content which inputs to keep: the Mamba paper's motivating probe for selection.
    The paper's experiment (sec. 4.1.1, Table 1) uses sequences of length 4096 with 16 tokens to memorize;
    its answers are read at positions that follow the context, as here.

    Chance baseline: guessing uniformly among the symbols at every answer position scores
    ``baseline_loss = log(n_symbols)`` (2.08 for 8 symbols) and accuracy 1 / n_symbols.

    Metrics: ``loss`` and ``accuracy``, both over the k answer positions only.
    """

    name = "selective_copy"
    derived = ("vocab_size", "total_len", "baseline_loss")

    def __init__(
        self, seq_len: int = 64, n_tokens: int = 8, n_symbols: int = 8, batch_size: int = 32, seed: int = 0
    ):
        self.seq_len = check_int("seq_len", seq_len, 1)  # the region L holding the symbols
        self.n_tokens = check_int("n_tokens", n_tokens, 1)
        self.n_symbols = check_int("n_symbols", n_symbols, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        if n_tokens > seq_len:
            raise ValueError(
                f"n_tokens={n_tokens} symbols need distinct positions in a region of seq_len={seq_len}; "
                f"raise seq_len or lower n_tokens"
            )

    @property
    def total_len(self) -> int:
        """Length of every input and target sequence: seq_len + 1 + n_tokens."""
        return self.seq_len + 1 + self.n_tokens

    @property
    def baseline_loss(self) -> float:
        """Cross-entropy of a uniform guess among the symbols at every answer position."""
        return math.log(self.n_symbols)

    def get_batch(self, split: str, index: int) -> Batch:
        g = generator_for(self.seed, split, check_index(index))
        b, L, k, t = self.batch_size, self.seq_len, self.n_tokens, self.total_len
        positions = _random_positions(b, L, k, g)  # (b, k) sorted, distinct, in [0, L)
        symbols = torch.randint(1, self.n_symbols + 1, (b, k), generator=g)  # (b, k)
        x = torch.zeros(b, t, dtype=torch.long)  # (b, t) blanks
        x.scatter_(1, positions, symbols)
        x[:, L] = self.delimiter
        y = torch.full((b, t), IGNORE_INDEX, dtype=torch.long)  # (b, t)
        y[:, L + 1 :] = symbols
        return {"x": x, "y": y}


class AssociativeRecallTask(_AnswerTask):
    r"""Multi-query associative recall (MQAR): key-value pairs, then queries of the keys.

    Tokens: keys 0 .. V/2 - 1 and values V/2 .. V - 1 (V = ``vocab_size``, the key range is ⌊V/2⌋ long),
    disjoint as in Zoology. With n = ``n_pairs``, q = ``n_queries`` and context length L = ``seq_len``,
    sequences have length L + q::

        position   0 .. 2n-1              2n .. L-1         L .. L+q-1
        input      k_1 v_1 ... k_n v_n    noise (values)    k_{π(1)} .. k_{π(q)}
        target     -                      -                 v_{π(1)} .. v_{π(q)}

    The keys of one sequence are distinct, drawn without replacement from the key range; each value is drawn
    uniformly from the value range; π is a random choice of q distinct pairs in random order; "-" is
    ``IGNORE_INDEX``. When L > 2n the gap is filled with noise: uniform tokens from the *value* range, which
    never follow a key, so they cannot change which value belongs to a key, but they lengthen the distance
    between the pairs and the queries. Each answer is asked for at the query token itself, after the pair
    that holds it.

    Deviations from Zoology (arXiv:2312.04927): there the queries are spread among blanks in the second part
    of the sequence, each query key followed by its value; here the queries come back to back after the
    context (every query token is an answer position) and the values are drawn independently, so the chance
    baseline is exact: ``baseline_loss = log(n_values)`` and accuracy 1 / n_values, n_values = V - ⌊V/2⌋.

    Metrics: ``loss`` and ``accuracy``, both over the q query positions only.
    """

    name = "associative_recall"
    derived = ("n_keys", "n_values", "total_len", "baseline_loss")

    def __init__(
        self,
        n_pairs: int = 8,
        n_queries: int = 8,
        vocab_size: int = 64,
        seq_len: int = 64,
        batch_size: int = 32,
        seed: int = 0,
    ):
        self.n_pairs = check_int("n_pairs", n_pairs, 1)
        self.n_queries = check_int("n_queries", n_queries, 1)
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.seq_len = check_int("seq_len", seq_len, 2)  # the context L
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        if n_queries > n_pairs:
            raise ValueError(f"n_queries={n_queries} must be <= n_pairs={n_pairs}: each pair is queried once")
        if seq_len < 2 * n_pairs:
            raise ValueError(
                f"seq_len={seq_len} must hold the {n_pairs} key-value pairs (>= {2 * n_pairs} tokens)"
            )
        if self.n_keys < n_pairs:
            raise ValueError(
                f"vocab_size={vocab_size} gives {self.n_keys} keys, fewer than n_pairs={n_pairs} distinct keys; "
                f"use vocab_size >= {2 * n_pairs}"
            )

    @property
    def n_keys(self) -> int:
        return self.vocab_size // 2

    @property
    def n_values(self) -> int:
        return self.vocab_size - self.n_keys

    @property
    def total_len(self) -> int:
        """Length of every input and target sequence: seq_len + n_queries."""
        return self.seq_len + self.n_queries

    @property
    def baseline_loss(self) -> float:
        """Cross-entropy of a uniform guess among the values at every query position."""
        return math.log(self.n_values)

    def get_batch(self, split: str, index: int) -> Batch:
        g = generator_for(self.seed, split, check_index(index))
        b, n, q, L, t = self.batch_size, self.n_pairs, self.n_queries, self.seq_len, self.total_len
        keys = torch.rand(b, self.n_keys, generator=g).argsort(dim=1)[:, :n]  # (b, n) distinct keys
        values = torch.randint(self.n_keys, self.vocab_size, (b, n), generator=g)  # (b, n)
        noise = torch.randint(self.n_keys, self.vocab_size, (b, L - 2 * n), generator=g)  # (b, L - 2n)
        asked = torch.rand(b, n, generator=g).argsort(dim=1)[:, :q]  # (b, q) which pairs, in query order
        pairs = torch.stack([keys, values], dim=2).reshape(b, 2 * n)  # (b, n, 2) -> (b, 2n) k1 v1 k2 v2 ..
        x = torch.cat([pairs, noise, keys.gather(1, asked)], dim=1)  # (b, t)
        y = torch.full((b, t), IGNORE_INDEX, dtype=torch.long)  # (b, t)
        y[:, L:] = values.gather(1, asked)
        return {"x": x, "y": y}


class InductionHeadsTask(_AnswerTask):
    r"""Induction heads: after the trigger comes back, recall the token that followed it the first time.

    Tokens: 0 the trigger, 1 .. V-1 ordinary tokens (V = ``vocab_size``). A sequence of length T::

        position   0 .. p-1    p         p+1    p+2 .. T-2    T-1
        input      random      trigger   a      random        trigger
        target     -           -         -      -             a

    where the ordinary tokens (``a`` included) are uniform over 1..V-1, the trigger appears exactly twice and
    p ~ U{0, ..., T-3}; "-" is ``IGNORE_INDEX``. Only the last position is scored.

    Length generalization: the training split uses T = ``seq_len``, the validation and test splits
    T = ``test_seq_len`` (default 4 × seq_len), so ``val_accuracy`` measures whether the mechanism learnt on
    short sequences extrapolates to longer ones, as in the Mamba paper (sec. 4.1.2, Table 2: vocabulary 16,
    training length 256, test lengths up to 2^20). Olsson et al. (2022) describe the mechanism
    ("[A][B] ... [A] -> [B]"); this synthetic form is the one of Fu et al. (2023, "Hungry Hungry Hippos",
    arXiv:2212.14052) that the Mamba paper follows.

    Chance baseline: a uniform guess among the ordinary tokens scores
    ``baseline_loss = log(V - 1)`` (2.71 for V = 16) and accuracy 1 / (V - 1).

    Metrics: ``loss`` and ``accuracy`` at the last position.
    """

    name = "induction"
    derived = ("baseline_loss",)

    def __init__(
        self,
        seq_len: int = 64,
        vocab_size: int = 16,
        batch_size: int = 32,
        seed: int = 0,
        test_seq_len: int | None = None,
    ):
        self.seq_len = check_int("seq_len", seq_len, 3)  # trigger, recalled token, trigger again
        self.vocab_size = check_int("vocab_size", vocab_size, 2)  # the trigger and one ordinary token
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.test_seq_len = (
            4 * seq_len if test_seq_len is None else check_int("test_seq_len", test_seq_len, 3)
        )

    @property
    def trigger(self) -> int:
        return 0

    @property
    def max_seq_len(self) -> int:
        """The longest sequence of any split: max(seq_len, test_seq_len)."""
        return max(self.seq_len, self.test_seq_len)

    @property
    def baseline_loss(self) -> float:
        """Cross-entropy of a uniform guess among the ordinary tokens at the last position."""
        return math.log(self.vocab_size - 1)

    def split_len(self, split: str) -> int:
        """Sequence length of a split: seq_len for training, test_seq_len for validation and test."""
        return self.seq_len if split == "train" else self.test_seq_len

    def get_batch(self, split: str, index: int) -> Batch:
        g = generator_for(self.seed, split, check_index(index))
        b, t = self.batch_size, self.split_len(split)
        x = torch.randint(1, self.vocab_size, (b, t), generator=g)  # (b, t) ordinary tokens
        p = torch.randint(0, t - 2, (b, 1), generator=g)  # (b, 1) first trigger, in [0, t - 3]
        x.scatter_(1, p, self.trigger)
        x[:, -1] = self.trigger
        y = torch.full((b, t), IGNORE_INDEX, dtype=torch.long)  # (b, t)
        y[:, -1] = x.gather(1, p + 1).squeeze(1)  # the token that followed the first trigger
        return {"x": x, "y": y}
