"""``seqlab generate``: sample text from a trained language model.

Every option is checked before the model loads: ``--max-new-tokens`` is at most :data:`MAX_NEW_TOKENS` and
``--temperature`` finite; a checkpoint of another family is named with the command that reads it.
"""

from __future__ import annotations

import argparse
import sys
import time

from seqlab.cli_values import int_in
from seqlab.run import non_negative_float, positive_int, probability, seed

__all__ = ["MAX_NEW_TOKENS", "add_generate"]

MAX_NEW_TOKENS = 10_000
"""generate's longest sample: the static cache holds prompt + sample (1e11 tokens ran silently, then out of
memory); longer texts come from ``model.generate`` in Python."""
GENERATE_HINTS = {
    "seq2seq": "; translate with `seqlab translate`",
    "transformer": "; translate with `seqlab translate`",
    "captioner": "; describe an image with `seqlab caption`",
    "video": "; name a clip's classes with `seqlab classify`",
    "vit": "; name an image's class with `seqlab classify`",
}


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from seqlab.commands import announce
    from seqlab.training.checkpoint import load_model, load_tokenizer, resolve_checkpoint

    where = resolve_checkpoint(args.checkpoint)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device; use --device cpu or auto")
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    model = load_model(where, device=device)
    announce(where)
    if (
        getattr(model, "family", "") != "lm"
    ):  # before its tokenizer: a captioner has words, not a text's tokens
        hint = GENERATE_HINTS.get(model.family, "")
        raise ValueError(f"the model in {where} is a {model.family!r} model, not a language model{hint}")
    tok = load_tokenizer(where, "it was not trained on text, nothing to sample", model)
    try:
        prompt = tok.encode(args.prompt)
    except ValueError as e:
        newline = args.prompt == "\n"
        given = " (the default prompt, a newline: this text has none; give --prompt)" if newline else ""
        raise ValueError(f"the prompt cannot be encoded{given}: {e}") from None
    if prompt.numel() == 0:
        raise ValueError("the prompt is empty; give at least one character, e.g. --prompt 'ROMEO:'")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    stream = _Stream(tok, prompt)
    try:
        ids = model.generate(
            prompt.to(device), args.max_new_tokens, **sampling, generator=gen, on_tokens=stream
        )
    except KeyboardInterrupt:
        print()  # the text so far stays; the stop is said on a line of its own
        raise
    stream.finish(tok.decode(ids))
    return 0


class _Stream:
    """Prints a sample as it grows: the tokens so far decoded whole and the text not yet shown written at once
    (a character whose bytes span tokens waits for its last byte: a trailing U+FFFD is held back), at most every
    PERIOD seconds (decoding 10,000 characters takes ~5 ms: once a token would cost more than the sampling)."""

    PERIOD = 0.1

    def __init__(self, tok, prompt):
        self.tok, self.ids, self.shown, self.last = tok, [prompt], "", time.monotonic()
        self._show(tok.decode(prompt).rstrip("\ufffd"))

    def __call__(self, new) -> None:  # (1, k): one sample's newest tokens
        import torch

        self.ids.append(new[0].cpu())
        if time.monotonic() - self.last >= self.PERIOD:
            self.last = time.monotonic()
            self._show(self.tok.decode(torch.cat(self.ids)).rstrip("\ufffd"))

    def _show(self, text: str) -> None:
        if len(text) > len(self.shown) and text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown) :])
            sys.stdout.flush()
            self.shown = text

    def finish(self, text: str) -> None:
        """The whole sample decoded: what is left of it, and the line's end."""
        if not text.startswith(self.shown):  # a decoder that rewrote earlier text: the whole sample again
            sys.stdout.write("\n")
            self.shown = ""
        self._show(text)
        print()


def add_generate(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained language model")
    g.add_argument("--checkpoint", required=True, help="run directory or checkpoint directory")
    g.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    g.add_argument(
        "--max-new-tokens",
        type=int_in(0, MAX_NEW_TOKENS),
        default=500,
        help=f"tokens to sample (default 500, at most {MAX_NEW_TOKENS:,})",
    )
    g.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy (finite)")
    g.add_argument(
        "--top-k", type=positive_int, default=None, help="sample only among the k most likely tokens"
    )
    g.add_argument(
        "--top-p",
        type=probability,
        default=None,
        help="nucleus sampling: only among the most likely tokens whose probabilities sum to p",
    )
    g.add_argument("--seed", type=seed, default=0, help="seed of the sampler (the same seed, the same text)")
    g.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available"
    )
    g.set_defaults(func=_cmd_generate)
