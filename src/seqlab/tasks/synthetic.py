r"""Two classic long-range memory probes: the adding problem and the copy memory task.

Both come from Hochreiter & Schmidhuber (1997), "Long Short-Term Memory" (experiments 4 and 2), in the forms
that Arjovsky, Shah & Bengio (2016), "Unitary Evolution Recurrent Neural Networks" (arXiv:1511.06464,
sections 4.1 and 4.2) made the common benchmark. Each has a number a model must beat to show any memory:

    adding:  always predict 1.0                  MSE = Var(a + b) = 2 * 1/12 = 1/6 ≈ 0.167
    copy:    blanks, then uniform guesses         CE  = copy_len * log(n_symbols) / (seq_len + 2 * copy_len)

Notation: ``b`` batch, ``t`` time (sequence length), ``T`` the delay ``seq_len``, ``V`` vocabulary size.

Batches are pure functions of (seed, split, index) through ``base.generator_for`` and live on the CPU;
``loss`` moves them to the model's device.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import Batch, Task, check_index, check_int, check_output, generator_for, model_device

__all__ = ["AddingTask", "CopyTask", "SymbolAlphabet"]


class SymbolAlphabet:
    """Tokens of the copy tasks: 0 blank, 1..n_symbols the alphabet, n_symbols + 1 the delimiter ("go")."""

    n_symbols: int

    @property
    def blank(self) -> int:
        return 0

    @property
    def delimiter(self) -> int:
        return self.n_symbols + 1

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 2

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size}


class AddingTask(Task):
    r"""The adding problem: add the two numbers that a marker channel points at.

    Input ``x`` (b, T, 2), float:
        channel 0: values v_t ~ U[0, 1]
        channel 1: a marker, 1 at exactly two positions, i ~ U{0, ..., ⌊T/2⌋ - 1} (first half) and
                   j ~ U{⌊T/2⌋, ..., T - 1} (second half), 0 elsewhere
    Target ``y`` (b,): v_i + v_j.
    The model maps ``x`` to (b, T, 1); its prediction is the output at the last position, and the loss is
    the mean squared error. Predicting the constant 1.0 scores MSE 1/6 ≈ 0.167 (the sum of two U[0, 1] has
    mean 1 and variance 1/6); a model below that has learnt to remember.

    This is the form of Arjovsky et al. (2016, sec. 4.2). Hochreiter & Schmidhuber (1997, experiment 4) drew
    values from [-1, 1], put the first marker among the first ten positions and the second elsewhere in the
    first half, varied the length between T and 1.1 T, and scaled the target to 0.5 + (v_i + v_j) / 4.

    Metrics: ``mse``, and ``baseline_mse`` (the constant-1.0 predictor on the same batch).
    """

    name = "adding"
    derived = ("baseline_mse",)

    baseline_mse = 1.0 / 6.0
    """Expected MSE of always predicting 1.0."""

    def __init__(self, seq_len: int = 100, batch_size: int = 32, seed: int = 0):
        self.seq_len = check_int("seq_len", seq_len, 2)  # one marker per half needs two positions
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)

    def model_overrides(self) -> dict[str, Any]:
        return {"d_input": 2, "d_output": 1}

    def get_batch(self, split: str, index: int) -> Batch:
        g = generator_for(self.seed, split, check_index(index))
        b, t, half = self.batch_size, self.seq_len, self.seq_len // 2
        values = torch.rand(b, t, generator=g)  # (b, t)
        first = torch.randint(0, half, (b,), generator=g)  # (b,) one position in [0, t/2)
        second = torch.randint(half, t, (b,), generator=g)  # (b,) one position in [t/2, t)
        positions = torch.stack([first, second], dim=1)  # (b, 2)
        marker = torch.zeros(b, t).scatter_(1, positions, 1.0)  # (b, t)
        x = torch.stack([values, marker], dim=-1)  # (b, t, 2)
        y = values.gather(1, positions).sum(dim=1)  # (b,)
        return {"x": x, "y": y}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        device = model_device(model)
        x, y = batch["x"].to(device), batch["y"].to(device)
        b, t, _ = x.shape
        out = check_output("AddingTask", model(x), (b, t, 1), "(b, t, d_output=1)")
        pred = out[:, -1, 0]  # (b,) the prediction is read at the last position
        mse = F.mse_loss(pred.float(), y)
        metrics = {
            "mse": mse.item(),
            "baseline_mse": (y - 1.0).pow(2).mean().item(),
        }
        return mse, metrics, None


class CopyTask(SymbolAlphabet, Task):
    r"""The copy memory task: read ``copy_len`` symbols, wait, then write them out again.

    Tokens: 0 blank, 1..n_symbols the alphabet, n_symbols + 1 the delimiter (so vocab_size = n_symbols + 2).
    With delay T = ``seq_len`` and k = ``copy_len``, sequences have length T + 2k::

        position   0 .. k-1       k .. k+T-2     k+T-1       k+T .. T+2k-1
        input      s_1 .. s_k     blank (T-1)    delimiter   blank (k)
        target     blank (k)      blank (T-1)    blank       s_1 .. s_k

    with s_i ~ U{1, ..., n_symbols} independently. The model maps ``x`` (b, T+2k) to logits (b, T+2k, V);
    the loss is the cross-entropy over *all* positions, as in Arjovsky et al. (2016, sec. 4.1), where the
    symbols are a_1..a_8, the blank a_9 and the delimiter a_10; here they are renumbered so the blank is 0.

    A memoryless model that writes blanks and then guesses uniformly scores
    ``baseline_loss = k * log(n_symbols) / (T + 2k)`` (0.173 for T = 100, n_symbols = 8, k = 10).
    Arjovsky et al. describe their setup as "similar to" the long-time-lag tasks of Hochreiter & Schmidhuber
    (1997); this is the Arjovsky form.

    Metrics: ``loss`` (cross-entropy over all positions) and ``accuracy`` (over the last k positions only,
    where the symbols must be recalled; blanks elsewhere are trivially predictable).
    """

    name = "copy"
    derived = ("vocab_size", "baseline_loss")

    def __init__(
        self, seq_len: int = 100, n_symbols: int = 8, copy_len: int = 10, batch_size: int = 32, seed: int = 0
    ):
        self.seq_len = check_int("seq_len", seq_len, 1)  # the delay T
        self.n_symbols = check_int("n_symbols", n_symbols, 1)
        self.copy_len = check_int("copy_len", copy_len, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)

    @property
    def total_len(self) -> int:
        """Length of every input and target sequence: seq_len + 2 * copy_len."""
        return self.seq_len + 2 * self.copy_len

    @property
    def baseline_loss(self) -> float:
        """Cross-entropy of the memoryless strategy: blanks, then a uniform guess over the symbols."""
        return self.copy_len * math.log(self.n_symbols) / self.total_len

    def get_batch(self, split: str, index: int) -> Batch:
        g = generator_for(self.seed, split, check_index(index))
        b, k, t = self.batch_size, self.copy_len, self.total_len
        symbols = torch.randint(1, self.n_symbols + 1, (b, k), generator=g)  # (b, k)
        x = torch.zeros(b, t, dtype=torch.long)  # (b, t) blanks
        x[:, :k] = symbols
        x[:, t - k - 1] = self.delimiter  # after T - 1 blanks
        y = torch.zeros(b, t, dtype=torch.long)  # (b, t) blanks
        y[:, t - k :] = symbols
        return {"x": x, "y": y}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        device = model_device(model)
        x, y = batch["x"].to(device), batch["y"].to(device)
        b, t = x.shape
        v, k = self.vocab_size, self.copy_len
        logits = check_output("CopyTask", model(x), (b, t, v), f"logits (b, t, vocab_size={v})")
        loss = F.cross_entropy(logits.reshape(b * t, v).float(), y.reshape(b * t))
        with torch.no_grad():
            correct = logits[:, t - k :].argmax(dim=-1) == y[:, t - k :]  # (b, k)
        return loss, {"loss": loss.item(), "accuracy": correct.float().mean().item()}, None
