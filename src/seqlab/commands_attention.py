"""``seqlab viz attention``, which :mod:`seqlab.cli` registers: a language model's attention weights over a text
(a layers x heads overview, optionally one figure per map), or a ViT's over an image (one layer's heads and the
rollout of all layers).

Every option is checked against the checkpoint's kind before the weights load: an option the kind does not read
(``--heads`` for a ViT, ``--image`` for a language model) is refused by name, a layer or head past the model's is
refused with the valid range, and a checkpoint of another family is pointed to the command that draws its
attention (``viz alignment``, ``viz caption``, ``viz video``).

``--out``: a name ending in a figure format (``att.png``, ``att.pdf``) is the overview figure itself; any other
name is a folder (the default one gets the next free number when it already holds figures); a suffix that is not
a figure format (``att.txt``) is refused, as every figure command refuses it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seqlab.outfiles import figure_suffix, fresh_file, fresh_folder
from seqlab.run import indices, non_negative_int

__all__ = ["ATTENTION_OUT", "add_viz_attention"]

ATTENTION_OUT = "runs/viz/attention"  # the default folder
FLAGS = {"text": "--text", "image": "--image", "test_image": "--test-image", "layers": "--layers"}
FLAGS |= {"heads": "--heads", "per_head": "--per-head"}
TAKES = {"lm": ("text", "layers", "heads", "per_head"), "vit": ("image", "test_image", "layers")}
KINDS = {"lm": "a language model", "vit": "a ViT"}
ELSEWHERE = {
    "seq2seq": "an encoder–decoder's attention over its source is drawn by `seqlab viz alignment --text ...`",
    "transformer": "an encoder–decoder's attention over its source is drawn by `seqlab viz alignment --text ...`",
    "captioner": "a captioner's attention over its image is drawn by `seqlab viz caption`",
    "video": "a video caption model's attention over the frames is drawn by `seqlab viz video`",
}
WRITES = {"lm": ("attention.png", "layer*-head*.png"), "vit": ("vit-attention.png",)}


def _check_options(args: argparse.Namespace, family: str, where) -> None:
    """Refuse a checkpoint without attention maps, and each option its kind does not read (found before loading)."""
    if family not in TAKES:
        what = ELSEWHERE.get(family, "its model has no attention maps")
        raise ValueError(
            f"{where} holds a {family!r} model: viz attention draws a language model's attention over --text, "
            f"or a ViT's over --image or --test-image; {what}"
        )
    given = [k for k in FLAGS if getattr(args, k) is not None and getattr(args, k) is not False]  # 0 is given
    if unread := [FLAGS[k] for k in given if k not in TAKES[family]]:
        takes = ", ".join(FLAGS[k] for k in TAKES[family])
        raise ValueError(
            f"{' and '.join(unread)} {'does' if len(unread) == 1 else 'do'} not apply to {KINDS[family]}'s "
            f"attention ({where}); it takes {takes}"
        )
    if family == "lm" and args.text is None:
        raise ValueError(f"{where} holds a language model: give the text to run through it, --text TEXT")
    if family == "vit" and args.layers is not None and len(args.layers) != 1:
        raise ValueError(
            "--layers: a ViT's figure draws the heads of one layer; give one index, e.g. --layers 0"
        )


def _out_paths(args: argparse.Namespace, family: str) -> tuple[Path, Path]:
    """(folder for the per-head figures, the overview figure), checked before any work (see the module doc)."""
    if figure_suffix(args.out):
        if args.per_head:
            raise ValueError(
                f"--out {args.out}: --per-head writes one figure per map; give a folder as --out"
            )
        overview = Path(fresh_file(args.out, None))
        return overview.parent, overview
    folder = fresh_folder(args.out, ATTENTION_OUT, WRITES[family])
    return folder, folder / WRITES[family][0]


def _check_range(flag: str, chosen: list[int] | None, n: int, what: str) -> None:
    if chosen is not None and (bad := [i for i in chosen if not 0 <= i < n]):
        raise ValueError(
            f"{flag} {','.join(map(str, bad))} out of range: the model has {n} {what} (0 ... {n - 1})"
        )


def _cmd_viz_attention(args: argparse.Namespace) -> int:
    from seqlab.training.checkpoint import load_config, load_model, load_tokenizer, resolve_checkpoint
    from seqlab.viz.attention import write_attention_maps

    where = resolve_checkpoint(args.checkpoint)
    config = load_config(where)
    family = config.get("family")
    _check_options(args, family, where)
    folder, overview = _out_paths(args, family)
    tok = load_tokenizer(where, "attention maps need a model trained on text") if family == "lm" else None
    model = load_model(where).eval()
    if family == "vit":
        _check_range("--layers", args.layers, len(model.layers), "layers")
        return _vit_attention(args, model, config["task"], overview)
    _check_range("--layers", args.layers, len(model.blocks), "layers")
    n_heads = getattr(model.blocks[0].mixer, "n_heads", None)  # None: not attention (refused by the maps)
    _check_range("--heads", args.heads if n_heads else None, n_heads or 0, "heads in each layer")
    paths = write_attention_maps(
        model, tok, args.text, folder, args.layers, args.heads, args.per_head, overview=overview
    )
    extra = f" and {len(paths) - 1} per-head maps" if args.per_head else " (--per-head: one file per map too)"
    print(f"wrote {paths[0]}{extra}")
    return 0


def _vit_attention(args: argparse.Namespace, model, task: dict, out: Path) -> int:
    """A ViT's figure: the chosen layer's heads (the last by default) and the rollout of all layers."""
    import torch

    from seqlab.commands_vision import image_from_args, standardize
    from seqlab.viz.vision import plot_vit_attention

    c = model.config
    image = image_from_args(args, task, c.image_size, c.in_channels)
    x = standardize(image[None], task)  # (1, c, S, S)
    maps = model.attention_maps(x)  # (L, 1, h, T, T)
    grid = model.patch_embed.grid(image.shape[-2], image.shape[-1])
    has_cls = model.cls_token is not None
    query = "cls" if has_cls else (grid[0] // 2) * grid[1] + grid[1] // 2  # no class token: the central patch
    layer = -1 if args.layers is None else args.layers[0]
    path = plot_vit_attention(image, maps, grid, out, has_cls=has_cls, layer=layer, query=query)
    with torch.no_grad():
        logits = model(x)
    k, classes = int(logits.argmax()), task.get("classes")
    label = classes[k] if classes else k
    print(f"predicted: {label}\nwrote {path}")
    return 0


def add_viz_attention(vsub) -> None:
    va = vsub.add_parser(
        "attention", help="attention weights of a GPT checkpoint on a text, or a ViT's on an image"
    )
    va.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    va.add_argument("--text", help="language model: the text to run through it")
    va.add_argument("--image", help="ViT: an image file (PNG, JPEG, ...)")
    va.add_argument("--test-image", type=non_negative_int, help="ViT: the N-th test image of its task")
    va.add_argument(
        "--layers",
        type=indices,
        default=None,
        help="comma-separated layer indices (default: all); ViT: the one layer whose heads are drawn (default: "
        "the last)",
    )
    va.add_argument(
        "--heads",
        type=indices,
        default=None,
        help="language model: comma-separated head indices (default: all)",
    )
    va.add_argument(
        "--per-head",
        action="store_true",
        help="language model: also one PNG per layer and head, beside the overview (needs a folder as --out)",
    )
    va.add_argument(
        "--out",
        default=ATTENTION_OUT,
        help="a folder for the figures (attention.png, layer*-head*.png; a ViT's vit-attention.png), or a file "
        "ending in a figure format (.png, .pdf, ...) for the overview alone; another suffix is refused; never "
        "overwritten: the default folder gets the next free number",
    )
    va.set_defaults(func=_cmd_viz_attention)
