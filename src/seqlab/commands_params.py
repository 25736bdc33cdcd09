"""``seqlab params``: a preset's parameters by component and its forward FLOPs per token
(:mod:`seqlab.models.flops`), registered by :mod:`seqlab.cli`."""

from __future__ import annotations

import argparse

from seqlab.run import positive_int

__all__ = ["add_params"]


def _cmd_params(args: argparse.Namespace) -> int:
    from seqlab.models import PRESETS
    from seqlab.models.flops import report
    from seqlab.run import parse_overrides

    parsed = parse_overrides(args.overrides)
    if set(parsed) - {"model"}:
        raise ValueError("seqlab params takes --model.FIELD=VALUE overrides only")
    if "name" in parsed.get("model", {}):
        raise ValueError(
            f"the preset is the command's argument (seqlab params {args.name}); give another preset there, "
            "not --model.name"
        )
    family = PRESETS[args.name][0] if args.name in PRESETS else None
    if family in ("captioner", "video") and args.context is not None:
        raise ValueError(f"--context: a {family!r} model's FLOPs are not given per token (see without it)")
    r = report(args.name, context=args.context, **parsed.get("model", {}))
    print(f"{r.name}: {r.total:,} parameters")
    for comp, n in r.by_component.items():
        if n:
            print(f"  {comp:<11} {n:>16,}  {100 * n / r.total:5.1f}%")
            if args.shapes:
                for pname, shape in r.shapes[comp]:
                    print(f"      {pname:<48} {tuple(shape)}")
    if family in ("captioner", "video"):  # an image encoder runs once per image or frame, a decoder per word
        print(
            f"forward FLOPs per token: not given for the {family!r} family, whose convolutional or patch "
            f"encoder costs per image or frame, not per token ({r.matmul_params:,} matmul weights in all)"
        )
        return 0
    if not r.attention_flops:  # no multi-head attention scores a context: the same at any length
        source = "the attention over the source, about 4 x d_model per source token, not counted"
        print(
            f"forward FLOPs per token: {r.flops_per_token:,} = 2 x {r.matmul_params:,} (matmul weights; "
            f"{source if family == 'seq2seq' else 'the same at any context length'})"
        )
        return 0
    print(
        f"forward FLOPs per token at context {r.context}: {r.flops_per_token:,} "
        f"= 2 x {r.matmul_params:,} (matmul weights) + {r.attention_flops:,} (4 n_layers t d_attn)"
    )
    return 0


def add_params(sub) -> None:
    pa = sub.add_parser(
        "params", help="parameter count by component and FLOPs per token of a preset, e.g. seqlab params gpt2"
    )
    pa.add_argument("name", help="a preset from `seqlab list`; override fields with --model.FIELD=VALUE")
    pa.add_argument(
        "--context", type=positive_int, help="context length for the FLOPs (default: max_seq_len)"
    )
    pa.add_argument("--shapes", action="store_true", help="list every parameter's shape")
    pa.set_defaults(func=_cmd_params, takes_overrides=True)
