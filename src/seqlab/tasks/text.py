"""Character-level language modelling on the built-in Shakespeare corpus or on any text file.

Two ways to cut the training text into batches:

* ``sampling="stream"`` (char-rnn style truncated BPTT): the text is split into ``batch_size`` contiguous
  streams; batch ``i`` holds the ``i``-th window of ``seq_len`` characters of every stream, so the model's
  state carries over from one batch to the next (the trainer detaches it). The state is reset at the start
  of every pass over the streams.
* ``sampling="random"``: independent windows at random offsets, each read from an empty state (GPT style).

Validation always reads ``eval_batches`` fixed random windows of the held-out tail of the text, from an
empty state, and reports the mean cross-entropy in nats per character (``val_loss``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import (
    Batch,
    Task,
    check_choice,
    check_fraction,
    check_int,
    generator_for,
    ids_to_decode,
)


class CharTokenizer:
    """Characters <-> ids. The vocabulary is the sorted set of characters of the text it was built from."""

    def __init__(self, chars: str):
        if not isinstance(chars, str) or len(set(chars)) != len(chars) or not chars:
            raise ValueError(f"chars must be a non-empty string of distinct characters, got {chars!r:.80}")
        self.chars = chars
        self.index = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """(n,) long ids of the n characters of ``text``; a character outside the vocabulary is an error.
        Vectorized (a 100 MB text in seconds, not a Python loop per character): a table from code point to id."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # (n,) code points
        vocab = np.array([ord(ch) for ch in self.chars], dtype=np.int64)
        table = np.full(int(vocab.max()) + 2, -1, dtype=np.int64)  # code point -> id; the last entry: beyond
        table[vocab] = np.arange(len(vocab))
        ids = table[np.minimum(codes, len(table) - 1)]  # (n,)
        if (ids < 0).any():
            unknown = sorted(chr(c) for c in np.unique(codes[ids < 0]))
            raise ValueError(
                f"characters not in the vocabulary: {unknown[:10]!r}; the vocabulary has "
                f"{self.vocab_size} characters: {self.chars!r}"
            )
        return torch.from_numpy(ids)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids_to_decode(ids, self.vocab_size, "CharTokenizer"))

    def to_json(self) -> str:
        return json.dumps({"type": "char", "chars": self.chars}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        data = json.loads(text)
        if data.get("type") != "char":
            raise ValueError(f"not a character tokenizer: type={data.get('type')!r}")
        return cls(data["chars"])


Sampling = Literal["stream", "random"]
"""'stream': batch_size contiguous streams read in order (truncated BPTT); 'random': windows anywhere."""


class CharLMTask(Task):
    """Next-character prediction. ``source`` is ``"shakespeare"`` (built in) or a path to a text file."""

    derived = ("train_chars", "val_chars", "vocab_size")

    def __init__(
        self,
        source: str = "shakespeare",
        seq_len: int = 128,
        batch_size: int = 32,
        sampling: Sampling = "stream",
        val_fraction: float = 0.1,
        seed: int = 0,
        encoding: str = "utf-8",
    ):
        check_int("seq_len", seq_len, 1)
        check_int("batch_size", batch_size, 1)
        check_choice("sampling", sampling, Sampling)
        check_fraction("val_fraction", val_fraction)
        from seqlab.tasks import corpus

        if source == "shakespeare" and encoding != "utf-8":  # it would be ignored: the corpus ships decoded
            raise ValueError(
                "encoding belongs to a text file (task.source=PATH), not the shipped Shakespeare"
            )
        text = (
            corpus.shakespeare_text() if source == "shakespeare" else corpus.read_text_file(source, encoding)
        )
        self.name = "shakespeare" if source == "shakespeare" else "text"
        self.source, self.seq_len, self.batch_size = source, seq_len, batch_size
        self.sampling, self.val_fraction, self.seed = sampling, val_fraction, seed
        self.encoding = encoding
        self.stateful = sampling == "stream"
        self.tokenizer = CharTokenizer.from_text(text)
        data = self.tokenizer.encode(text)
        n_val = int(len(data) * val_fraction)
        self.train_data, self.val_data = data[: len(data) - n_val], data[len(data) - n_val :]
        for split, d in (("train", self.train_data), ("validation", self.val_data)):
            if len(d) < seq_len + 2:
                raise ValueError(
                    f"the {split} text has {len(d)} characters, fewer than seq_len + 2 = "
                    f"{seq_len + 2}; use a longer text, a smaller seq_len or another val_fraction"
                )
        # stream layout: batch_size contiguous streams of stream_len characters each
        self.stream_len = len(self.train_data) // batch_size
        self.windows_per_pass = (self.stream_len - 1) // seq_len
        if sampling == "stream" and self.windows_per_pass < 1:
            raise ValueError(
                f"the text is too short for {batch_size} streams of seq_len {seq_len}; "
                f"lower batch_size or seq_len, or use sampling='random'"
            )

    @property
    def train_chars(self) -> int:
        return len(self.train_data)

    @property
    def val_chars(self) -> int:
        return len(self.val_data)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size}

    def _random_windows(self, data: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor]:
        # a window is seq_len + 1 characters: it can start anywhere up to len(data) - seq_len - 1, inclusive
        starts = torch.randint(0, len(data) - self.seq_len, (self.batch_size,), generator=g)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)  # (b, t + 1)
        chunk = data[idx]
        return chunk[:, :-1], chunk[:, 1:]

    def get_batch(self, split: str, index: int) -> Batch:
        if split == "train" and self.sampling == "stream":
            k = index % self.windows_per_pass  # window number within this pass over the streams
            starts = torch.arange(self.batch_size) * self.stream_len + k * self.seq_len
            chunk = self.train_data[starts[:, None] + torch.arange(self.seq_len + 1)]  # (b, t + 1)
            return {"x": chunk[:, :-1], "y": chunk[:, 1:], "reset": torch.tensor(k == 0)}
        data = self.train_data if split == "train" else self.val_data
        x, y = self._random_windows(data, generator_for(self.seed, split, index))
        return {"x": x, "y": y}

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        logits, state = model(batch["x"], state=state, return_state=True)  # (b, t, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())
        return loss, {"loss": loss.item()}, state

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Mean cross-entropy over ``max_batches`` windows of the held-out text. A text has one held-out part,
        'val' (the text's last ``val_fraction``): 'test' is refused rather than report the val windows as a test."""
        if split != "val":
            raise ValueError(
                f"a text task has one held-out part, 'val' (the last task.val_fraction of the text), no {split!r}"
            )
        device = next(model.parameters()).device
        total = 0.0
        for i in range(max_batches):
            b = self.get_batch("val", i)
            logits = model(b["x"].to(device))
            total += F.cross_entropy(logits.flatten(0, 1).float(), b["y"].to(device).flatten()).item()
        return {f"{split}_loss": total / max_batches}
