r"""Image captioning, one image to a sentence: generated scenes, Tux Paint's captioned stamps, or a user's folder.

Notation: ``b`` batch, ``S`` image side, ``t`` caption positions, ``v`` vocabulary, ``L`` image regions.

Sources (nothing is downloaded):

    scenes    generated 1-2 object scenes with grammar captions (``seqlab.tasks.scenes``), deterministic from
              ``seed``: ``n_train`` training, ``n_eval`` validation and test scenes of the seen colour–shape
              pairs, and a 'heldout' split whose scenes hold a pair never seen in training (compositional
              generalization); scored by the attributes read back from the caption as well as BLEU and CIDEr-D
    tuxpaint  the 785 captioned drawings of Debian's ``tuxpaint-stamps-default`` (read in place, GPL), on white
    folder    a captions file (CSV or JSON lines, ``seqlab.tasks.image_files``) naming the user's images

For the two file sources the images are split 80/10/10 into train/val/test by image (the same split for every
seed: ``base.SPLIT_SEED``), every caption of an image stays with it and all of them are its references;
``n_train`` and ``n_eval`` cap the training and the val and test images each (the first ones of that fixed order;
the defaults keep all), and ``max_objects``, a setting of the generated scenes, is refused. ``image_size`` is the
side every image is letterboxed into: at least 32 for the scenes (``scenes.render``), 8 for the files.
Words: a word-level vocabulary (Hugging Face ``tokenizers``' WordLevel model, lowercased, punctuation split
off) trained on the training captions; ids 0-3 are ``<pad> <s> </s> <unk>``, so the captioners' default
``pad_id=0, bos_id=1, eos_id=2`` hold. Pixels are scaled to [0, 1] and standardized per channel with the training
images' statistics. A ViT encoder of more than ``max_patches`` patches per image is refused (``check_model``).

Batch: ``images`` (b, 3, S, S) float; ``tgt_in`` (b, t) = ``<s>`` + caption, ``tgt_out`` (b, t) = caption +
``</s>``, right-padded with 0; ``index`` (b,) the image in its split. Training batch ``i`` holds positions
``i b ...`` of an endless sequence of epochs (a permutation per epoch, seeded); a file image with several
captions contributes one (image, caption) pair per caption.

Loss: the cross-entropy per caption token, plus for a model with soft LSTM attention (Show, Attend and Tell)
the doubly stochastic regularization λ · mean_i (1 − Σ_t α_ti)² (Xu et al. 2015, eq. 14), with λ the model's
``config.attention_penalty``; the mean over the L regions instead of the paper's sum keeps λ independent
of the grid. Evaluation decodes captions (greedy; ``score`` takes a beam) and computes BLEU-4 (sacrebleu),
CIDEr-D (pycocoevalcap) and on scenes the attribute scores.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlab.tasks.base import (
    Batch,
    Task,
    channel_stats,
    check_choice,
    check_index,
    check_int,
    epoch_rows,
    model_device,
)
from seqlab.tasks.caption_sources import check_for_source, file_pairs
from seqlab.tasks.source_settings import saved_description
from seqlab.tasks.vision import MAX_PATCHES, check_patches

__all__ = [
    "CaptioningTask",
    "caption_loss",
    "caption_words",
    "generated_words",
    "teacher_forcing",
    "word_tokenizer",
]

Source = Literal["scenes", "tuxpaint", "folder"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS = 0, 1, 2
SPLITS = ("train", "val", "test", "heldout")
N_TRAIN, N_EVAL = 20000, 1000  # the defaults: all of a file source's images
log = logging.getLogger("seqlab.tasks")


def word_tokenizer(captions: list[str]):
    """A word-level ``tokenizers.Tokenizer`` trained on ``captions`` (lowercased; specials first)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(captions, trainers.WordLevelTrainer(special_tokens=SPECIALS, show_progress=False))
    return tok


def caption_words(tokenizer, caption: str) -> str:
    """A caption as the word vocabulary sees it: lowercased, punctuation split off, words joined by single spaces,
    each word kept even where the vocabulary lacks it. Decoded hypotheses come out this way, so references are
    scored in this form too (``A ladybug.`` and the hypothesis ``a ladybug .`` are a perfect match)."""
    normalized = tokenizer.normalizer.normalize_str(caption)
    return " ".join(word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized))


def generated_words(ids: list[int] | Tensor, token_of) -> list[str]:
    """The words of generated ids, one per decoding step: after bos, up to the first pad, eos included;
    ``token_of(id)`` names an id (a tokenizer's ``id_to_token``, or a saved vocabulary's lookup)."""
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    ids = ids[1:] if ids and ids[0] == BOS else ids
    out = []
    for i in ids:
        if i == PAD:
            break
        out.append(token_of(i))
        if i == EOS:
            break
    return out


def teacher_forcing(seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Caption ids -> tgt_in (b, t) = bos + ids and tgt_out (b, t) = ids + eos, right-padded with 0."""
    b, t = len(seqs), max(len(s) for s in seqs) + 1
    tgt_in, tgt_out = torch.full((b, t), PAD), torch.full((b, t), PAD)
    for i, s in enumerate(seqs):
        tgt_in[i, : len(s) + 1] = torch.tensor([BOS, *s])
        tgt_out[i, : len(s) + 1] = torch.tensor([*s, EOS])
    return tgt_in, tgt_out


def caption_loss(
    model, inputs: Tensor, tgt_in: Tensor, y: Tensor, what: str
) -> tuple[Tensor, dict[str, float]]:
    """The captioners' loss: cross-entropy per caption token, plus λ · mean_i (1 − Σ_t α_ti)² for a model with
    soft LSTM attention (λ its ``config.attention_penalty``); ``inputs`` are images or clips (named ``what``)."""
    c = getattr(model, "config", None)
    penalty = getattr(c, "attention_penalty", 0.0) if getattr(c, "decoder", None) == "lstm" else 0.0
    penalty = penalty if getattr(c, "attention", "none") == "soft" else 0.0
    out = model(inputs, tgt_in, return_attention=True) if penalty else model(inputs, tgt_in)
    logits, alpha = out if penalty else (out, None)
    if not isinstance(logits, Tensor) or logits.shape[:2] != y.shape:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(
            f"captioning expects model({what}, tgt_in) -> (b, t, v) with (b, t)={tuple(y.shape)}, got {got}"
        )
    flat, target = logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1)
    nll = F.cross_entropy(flat, target, ignore_index=PAD)
    metrics = {"nll": nll.item()}
    loss = nll
    if alpha is not None:  # Σ_t over the real words of each caption: (b, t, L) -> (b, L)
        coverage = (alpha * (y != PAD).unsqueeze(-1)).sum(1)
        reg = ((1.0 - coverage) ** 2).mean()
        loss = loss + penalty * reg
        metrics["attention_reg"] = reg.item()
    with torch.no_grad():
        real = target != PAD
        metrics["acc"] = (flat.argmax(-1)[real] == target[real]).float().mean().item()
    metrics["loss"] = loss.item()
    metrics["ppl"] = math.exp(min(metrics["nll"], 50.0))
    return loss, metrics


@lru_cache(maxsize=8)
def _scenes(n: int, split: str, seed: int, image_size: int, max_objects: int):
    from seqlab.tasks.scenes import make_scenes

    return make_scenes(n, split, seed=seed, image_size=image_size, max_objects=max_objects)


class CaptioningTask(Task):
    """Caption images; see the module docstring."""

    name = "captioning"
    model_families = ("captioner",)
    derived = ("vocab_size", "n_images", "max_caption_len")

    def __init__(
        self,
        source: Source = "scenes",
        captions: str | None = None,
        image_size: int = 64,
        batch_size: int = 64,
        seed: int = 0,
        n_train: int = N_TRAIN,
        n_eval: int = N_EVAL,
        max_objects: int = 2,
        max_patches: int = MAX_PATCHES,
    ):
        check_choice("source", source, Source)
        self.source, self.captions = source, captions
        self.image_size, self.max_objects = check_for_source(source, image_size, max_objects), max_objects
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.n_train, self.n_eval = check_int("n_train", n_train, 1), check_int("n_eval", n_eval, 1)
        self.max_patches = check_int("max_patches", max_patches, 1)
        if captions is not None and source != "folder":  # the scenes would train instead, without a word
            raise ValueError(
                f"captions=PATH belongs to source='folder' (this run has source={source!r}); add it"
            )
        self._images: dict[str, Tensor] = {}  # uint8 (N, 3, S, S) per split
        self._refs: dict[str, list[list[str]]] = {}  # every reference caption of each image
        self.scenes: dict[str, list] = {}
        if source == "scenes":
            for split in SPLITS:
                n = n_train if split == "train" else n_eval
                self._images[split], self.scenes[split] = _scenes(n, split, seed, image_size, max_objects)
                self._refs[split] = [s.references for s in self.scenes[split]]
        else:
            self._load_files(file_pairs(source, captions))
        # one (image, caption) pair per training caption; scenes train on their own caption only
        self._pairs = [(i, refs[0] if source == "scenes" else c) for i, refs in enumerate(self._refs["train"])
                       for c in (refs[:1] if source == "scenes" else refs)]  # fmt: skip
        self.word_tokenizer = word_tokenizer([c for _, c in self._pairs])
        mean, std = channel_stats(self._images["train"], channel_dim=1)  # of (N, 3, S, S): (3,) each
        self._mean, self._std = mean.view(1, -1, 1, 1), std.clamp_min(1e-6).view(1, -1, 1, 1)  # (1, 3, 1, 1)
        self._ids = [self.encode(c) for _, c in self._pairs]

    def _load_files(self, pairs: list[tuple[Any, str]]) -> None:
        """The split of a file source (``image_files.split_captioned``), each cut to ``n_train`` or ``n_eval``
        images before any is read."""
        from seqlab.tasks.image_files import load_images, split_captioned

        kept = {"train": ("n_train", self.n_train, N_TRAIN)}
        trained = (saved_description() or {}).get("n_images") or {}  # a saved run's: the images it read
        for split, rows in split_captioned(pairs).items():
            name, cap, default = kept.get(split, ("n_eval", self.n_eval, N_EVAL))
            if cap < len(rows) and trained.get(split) == len(rows):
                log.warning("the run's saved settings: task.%s=%d, but the run read all %d %s images of "
                            "source=%r (seqlab then read every image of captioned files): all are read again, "
                            "as in training", name, cap, len(rows), split, self.source)  # fmt: skip
                cap = len(rows)
            if cap > len(rows) and cap != default:
                log.warning("task.%s=%d is more than the %d %s images of source=%r: all are used",
                            name, cap, len(rows), split, self.source)  # fmt: skip
            self._images[split] = load_images([p for p, _ in rows[:cap]], self.image_size)  # (N, 3, S, S)
            self._refs[split] = [refs for _, refs in rows[:cap]]

    def check_model(self, model) -> None:
        """Before step 1: a ViT encoder's patch tokens per image against ``max_patches``."""
        check_patches(model, self.max_patches)

    # ---- sizes -------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.word_tokenizer.get_vocab_size()

    @property
    def n_images(self) -> dict[str, int]:
        return {split: len(refs) for split, refs in self._refs.items()}

    @property
    def max_caption_len(self) -> int:
        return max(len(ids) for ids in self._ids) + 1  # with bos (or eos)

    def model_overrides(self) -> dict[str, Any]:
        over = {"vocab_size": self.vocab_size, "image_size": self.image_size, "in_channels": 3}
        return {**over, "max_len": max(32, self.max_caption_len + 8)}

    def splits(self) -> tuple[str, ...]:
        return tuple(self._refs)

    def check_split(self, split: Any) -> str:
        if split not in self._refs:
            raise ValueError(
                f"split must be one of {self.splits()} for source={self.source!r}, got {split!r}"
            )
        return split

    # ---- text --------------------------------------------------------------------------------------------

    def encode(self, caption: str) -> list[int]:
        return self.word_tokenizer.encode(caption).ids

    def decode(self, ids: list[int] | Tensor) -> str:
        """Caption ids -> text, stopping at eos (bos and pads skipped)."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        ids = ids[: ids.index(EOS)] if EOS in ids else ids
        return self.word_tokenizer.decode([i for i in ids if i not in (PAD, BOS)], skip_special_tokens=False)

    def words(self, ids: list[int] | Tensor) -> list[str]:
        """The words of generated ids (after bos, up to and with eos), one per decoding step."""
        return generated_words(ids, self.word_tokenizer.id_to_token)

    def prepare(self, images: Tensor) -> Tensor:
        """uint8 (b, 3, S, S) -> the standardized floats the model was trained on."""
        return (images.float() / 255.0 - self._mean) / self._std

    # ---- batches and loss --------------------------------------------------------------------------------

    def get_batch(self, split: str, index: int) -> Batch:
        index, split = check_index(index), self.check_split(split)
        b = self.batch_size
        if split == "train":
            pairs = epoch_rows(self.seed, len(self._pairs), index, b).tolist()
            image_rows = torch.tensor([self._pairs[r][0] for r in pairs])
            seqs = [self._ids[r] for r in pairs]
        else:
            image_rows = torch.arange(index * b, index * b + b) % len(self._refs[split])  # in order, wrapping
            seqs = [self.encode(self._refs[split][r][0]) for r in image_rows.tolist()]
        tgt_in, tgt_out = teacher_forcing(seqs)
        images = self.prepare(self._images[split][image_rows])
        return {"images": images, "tgt_in": tgt_in, "tgt_out": tgt_out, "index": image_rows}

    def tokens_in(self, batch: Batch) -> int:
        return int((batch["tgt_out"] != PAD).sum())

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        dev = model_device(model)
        images, tgt_in, y = (batch[k].to(dev) for k in ("images", "tgt_in", "tgt_out"))
        loss, metrics = caption_loss(model, images, tgt_in, y, "images")
        return loss, metrics, None

    # ---- captions and scores -----------------------------------------------------------------------------

    @torch.no_grad()
    def caption(
        self, model, images: Tensor, beam_size: int = 1, max_new_tokens: int | None = None
    ) -> list[str]:
        """Captions of uint8 images (b, 3, S, S) (or already standardized floats)."""
        x = images if images.is_floating_point() else self.prepare(images)
        ids = model.generate(x.to(model_device(model)), max_new_tokens=max_new_tokens or self.max_caption_len + 4,
                             beam_size=beam_size)  # fmt: skip
        return [self.decode(row) for row in ids.cpu()]

    @torch.no_grad()
    def score(
        self, model, split: str = "test", beam_size: int = 1, limit: int | None = None
    ) -> dict[str, float]:
        """Decode the captions of a split (the first ``limit`` images) and score them: bleu4, cider_d, and on
        scenes the attribute scores (exact, colour, shape, size, relation, parsed)."""
        from seqlab.tasks.caption_metrics import caption_scores

        split = self.check_split(split)
        n = (
            len(self._refs[split])
            if limit is None
            else min(check_int("limit", limit, 1), len(self._refs[split]))
        )
        hyps = []
        for start in range(0, n, 256):
            images = self._images[split][start : min(n, start + 256)]
            hyps += self.caption(model, images, beam_size=beam_size)
        refs = [[caption_words(self.word_tokenizer, r) for r in refs] for refs in self._refs[split][:n]]
        scores = caption_scores(hyps, refs)
        if self.source == "scenes":
            from seqlab.tasks.scenes import attribute_scores

            scores.update(attribute_scores(hyps, self.scenes[split][:n]))
        return scores

    @torch.no_grad()
    def evaluate(
        self, model, max_batches: int = 20, split: str = "val", decode: bool = True
    ) -> dict[str, float]:
        """Per-token nll, ppl and accuracy over the first ``max_batches`` batches, and (``decode``) the caption
        scores of greedy decoding over the same images (each image once)."""
        check_int("max_batches", max_batches, 1)
        split = self.check_split(split)
        n = min(len(self._refs[split]), max_batches * self.batch_size)
        was_training = model.training
        model.eval()
        try:
            nll = acc = tokens = 0.0
            for index in range(-(-n // self.batch_size)):
                batch = self.get_batch(split, index)
                keep = min(self.batch_size, n - index * self.batch_size)  # the last batch wraps around:
                batch = {k: v[:keep] for k, v in batch.items()}  # its repeats are left out, each image once
                _, m, _ = self.loss(model, batch)
                k = self.tokens_in(batch)
                nll, acc, tokens = nll + m["nll"] * k, acc + m["acc"] * k, tokens + k
            scores = self.score(model, split, limit=n) if decode else {}
        finally:
            model.train(was_training)
        out = {"nll": nll / tokens, "ppl": math.exp(min(nll / tokens, 50.0)), "acc": acc / tokens, **scores}
        return {f"{split}_{k}": v for k, v in out.items()}

    def references(self, split: str) -> list[list[str]]:
        return self._refs[self.check_split(split)]

    def images(self, split: str) -> Tensor:
        """uint8 (N, 3, S, S) images of a split."""
        return self._images[self.check_split(split)]

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["mean"], info["std"] = self._mean.flatten().tolist(), self._std.flatten().tolist()
        info["vocabulary"] = [self.word_tokenizer.id_to_token(i) for i in range(self.vocab_size)]
        return info
