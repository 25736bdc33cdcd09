r"""Frame sequences: an action per clip (many to one), an event per frame (many to many, aligned), a sentence
per clip (many to many, sequence to sequence), on generated moving objects or a user's folder of clips.

Notation: ``b`` batch, ``t`` frames, ``c`` channels, ``S`` frame side, ``K`` classes, ``n`` caption positions.

Sources (nothing is downloaded):

    generated  moving objects (``seqlab.tasks.clips``), deterministic from ``seed``: ``n_train`` training clips
               and ``n_eval`` validation and test clips, each split from its own seed; ``setting='long'`` makes
               the action the direction of the first frames only, so that the families' memory shows
    folder     a user's clips and ``labels.csv`` (``seqlab.tasks.clip_files``), split 80/10/10 by clip (the same
               split for every seed: ``base.SPLIT_SEED``; stratified by action for ``label='action'``); colour
               unless every frame is grey (``channels`` 1 or 3 converts)

A setting that does not apply (for a folder those of the generated clips: ``setting``, ``n_objects``,
``sprites``, ``event_prob``, ``n_train``, ``n_eval``; for ``setting='long'``, ``event_prob``) is refused when
given other than its default, before any clip is read or drawn (``seqlab.tasks.video_settings``).

Labels (``label``), one task per shape of the lecture's table:

    action   the clip's motion class from the whole clip: cross-entropy of model(clips) (b, K); accuracy
    frames   an event per frame (appeared, moving, turned, ...): cross-entropy of model(clips) (b, t, K) per
             frame; accuracy and macro F1 over the frames (scikit-learn), the measure that a majority class
             cannot inflate
    caption  a sentence: the captioners' teacher-forced loss (``seqlab.tasks.captioning.caption_loss``) on a
             word vocabulary (Hugging Face ``tokenizers``); exact match and BLEU-4 (sacrebleu) of greedy
             captions

Pixels are scaled to [0, 1] and standardized per channel with the training clips' statistics. Training batch
``i`` holds positions ``i b ...`` of an endless sequence of seeded epochs; evaluation reads each clip once.
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
    SPLIT_SEED,
    Batch,
    Task,
    channel_stats,
    check_choice,
    check_index,
    check_int,
    check_output,
    epoch_rows,
    model_device,
    stratified_order,
)
from seqlab.tasks.captioning import (
    caption_loss,
    caption_words,
    generated_words,
    teacher_forcing,
    word_tokenizer,
)
from seqlab.tasks.video_settings import check_video_settings

__all__ = ["VideoTask"]

log = logging.getLogger("seqlab.tasks")

Label = Literal["action", "frames", "caption"]
Setting = Literal["short", "long"]
Source = Literal["generated", "folder"]
SPLITS = ("train", "val", "test")
EOS = 2


@lru_cache(maxsize=6)
def _generated(n: int, seed: int, settings: tuple) -> Any:
    from seqlab.tasks.clips import make_clips

    return make_clips(n, seed=seed, **dict(settings))


class VideoTask(Task):
    """Clips to an action, to an event per frame, or to a caption; see the module docstring."""

    name = "video"
    model_families = ("video",)
    derived = ("n_classes", "class_names", "vocab_size", "majority", "n_clips")

    def __init__(
        self,
        label: Label = "action",
        setting: Setting = "short",
        source: Source = "generated",
        path: str | None = None,
        n_frames: int | None = None,
        frame_size: int | None = None,
        channels: int | None = None,
        n_objects: int = 1,
        sprites: Literal["shapes", "digits"] = "shapes",
        event_prob: float = 0.3,
        n_train: int = 4000,
        n_eval: int = 500,
        batch_size: int = 32,
        seed: int = 0,
    ):
        self.label, self.setting = (
            check_choice("label", label, Label),
            check_choice("setting", setting, Setting),
        )
        self.source, self.path = check_choice("source", source, Source), path
        drawn = {"setting": setting, "n_objects": n_objects, "sprites": sprites, "event_prob": event_prob}
        check_video_settings(VideoTask, source, setting, {**drawn, "n_train": n_train, "n_eval": n_eval})
        generated = source == "generated"  # a folder keeps its own sizes unless they are set
        # the value given is checked, not its fallback (n_frames=0 was reported as "got 1")
        self.n_frames = check_int("n_frames", (16 if generated else 1) if n_frames is None else n_frames, 1)
        self.frame_size = check_int(
            "frame_size", (32 if generated else 8) if frame_size is None else frame_size, 8
        )
        self._sizes = (n_frames, frame_size)
        # generated clips are grey unless set; a folder keeps its frames' colour unless set
        self.channels = 1 if channels is None and generated else channels
        self.n_objects, self.sprites = n_objects, sprites
        self.event_prob = event_prob
        self.n_train, self.n_eval = check_int("n_train", n_train, 1), check_int("n_eval", n_eval, 1)
        self.batch_size, self.seed = check_int("batch_size", batch_size, 1), check_int("seed", seed, 0)
        if (source == "folder") != (path is not None):
            raise ValueError(
                "source='folder' needs path=FOLDER (with labels.csv), and path belongs to it only"
            )
        self.clips = self._load_generated() if source == "generated" else self._load_folder()
        self._check_labels()
        mean, std = channel_stats(self.clips["train"].frames[:500], channel_dim=2)  # of 500 (N, t, c, S, S)
        self._mean = mean.view(1, 1, -1, 1, 1)  # (1, 1, c, 1, 1)
        self._std = std.clamp_min(1e-6).view(1, 1, -1, 1, 1)
        self.word_tokenizer = None
        if label == "caption":  # generated: the grammar's words, so the ids never depend on the sample drawn
            from seqlab.tasks.clips import CAPTION_WORDS

            words = list(CAPTION_WORDS) if source == "generated" else self.clips["train"].captions
            self.word_tokenizer = word_tokenizer(words)

    def _load_generated(self) -> dict[str, Any]:
        settings = {
            "n_frames": self.n_frames,
            "frame_size": self.frame_size,
            "channels": self.channels,
            "setting": self.setting,
            "n_objects": self.n_objects,
            "sprites": self.sprites,
            "event_prob": self.event_prob,
        }
        key = tuple(sorted(settings.items()))
        return {
            split: _generated(self.n_train if split == "train" else self.n_eval, self.seed * 3 + k, key)
            for k, split in enumerate(SPLITS)
        }

    def _load_folder(self) -> dict[str, Any]:
        from seqlab.tasks.clip_files import read_clip_folder

        n_frames, frame_size = self._sizes  # frame_size set: every frame resized to it
        clips = read_clip_folder(self.path, frame_size=frame_size, channels=self.channels)
        if len(clips) < 10:
            raise ValueError(
                f"a video folder needs at least 10 clips to split into train/val/test, got {len(clips)}"
            )
        if n_frames is not None and clips.frames.size(1) != n_frames:
            raise ValueError(
                f"the clips in {self.path} have {clips.frames.size(1)} frames, not task.n_frames={n_frames}"
            )
        self.n_frames, self.frame_size = clips.frames.size(1), clips.frames.size(-1)
        self.channels = clips.frames.size(2)  # as read: 1 if every frame is grey, else 3 (unless set)
        if (
            self.label == "action"
        ):  # each action (and the unlabelled clips) in its share, every one in training
            order = stratified_order(clips.actions, SPLIT_SEED)
        else:
            order = torch.randperm(len(clips), generator=torch.Generator().manual_seed(SPLIT_SEED))
        cut_val, cut_test = int(0.8 * len(clips)), int(0.9 * len(clips))
        parts = {"train": order[:cut_val], "val": order[cut_val:cut_test], "test": order[cut_test:]}
        return {split: clips.subset(rows) for split, rows in parts.items()}

    def _check_labels(self) -> None:
        train = self.clips["train"]
        if self.label == "action":  # a blank action cell: the clip is in no loss and no score
            blank = {split: int((c.actions < 0).sum()) for split, c in self.clips.items()}
            for split, n in blank.items():
                if n == len(self.clips[split]):
                    raise ValueError(
                        f"label='action' needs an action (column 'action' in labels.csv) for some clip of "
                        f"every split, but none of the {n} {split} clips has one; label more clips"
                    )
            if any(blank.values()):
                log.warning(
                    "%d of %d clips have no action (a blank 'action' cell): they count in no loss or score",
                    sum(blank.values()),
                    sum(len(c) for c in self.clips.values()),
                )
        if self.label == "frames" and bool((train.events < 0).any()):
            raise ValueError(
                "label='frames' needs an event for every frame (an 'events' column in labels.csv)"
            )
        if self.label == "caption" and not all(train.captions):
            raise ValueError(
                "label='caption' needs a caption for every clip (a 'caption' column in labels.csv)"
            )

    # ---- sizes -------------------------------------------------------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        from seqlab.tasks.clips import EVENTS

        return EVENTS if self.label == "frames" else tuple(self.clips["train"].action_names)

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def vocab_size(self) -> int | None:
        return None if self.word_tokenizer is None else self.word_tokenizer.get_vocab_size()

    @property
    def n_clips(self) -> dict[str, int]:
        return {split: len(c) for split, c in self.clips.items()}

    @property
    def majority(self) -> float:
        """The accuracy of always answering the training set's most frequent class (0 for captions)."""
        if self.label == "caption":
            return 0.0
        y = self._targets(self.clips["train"], torch.arange(len(self.clips["train"]))).flatten()
        return torch.bincount(y[y >= 0]).max().item() / max(1, int((y >= 0).sum()))

    @property
    def max_caption_len(self) -> int:
        return max(len(self.encode(c)) for c in self.clips["train"].captions) + 1

    def model_overrides(self) -> dict[str, Any]:
        c = self.clips["train"].frames
        over = {"head": self.label, "n_frames": c.size(1), "frame_size": c.size(-1), "in_channels": c.size(2)}
        if self.label == "caption":
            return {**over, "vocab_size": self.vocab_size, "max_len": max(16, self.max_caption_len + 4)}
        return {**over, "n_classes": self.n_classes}

    def check_split(self, split: Any) -> str:
        if split not in self.clips:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return split

    # ---- text --------------------------------------------------------------------------------------------

    def encode(self, caption: str) -> list[int]:
        return self.word_tokenizer.encode(caption).ids

    def decode(self, ids: list[int] | Tensor) -> str:
        """Caption ids -> text, up to eos (bos, eos and pads dropped)."""
        return " ".join(w for w in generated_words(ids, self.word_tokenizer.id_to_token) if w != "</s>")

    # ---- batches and loss --------------------------------------------------------------------------------

    def prepare(self, frames: Tensor) -> Tensor:
        """uint8 clips (b, t, c, S, S) -> the standardized floats the model was trained on."""
        return (frames.float() / 255.0 - self._mean) / self._std

    def _targets(self, clips: Any, rows: Tensor) -> Tensor:
        return clips.events[rows] if self.label == "frames" else clips.actions[rows]

    def get_batch(self, split: str, index: int) -> Batch:
        index, split = check_index(index), self.check_split(split)
        clips, b = self.clips[split], self.batch_size
        if split == "train":
            rows = epoch_rows(self.seed, len(clips), index, b)
        else:
            rows = torch.arange(index * b, index * b + b) % len(clips)  # in order, wrapping
        return self._rows_batch(clips, rows)

    def tokens_in(self, batch: Batch) -> int:
        """Frames read."""
        return batch["clips"].shape[0] * batch["clips"].shape[1]

    def loss(self, model, batch: Batch, state: Any = None) -> tuple[Tensor, dict[str, float], Any]:
        dev = model_device(model)
        clips = batch["clips"].to(dev)
        if self.label == "caption":
            loss, metrics = caption_loss(
                model, clips, batch["tgt_in"].to(dev), batch["tgt_out"].to(dev), "clips"
            )
            return loss, metrics, None
        y = batch["y"].to(dev)
        b, t = clips.shape[:2]
        if self.label == "action":
            logits = check_output("video actions", model(clips), (b, self.n_classes), "logits (b, K)")
        else:
            logits = check_output("video frames", model(clips), (b, t, self.n_classes), "logits (b, t, K)")
        flat, target = logits.reshape(-1, self.n_classes).float(), y.reshape(-1)
        real = target >= 0
        if not real.any():  # every clip unlabelled: cross_entropy's mean over none is NaN; nothing to learn
            nll = flat.sum() * 0.0
            return nll, {"loss": 0.0, "acc": 0.0}, None
        nll = F.cross_entropy(flat, target, ignore_index=-1)
        with torch.no_grad():
            acc = (flat.argmax(-1)[real] == target[real]).float().mean().item()
        return nll, {"loss": nll.item(), "acc": acc}, None

    # ---- predictions and scores --------------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, model, frames: Tensor) -> Tensor:
        """uint8 clips (b, t, c, S, S) -> predicted classes (b,) or (b, t), or caption ids (b, 1 + n)."""
        x = self.prepare(frames).to(model_device(model))
        if self.label == "caption":
            return model.generate(x, max_new_tokens=self.max_caption_len + 4).cpu()
        return model(x).argmax(-1).cpu()

    @torch.no_grad()
    def evaluate(self, model, max_batches: int = 20, split: str = "val") -> dict[str, float]:
        """Loss and accuracy over the first ``max_batches`` batches' clips (each once), with macro F1 for
        frames and exact match and BLEU-4 of greedy captions for captions."""
        check_int("max_batches", max_batches, 1)
        split = self.check_split(split)
        clips, b = self.clips[split], self.batch_size
        n = min(len(clips), max_batches * b)
        was_training = model.training
        model.eval()
        try:
            totals, weight, preds = {}, 0, []
            for start in range(0, n, b):
                rows = torch.arange(start, min(n, start + b))
                batch = self._rows_batch(clips, rows)
                _, m, _ = self.loss(model, batch)
                k = self.tokens_in(batch) if self.label != "caption" else int((batch["tgt_out"] != 0).sum())
                totals = {key: totals.get(key, 0.0) + v * k for key, v in m.items()}
                weight += k
                preds.append(self.predict(model, clips.frames[rows]))
        finally:
            model.train(was_training)
        out = {key: v / weight for key, v in totals.items()}
        out.update(self._scores(clips, n, preds))
        if "nll" in out:
            out["ppl"] = math.exp(min(out["nll"], 50.0))
        return {f"{split}_{k}": v for k, v in out.items()}

    def _rows_batch(self, clips: Any, rows: Tensor) -> Batch:
        """The batch of the given clips: ``clips`` (b, t, c, S, S) float, ``index`` (b,), and ``y`` (b,) or
        (b, t) long, or ``tgt_in`` and ``tgt_out`` (b, n) for captions."""
        batch = {"clips": self.prepare(clips.frames[rows]), "index": rows}
        if self.label == "caption":
            batch["tgt_in"], batch["tgt_out"] = teacher_forcing(
                [self.encode(clips.captions[r]) for r in rows]
            )
        else:
            batch["y"] = self._targets(clips, rows)
        return batch

    def _scores(self, clips: Any, n: int, preds: list[Tensor]) -> dict[str, float]:
        if self.label == "caption":
            from seqlab.tasks.caption_metrics import bleu4

            hyps = [self.decode(row) for p in preds for row in p]
            refs = [
                caption_words(self.word_tokenizer, c) for c in clips.captions[:n]
            ]  # as decode writes them
            exact = sum(h == r for h, r in zip(hyps, refs, strict=True)) / n
            return {"exact": exact, "bleu4": bleu4(hyps, [[r] for r in refs])}
        pred = torch.cat(preds).flatten()
        true = self._targets(clips, torch.arange(n)).flatten()
        real = true >= 0
        out = {"acc": (pred[real] == true[real]).float().mean().item()}
        if self.label == "frames":
            from sklearn.metrics import f1_score

            y, p = true[real].numpy(), pred[real].numpy()
            out["macro_f1"] = float(f1_score(y, p, labels=sorted(set(y.tolist())), average="macro"))
        return out

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["mean"], info["std"] = self._mean.flatten().tolist(), self._std.flatten().tolist()
        if self.word_tokenizer is not None:
            info["vocabulary"] = [self.word_tokenizer.id_to_token(i) for i in range(self.vocab_size)]
        return info
