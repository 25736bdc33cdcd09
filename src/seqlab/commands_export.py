"""``seqlab export``: a checkpoint as a Hugging Face model folder that ``transformers`` loads.

    seqlab export --checkpoint runs/gpt-shakespeare --format hf --out exports/gpt-shakespeare

writes ``config.json`` and ``model.safetensors`` (``save_pretrained(safe_serialization=True)``), and, when the
checkpoint has a tokenizer HF can represent, ``tokenizer.json`` + ``tokenizer_config.json``. The conversion is
:func:`seqlab.interop.hf_export.save_hf` (which families, which configs: its docstring). ``--out`` must be a
new or empty directory: seqlab never writes over files already there.
"""

from __future__ import annotations

import argparse

__all__ = ["add_export"]

FORMATS = ("hf",)


def _tokenizer_line(result, had_tokenizer: bool) -> str:
    if result.has_tokenizer:
        return "tokenizer: written (tokenizer.json, loads with AutoTokenizer)"
    if not had_tokenizer:
        return "tokenizer: none written (the checkpoint has none)"
    return f"tokenizer: NOT written: {result.tokenizer_note}"


def _cmd_export(args: argparse.Namespace) -> int:
    from seqlab.commands import announce
    from seqlab.interop.hf_export import check_exportable, check_out_dir, save_hf
    from seqlab.models import build
    from seqlab.outfiles import check_writable
    from seqlab.tasks.tokenizers import tokenizer_from_json
    from seqlab.training.checkpoint import load_config, load_model, load_tokenizer_json, resolve_checkpoint

    check_out_dir(args.out)  # refuse before the minutes of loading a large model
    check_writable(args.out)  # /sys/exp failed after loading, naming a temporary folder the user never gave
    where = resolve_checkpoint(args.checkpoint)
    config = load_config(where)
    # what to_hf would refuse, refused before loading the weights (build reads seqlab 0.1's names too)
    check_exportable(build(config.get("family"), config.get("model") or {}, device="meta"))
    model = load_model(where).eval()
    announce(where)
    text = load_tokenizer_json(where)
    tokenizer = None if text is None else tokenizer_from_json(text)
    result = save_hf(model, args.out, tokenizer=tokenizer)
    print(f"wrote {result.hf_class} to {result.path}: {', '.join(result.files)}")
    print(_tokenizer_line(result, tokenizer is not None))
    print("load it in Python:")
    print(result.load_snippet())
    return 0


def add_export(sub) -> None:
    e = sub.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face model folder (GPT-2, Llama, Mamba, BERT, ViT)",
        description="Export a trained model so that transformers loads it with from_pretrained.",
    )
    e.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory to export")
    e.add_argument(
        "--format",
        choices=FORMATS,
        default="hf",
        help="hf: a Hugging Face transformers folder (config.json, model.safetensors, tokenizer files)",
    )
    e.add_argument(
        "--out", required=True, help="directory to create (it must not exist, or be empty); never overwritten"
    )
    e.set_defaults(func=_cmd_export)
