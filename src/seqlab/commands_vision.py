"""Subcommands for image models that :mod:`seqlab.cli` registers: ``seqlab caption``, ``seqlab classify`` (a
ViT's classes for image files), ``seqlab viz caption``, and the images of ``seqlab viz attention`` (a ViT's
attention over an image: :mod:`seqlab.commands_attention`).

An image comes from a file (``--image``, any format Pillow reads, fitted into the model's image size on white
with its aspect kept), or for checkpoints trained on built-in data from the data itself: ``--scene SPLIT:N``
(the N-th generated scene of a split of the captioning task, e.g. ``heldout:3``) and ``--test-image N`` (the
N-th test image of an image-classification task). Pixels are standardized with the statistics the checkpoint
was trained with (saved in its task description).
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor

from seqlab.cli_values import int_in
from seqlab.commands import beam_width
from seqlab.outfiles import add_out_file
from seqlab.run import positive_int

__all__ = [
    "MAX_CAPTION_WORDS",
    "add_caption",
    "add_classify",
    "add_viz_caption",
    "image_from_args",
    "standardize",
]


def _checkpoint(path: str, families: tuple[str, ...], what: str):
    """(model in eval mode, saved task description) of a checkpoint whose model is of one of ``families``."""
    from seqlab.commands import announce
    from seqlab.training.checkpoint import load_config, load_model, resolve_checkpoint

    where = resolve_checkpoint(path)
    model = load_model(where).eval()
    if getattr(model, "family", None) not in families:
        wanted = " or a ".join(repr(f) for f in families)
        raise ValueError(
            f"{where} holds a {getattr(model, 'family', '?')!r} model; {what} needs a {wanted} model"
        )
    announce(where)
    return model, load_config(where)["task"]


def standardize(images: Tensor, task: dict) -> Tensor:
    """uint8 (b, c, S, S) -> the floats the checkpoint trained on, with its saved per-channel statistics (a
    clip's frames (t, c, S, S) alike)."""
    mean = torch.tensor(task["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(task["std"]).view(1, -1, 1, 1)
    return (images.float() / 255.0 - mean) / std


def _user_image(path: str, task: dict, size: int, channels: int) -> Tensor:
    """An image file as the checkpoint's training images were: uint8 (c, S, S), letterboxed on their
    background, grey as Pillow's "L" (luma), not the channels' mean."""
    from seqlab.tasks.image_files import load_image
    from seqlab.tasks.vision import DARK_SOURCES

    background = (0, 0, 0) if task.get("source") in DARK_SOURCES else (255, 255, 255)
    return load_image(path, size, background, grey=channels == 1)


IMAGE_SOURCES = {"image": "--image FILE", "scene": "--scene SPLIT:N", "test_image": "--test-image N"}


def image_from_args(args: argparse.Namespace, task: dict, size: int, channels: int) -> Tensor:
    """The uint8 image (c, S, S) a command was asked about; exactly one source may be given, and the message
    names only the sources the command has (caption: --image, --scene; viz attention: --image, --test-image)."""
    has = [k for k in IMAGE_SOURCES if hasattr(args, k)]
    given = [k for k in has if getattr(args, k) is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one image: {' or '.join(IMAGE_SOURCES[k] for k in has)}")
    if args.image is not None:
        return _user_image(args.image, task, size, channels)
    if getattr(args, "scene", None) is not None:
        return _scene(args.scene, task)
    return _test_image(args.test_image, task)


MAX_SCENE = 100_000
MAX_CAPTION_WORDS = 100
"""caption's longest caption: a scene's caption is about a dozen words (beam 3 decodes 100 words in seconds; 1e8 ran for minutes, silently)."""


def _scene(spec: str, task: dict) -> Tensor:
    from seqlab.tasks.scenes import SPLITS, make_scenes

    if task.get("name") != "captioning" or task.get("source") != "scenes":
        raise ValueError(
            "--scene needs a checkpoint trained on the generated scenes (task captioning, source scenes)"
        )
    split, _, index = spec.partition(":")
    if split not in SPLITS or not index.isdigit():
        raise ValueError(f"--scene must be SPLIT:N with SPLIT one of {SPLITS}, e.g. heldout:3; got {spec!r}")
    if int(index) >= MAX_SCENE:  # the N-th scene is drawn after the N before it (memory and time grow with N)
        raise ValueError(f"--scene {spec}: N must be below {MAX_SCENE:,} (scenes are drawn in order up to N)")
    images, _ = make_scenes(int(index) + 1, split, task["seed"], task["image_size"], task["max_objects"])
    return images[-1]


def _test_image(index: int, task: dict) -> Tensor:
    from seqlab.tasks import create_task

    if task.get("name") != "image_classification":
        raise ValueError("--test-image needs a checkpoint trained on the image_classification task")
    settings = {k: task[k] for k in ("source", "seed", "n_val", "image_size", "data_dir")}
    data = create_task("image_classification", **settings)
    images = data._splits["test"][0]
    if index >= len(images):
        raise ValueError(
            f"--test-image {index}: the test split has {len(images)} images (0 ... {len(images) - 1})"
        )
    return images[index]


class _Words:
    """A captioning checkpoint's vocabulary (saved in its task description): generated ids -> words, text."""

    def __init__(self, vocabulary: list[str]):
        self.vocabulary = vocabulary

    def words(self, ids: Tensor) -> list[str]:
        from seqlab.tasks.captioning import generated_words

        return generated_words(ids, self.vocabulary.__getitem__)

    def text(self, ids: Tensor) -> str:
        return " ".join(w for w in self.words(ids) if w != "</s>")


def _captioner(args: argparse.Namespace):
    model, task = _checkpoint(args.checkpoint, ("captioner",), "captioning")
    c = model.config
    image = image_from_args(args, task, c.image_size, c.in_channels)
    return model, task, image, _Words(task["vocabulary"])


def _cmd_caption(args: argparse.Namespace) -> int:
    model, task, image, words = _captioner(args)
    ids = model.generate(
        standardize(image[None], task), beam_size=args.beam, max_new_tokens=args.max_new_tokens
    )
    print(words.text(ids[0]))
    return 0


def _cmd_viz_caption(args: argparse.Namespace) -> int:
    from seqlab.viz.captions import plot_caption_attention

    model, task, image, words = _captioner(args)
    if model.config.attention == "none":
        raise ValueError("this captioner has no attention (Show and Tell): there is no attention to draw")
    ids, alpha = model.generate(
        standardize(image[None], task),
        beam_size=args.beam,
        max_new_tokens=args.max_new_tokens,
        return_attention=True,
    )
    said = words.words(ids[0])
    path = plot_caption_attention(image, said, alpha[0, : len(said)], args.out, title=words.text(ids[0]))
    print(f"{words.text(ids[0])}\nwrote {path}")
    return 0


def _add_image_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    p.add_argument("--image", help="an image file (PNG, JPEG, ...), fitted into the model's image size")
    p.add_argument("--scene", help="SPLIT:N, the N-th generated scene of a split (train, val, test, heldout)")
    p.add_argument("--beam", type=beam_width(), default=3, help="beam size (1: greedy)")
    p.add_argument(
        "--max-new-tokens",
        type=int_in(1, MAX_CAPTION_WORDS),
        default=24,
        help=f"the longest caption, in words (at most {MAX_CAPTION_WORDS}; a transformer decoder: its max_len)",
    )


def add_caption(sub) -> None:
    c = sub.add_parser("caption", help="describe an image with a trained captioner")
    _add_image_source(c)
    c.set_defaults(func=_cmd_caption)


CLASSIFY_BATCH = 64  # images per forward pass of seqlab classify


def check_top(k: int, classes: list[str], where) -> list[str]:
    """``classes``, once ``--top k`` is known to ask for no more classes than the model has."""
    if k > len(classes):
        raise ValueError(f"--top {k}: the model in {where} knows {len(classes)} classes")
    return classes


def top_classes(probs: Tensor, classes: list[str], k: int) -> str:
    """'name (p = 0.93), name (p = 0.04)': the ``k`` most probable of ``probs`` (K,), best first."""
    best = probs.topk(k)
    return ", ".join(
        f"{classes[i]} (p = {q:.2f})"
        for q, i in zip(best.values.tolist(), best.indices.tolist(), strict=True)
    )


def _cmd_classify(args: argparse.Namespace) -> int:
    model, task = _checkpoint(args.checkpoint, ("vit", "video"), "classify")
    if model.family == "video":
        from seqlab.commands_video import classify_clips

        return classify_clips(args, model, task)
    classes = check_top(args.top, task.get("classes") or [], args.checkpoint)
    c = model.config  # every file read (and refused) before the first is classified
    images = torch.stack([_user_image(f, task, c.image_size, c.in_channels) for f in args.files])
    for start in range(0, len(images), CLASSIFY_BATCH):
        with torch.no_grad():
            probs = model(standardize(images[start : start + CLASSIFY_BATCH], task)).softmax(-1)  # (b, K)
        for path, p in zip(args.files[start : start + CLASSIFY_BATCH], probs, strict=True):
            print(f"{path}\t{top_classes(p, classes, args.top)}")
    return 0


def add_classify(sub) -> None:
    c = sub.add_parser(
        "classify",
        help="the classes a trained ViT gives image files, or a video model clips (or their frames)",
    )
    c.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="image files (PNG, JPEG, ...; any size and mode), or clips: NAME.npy or a folder of frame images",
    )
    c.add_argument(
        "--checkpoint",
        required=True,
        help="run directory or checkpoint directory of an image or video classifier",
    )
    c.add_argument(
        "--top", type=positive_int, default=1, help="the K most probable classes of each image or clip"
    )
    c.set_defaults(func=_cmd_classify)


def add_viz_caption(vsub) -> None:
    v = vsub.add_parser(
        "caption", help="where a captioner looks at each word (Show, Attend and Tell, Figure 3)"
    )
    _add_image_source(v)
    add_out_file(v, "runs/viz/caption-attention.png", "PNG file to write")
    v.set_defaults(func=_cmd_viz_caption)
