"""Subword tokenizers trained and applied through Hugging Face ``tokenizers``: byte-level BPE (GPT-2, Radford
et al. 2019, section 2.2) and WordPiece (BERT; Wu et al. 2016, arXiv 1609.08144).

Both speak :class:`seqlab.tasks.text.CharTokenizer`'s interface, so a task can carry one and a checkpoint can
store it (``tokenizer.json``): ``encode(text) -> LongTensor``, ``decode(ids) -> str``, ``vocab_size``,
``to_json()`` / ``from_json(text)``. :func:`tokenizer_from_json` rebuilds whichever kind a JSON holds.

* Byte-level BPE is lossless: every string encodes (its bytes are the base alphabet) and decodes back to
  itself exactly. Merges are learnt on whitespace-split "words" with GPT-2's pre-tokenizer regex.
* WordPiece splits on whitespace and punctuation first, marks word-internal pieces with ``##`` and maps
  unseen characters to ``[UNK]``; decoding rejoins pieces with single spaces, so it is not lossless.

``tokenizers`` is imported when a tokenizer is trained or loaded (it comes with the ``hf`` extra).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from seqlab.tasks.base import MissingDependencyError, ids_to_decode

__all__ = [
    "BPETokenizer",
    "SubwordTokenizer",
    "TranslationTokenizer",
    "WordPieceTokenizer",
    "tokenizer_from_json",
]


def _lib():
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "subword tokenizers need the Hugging Face 'tokenizers' package: pip install 'seqlab[hf]'"
        ) from None
    return tokenizers


def _fast_encoder(tokenizer):
    """``tokenizer.encode_batch_fast``, or ``encode_batch`` (the same ids, slower) where the installed tokenizers
    predates it, said once."""
    fast = getattr(tokenizer, "encode_batch_fast", None)
    if fast is None:
        _say_no_fast_encoder()
    return fast or tokenizer.encode_batch


@functools.cache
def _say_no_fast_encoder() -> None:
    logging.getLogger("seqlab.tasks").info(
        "tokenizers %s has no encode_batch_fast (0.20.1 and later): encoding with encode_batch, which also "
        "computes the offsets of every token (slower); pip install -U tokenizers for the fast one",
        _lib().__version__,
    )


def _chunks(text: str | Iterable[str], size: int = 1 << 16) -> Iterable[str]:
    if isinstance(text, str):
        return (text[i : i + size] for i in range(0, len(text), size))
    return text


class SubwordTokenizer:
    """A trained ``tokenizers.Tokenizer`` behind seqlab's tokenizer interface."""

    kind: Literal["bpe", "wordpiece"]

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> Tensor:
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.long)

    def decode(self, ids) -> str:
        ids = ids_to_decode(ids, self.vocab_size, type(self).__name__)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many texts at once (the library encodes them in parallel): a list of id lists."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Many texts at once, stored flat: (ids int32 (sum of lengths,), lengths int64 (n,)), text i's ids
        one after another, the ids of :meth:`encode_batch`. Through ``encode_batch_fast`` (tokenizers 0.20.1 and
        later: no character offsets computed); give chunks of some thousand texts, each lives as a Python list
        until it is copied."""
        rows = [e.ids for e in _fast_encoder(self.tokenizer)(list(texts))]
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
        return ids, lengths

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def to_json(self) -> str:
        return json.dumps(
            {"type": self.kind, "tokenizer": json.loads(self.tokenizer.to_str())}, ensure_ascii=False
        )

    @classmethod
    def from_json(cls, text: str):
        data = json.loads(text)
        if data.get("type") != cls.kind:
            raise ValueError(f"not a {cls.kind} tokenizer: type={data.get('type')!r}")
        return cls(_lib().Tokenizer.from_str(json.dumps(data["tokenizer"])))

    def save(self, path) -> None:
        from pathlib import Path

        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path):
        from pathlib import Path

        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class BPETokenizer(SubwordTokenizer):
    """Byte-level BPE: ``BPETokenizer.train(text, vocab_size=1000)``; lossless encode/decode."""

    kind = "bpe"
    SPECIALS = ("<|endoftext|>",)

    @classmethod
    def train(
        cls,
        text: str | Iterable[str],
        vocab_size: int = 1000,
        min_frequency: int = 2,
        special_tokens: tuple[str, ...] | None = None,
    ) -> BPETokenizer:
        """Learn merges from ``text``; ``special_tokens`` (default ``SPECIALS``) take ids 0, 1, ... in order."""
        tk = _lib()
        specials = cls.SPECIALS if special_tokens is None else tuple(special_tokens)
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"byte-level BPE needs vocab_size >= {256 + len(specials)} (256 bytes), got {vocab_size}"
            )
        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=list(specials),
            show_progress=False,
        )
        tok.train_from_iterator(_chunks(text), trainer=trainer)
        return cls(tok)


class TranslationTokenizer:
    """Source and target byte-level BPE for translation: one shared vocabulary, or one per side.

    ``<pad>``, ``<s>``, ``</s>`` are ids 0, 1, 2 of both. ``vocab_size`` is the source's (what the model's
    ``vocab_size`` counts); ``to_json`` holds both sides, so a checkpoint's ``tokenizer.json`` can translate.
    """

    kind = "translation"
    SPECIALS = ("<pad>", "<s>", "</s>")

    def __init__(self, source: BPETokenizer, target: BPETokenizer, shared: bool):
        self.source, self.target, self.shared = source, target, shared

    @classmethod
    def train(
        cls, sources: list[str], targets: list[str], vocab_size: int, shared: bool = True
    ) -> TranslationTokenizer:
        train = functools.partial(BPETokenizer.train, vocab_size=vocab_size, special_tokens=cls.SPECIALS)
        if shared:
            tok = train([*sources, *targets])
            return cls(tok, tok, True)
        return cls(train(sources), train(targets), False)

    @property
    def vocab_size(self) -> int:
        return self.source.vocab_size

    def to_json(self) -> str:
        sides = {"source": json.loads(self.source.to_json())}
        if not self.shared:
            sides["target"] = json.loads(self.target.to_json())
        return json.dumps({"type": self.kind, "shared": self.shared, **sides}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> TranslationTokenizer:
        data = json.loads(text)
        if data.get("type") != cls.kind:
            raise ValueError(f"not a translation tokenizer: type={data.get('type')!r}")
        source = BPETokenizer.from_json(json.dumps(data["source"]))
        target = source if data["shared"] else BPETokenizer.from_json(json.dumps(data["target"]))
        return cls(source, target, bool(data["shared"]))

    def __repr__(self) -> str:
        sizes = self.source.vocab_size if self.shared else (self.source.vocab_size, self.target.vocab_size)
        return f"TranslationTokenizer(shared={self.shared}, vocab_size={sizes})"


class WordPieceTokenizer(SubwordTokenizer):
    """WordPiece with BERT's special tokens: ``WordPieceTokenizer.train(text, vocab_size=1000)``."""

    kind = "wordpiece"
    SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

    @classmethod
    def train(
        cls,
        text: str | Iterable[str],
        vocab_size: int = 1000,
        lowercase: bool = False,
        min_frequency: int = 2,
    ) -> WordPieceTokenizer:
        tk = _lib()
        tok = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = tk.normalizers.BertNormalizer(lowercase=lowercase, strip_accents=False)
        tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
        tok.decoder = tk.decoders.WordPiece(prefix="##")
        trainer = tk.trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(cls.SPECIALS),
            show_progress=False,
        )
        tok.train_from_iterator(_chunks(text), trainer=trainer)
        return cls(tok)

    def decode(self, ids) -> str:
        ids = ids_to_decode(ids, self.vocab_size, type(self).__name__)
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def tokenizer_from_json(text: str):
    """Rebuild a tokenizer from ``to_json()`` output, dispatching on its ``type``: char, bpe or wordpiece; text
    that is not such output (a hand-edited file, another library's tokenizer.json) is a ValueError."""
    from seqlab.tasks.text import CharTokenizer

    try:
        saved = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"tokenizer.json is not valid JSON ({e})") from None
    kind = saved.get("type") if isinstance(saved, dict) else None
    kinds = {
        "char": CharTokenizer,
        "bpe": BPETokenizer,
        "wordpiece": WordPieceTokenizer,
        "translation": TranslationTokenizer,
    }
    if kind not in kinds:
        raise ValueError(
            f"unknown tokenizer type {kind!r} in tokenizer.json; known: char, bpe, wordpiece, translation"
        )
    try:
        return kinds[kind].from_json(text)
    except Exception as e:  # KeyError, TypeError, ValueError, and the bare Exception of tokenizers' parser
        raise ValueError(
            f"tokenizer.json of type {kind!r} is not one seqlab wrote ({type(e).__name__}: {e})"
        ) from e
