"""The ``seqlab`` command line: train, generate, list. The only module that parses argv."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

TRAIN_HELP = """\
Train a model on a task. Settings come from an optional YAML run file, then dotted overrides:

  seqlab train configs/lstm-shakespeare.yaml
  seqlab train --model.name=gru-lm-small --task.name=shakespeare --train.steps=3000
  seqlab train --model.name=lstm-lm-small --task.name=text --task.source=my.txt --out runs/mine
  seqlab train configs/lstm-shakespeare.yaml --out runs/demo --resume     # continue an interrupted run

Sections: model (name: a preset from `seqlab list`, then config fields), task (name: shakespeare, text,
adding, copy, then its arguments), train (steps, lr, warmup_steps, weight_decay, grad_clip, grad_accum,
eval_every, save_every, max_minutes, seed, device, ...).
"""


def _cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    from seqlab.run import DEFAULT_RUN, build_run, default_out, load_run_file, merge_run, parse_overrides
    from seqlab.training import Trainer
    from seqlab.training.checkpoint import resolve_checkpoint

    file_run = load_run_file(args.run_file) if args.run_file else {}
    run = merge_run(DEFAULT_RUN, file_run, parse_overrides(extra))
    out = Path(args.out or run.get("out") or default_out(run))
    run["out"] = str(out)
    has_ckpt = (out / "latest").is_file()
    if args.resume and not has_ckpt:
        raise SystemExit(f"error: --resume given but {out} holds no checkpoint to resume from")
    if has_ckpt and not args.resume:
        raise SystemExit(
            f"error: {out} already holds a run; pass --resume to continue it, or choose another "
            f"--out (nothing is overwritten)"
        )
    model, task, train = build_run(run)
    if args.resume:  # the run's own settings win, so that the continuation is exact
        saved = json.loads((resolve_checkpoint(out) / "config.json").read_text(encoding="utf-8"))["run"]
        if saved != run:
            logging.getLogger("seqlab").warning("resuming with the settings saved in %s", out)
            run = saved
            model, task, train = build_run(run)
    from seqlab.models import count_parameters

    print(
        f"model {run['model']['name']} ({count_parameters(model):,} parameters), task {task.name}, "
        f"{train.steps} steps -> {out}",
        flush=True,
    )
    summary = Trainer(model, task, train, out, run).fit(resume=args.resume)
    print(
        json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()}), flush=True
    )
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from seqlab.tasks.tokenizers import tokenizer_from_json
    from seqlab.training.checkpoint import load_model, load_tokenizer_json, resolve_checkpoint

    where = resolve_checkpoint(args.checkpoint)
    tok_json = load_tokenizer_json(where)
    if tok_json is None:
        raise SystemExit(
            f"error: {where} has no tokenizer.json: it was not trained on text, nothing to sample"
        )
    tok = tokenizer_from_json(tok_json)  # char, bpe or wordpiece
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    model = load_model(where, device=device)
    if not hasattr(model, "generate"):
        raise SystemExit(f"error: the model in {where} is not a generative language model")
    try:
        prompt = tok.encode(args.prompt)
    except ValueError as e:
        raise SystemExit(f"error: the prompt cannot be encoded: {e}") from None
    if prompt.numel() == 0:
        raise SystemExit("error: the prompt is empty; give at least one character, e.g. --prompt 'ROMEO:'")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    ids = model.generate(
        prompt.to(device),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=gen,
    )
    print(tok.decode(ids))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from seqlab.models import PRESETS, count_parameters, list_models
    from seqlab.tasks import list_tasks

    print(f"{'model':<26} {'family':<12} {'parameters':>16}   (vocab_size 256 unless the task sets it)")
    for name in list_models(args.pattern):
        print(f"{name:<26} {PRESETS[name][0]:<12} {count_parameters(name):>16,}")
    print("\ntasks: " + ", ".join(list_tasks()))
    return 0


def _cmd_viz_gradients(args: argparse.Namespace) -> int:
    import torch

    from seqlab.viz.gradients import gradient_flow, plot_gradient_flow

    if args.length < 2:
        raise ValueError(f"--length must be at least 2, got {args.length}")
    cells = tuple(args.cells.split(","))
    unknown = sorted(set(cells) - {"rnn", "lstm", "gru"})
    if unknown:
        raise ValueError(f"--cells takes rnn, lstm, gru; got {unknown}")
    if args.threads:
        torch.set_num_threads(args.threads)
    groups = [gradient_flow(cells, args.length, args.d_model, 0, args.seed)]
    if args.train_steps > 0:
        groups.append(
            gradient_flow(cells, args.length, args.d_model, args.train_steps, args.seed, progress=True)
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_gradient_flow(groups, out, title=f"gradient flow on the adding problem, T={args.length}")
    for group in groups:
        for r in group:
            ratio = r.norms[0] / r.norms[-1] if r.norms[-1] else float("nan")
            print(
                f"{r.cell:<5} trained {r.trained_steps:>5} steps: |dL/dh_1| / |dL/dh_T| = {ratio:.2e}, "
                f"val MSE {r.final_mse:.4f}"
            )
    print(f"wrote {out}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import torch

    from seqlab.lab import compare

    if args.threads:
        torch.set_num_threads(args.threads)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    if args.jobs is None:  # the cores this process may use (Linux), else all of them; at most 4
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        args.jobs = max(1, min(4, usable))
    paths = compare(args.out, args.suite, split(args.mixers), split(args.tasks), args.seed, jobs=args.jobs)
    print(Path(paths["table"]).read_text(encoding="utf-8"))
    print(
        f"wrote {paths['results']}, {paths['table']} and {len(paths['plots'])} plots in "
        f"{paths['minutes']:.1f} min"
    )
    return 0


def _cmd_params(args: argparse.Namespace, extra: list[str]) -> int:
    from seqlab.models.flops import report
    from seqlab.run import parse_overrides

    parsed = parse_overrides(extra)
    if set(parsed) - {"model"}:
        raise ValueError("seqlab params takes --model.FIELD=VALUE overrides only")
    r = report(args.name, context=args.context, **parsed.get("model", {}))
    print(f"{r.name}: {r.total:,} parameters")
    for comp, n in r.by_component.items():
        if n:
            print(f"  {comp:<11} {n:>16,}  {100 * n / r.total:5.1f}%")
            if args.shapes:
                for pname, shape in r.shapes[comp]:
                    print(f"      {pname:<48} {tuple(shape)}")
    print(
        f"forward FLOPs per token at context {r.context}: {r.flops_per_token:,} "
        f"= 2 x {r.matmul_params:,} (matmul weights) + {r.attention_flops:,} (4 n_layers t d_attn)"
    )
    return 0


def _cmd_viz_positions(args: argparse.Namespace) -> int:
    from seqlab.viz.positions import plot_positions

    out = plot_positions(args.out, args.positions, args.d_model, args.base, args.grid)
    print(f"wrote {out}")
    return 0


def _cmd_viz_attention(args: argparse.Namespace) -> int:
    from seqlab.tasks.tokenizers import tokenizer_from_json
    from seqlab.training.checkpoint import load_model, load_tokenizer_json, resolve_checkpoint
    from seqlab.viz.attention import write_attention_maps

    where = resolve_checkpoint(args.checkpoint)
    tok_json = load_tokenizer_json(where)
    if tok_json is None:
        raise ValueError(f"{where} has no tokenizer.json: attention maps need a model trained on text")
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    model = load_model(where)
    paths = write_attention_maps(
        model, tokenizer_from_json(tok_json), args.text, args.out, ints(args.layers), ints(args.heads)
    )
    print(f"wrote {len(paths)} attention maps to {args.out}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqlab", description="Sequence models from RNNs to Transformers and SSMs."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser(
        "train",
        help="train a model on a task",
        description=TRAIN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("run_file", nargs="?", help="YAML run file (optional)")
    t.add_argument("--out", help="run directory (default: the run file's 'out', else runs/MODEL-TASK)")
    t.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )

    g = sub.add_parser("generate", help="sample text from a trained language model")
    g.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    g.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    g.add_argument("--max-new-tokens", type=int, default=500)
    g.add_argument("--temperature", type=float, default=0.8, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto")

    c = sub.add_parser("compare", help="the lab: RNN vs Transformer vs SSM, measured on this machine")
    c.add_argument(
        "--suite",
        default="quick",
        help="quick (about 7 min on 2 cores with --jobs 2) or full (about 40 min with --jobs 2)",
    )
    c.add_argument("--out", default="runs/compare", help="report directory; finished runs in it are reused")
    c.add_argument("--mixers", help="comma-separated subset, e.g. lstm,attention,mamba")
    c.add_argument("--tasks", help="comma-separated subset of the suite's tasks")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    c.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="training runs at once, each in its own process with one thread (default: the usable CPU cores, "
        "at most 4; on 2 cores, 2 jobs take about half the wall time of 1); speed is still measured alone",
    )

    viz = sub.add_parser("viz", help="pictures: gradient flow, positional encodings, attention maps")
    vsub = viz.add_subparsers(dest="viz_command", required=True)
    vg = vsub.add_parser(
        "gradients", help="plot |dL/dh_t| against t for RNN, LSTM and GRU (vanishing gradients)"
    )
    vg.add_argument("--out", default="gradient-flow.png", help="PNG file to write")
    vg.add_argument("--length", type=int, default=100, help="sequence length T of the adding problem")
    vg.add_argument("--train-steps", type=int, default=0, help="also plot after this many training steps")
    vg.add_argument("--cells", default="rnn,lstm,gru")
    vg.add_argument("--d-model", type=int, default=64)
    vg.add_argument("--seed", type=int, default=0)
    vg.add_argument("--threads", type=int, default=None)

    va = vsub.add_parser("attention", help="heatmaps of a GPT checkpoint's attention weights on a text")
    va.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    va.add_argument("--text", required=True, help="text to run through the model")
    va.add_argument("--layers", default=None, help="comma-separated layer indices (default: all)")
    va.add_argument("--heads", default=None, help="comma-separated head indices (default: all)")
    va.add_argument("--out", default="attention-maps", help="directory for layer{L}-head{H}.png")

    vp = vsub.add_parser(
        "positions", help="the sinusoidal table and its similarities, RoPE's relative scores, 2-D patch codes"
    )
    vp.add_argument("--out", default="positions.png", help="PNG file to write")
    vp.add_argument("--positions", type=int, default=128, help="positions to draw")
    vp.add_argument("--d-model", type=int, default=64, help="channels (a multiple of 4)")
    vp.add_argument("--base", type=float, default=10000.0, help="the wavelength base (10000 in the papers)")
    vp.add_argument("--grid", type=int, default=14, help="patch grid side for the 2-D codes (ViT-B/16: 14)")

    pa = sub.add_parser(
        "params", help="parameter count by component and FLOPs per token of a preset, e.g. seqlab params gpt2"
    )
    pa.add_argument("name", help="a preset from `seqlab list`; override fields with --model.FIELD=VALUE")
    pa.add_argument(
        "--context", type=int, default=None, help="context length for the FLOPs (default: max_seq_len)"
    )
    pa.add_argument("--shapes", action="store_true", help="list every parameter's shape")

    ls = sub.add_parser("list", help="list model presets and tasks")
    ls.add_argument("pattern", nargs="?", help="shell-style filter, e.g. 'lstm*'")
    return p


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate dotted overrides (``--train.lr=3e-3`` or ``--train.lr 3e-3``) from ordinary arguments."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "." in arg.split("=", 1)[0]:
            overrides.append(arg)
            if "=" not in arg and i + 1 < len(argv):
                overrides.append(argv[i + 1])
                i += 1
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    if args.command not in ("train", "params") and overrides:
        parser.error(f"unrecognized arguments: {' '.join(overrides)}")
    if args.command in ("train", "compare"):  # a training process: keep freed memory for the next step
        from seqlab.training.allocator import keep_freed_memory

        keep_freed_memory()
    try:
        if args.command == "train":
            return _cmd_train(args, overrides)
        if args.command == "generate":
            return _cmd_generate(args)
        if args.command == "compare":
            return _cmd_compare(args)
        if args.command == "params":
            return _cmd_params(args, overrides)
        if args.command == "viz" and args.viz_command == "attention":
            return _cmd_viz_attention(args)
        if args.command == "viz" and args.viz_command == "positions":
            return _cmd_viz_positions(args)
        if args.command == "viz":
            return _cmd_viz_gradients(args)
        return _cmd_list(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
