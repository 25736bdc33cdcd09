"""Time seqlab's attentive GRU encoder–decoder (RNNsearch) against the same model written plainly with torch.nn,
and beam-5 decoding against greedy decoding.

1. Training, forward + backward of one batch, tokens per second (real target tokens):

   * ``torch.nn``: a bidirectional ``nn.GRU`` encoder (packed), and a decoder that loops over the target with
     ``nn.GRU`` on ``[E y_{i-1}; c_i]`` one position at a time, additive attention computed at every step from
     ``nn.Linear`` layers (the keys projected once per batch), the maxout readout at every step;
   * ``seqlab``: ``Seq2Seq(attention="bahdanau")``, which hoists the embeddings' input projection and the
     readout out of the loop.

   Both hold the same weights (copied), and the benchmark checks that their logits agree to 1e-4 before
   timing, so the reference is also an independent implementation of the equations.
2. Decoding a held-out set batched over sentences: ``generate(beam_size=5)`` against greedy.

Contenders alternate inside every repeat (the order rotates); medians over repeats; ratios reported.

    python benchmarks/bench_seq2seq.py             # d_model 256, batch 64, 9 repeats
    python benchmarks/bench_seq2seq.py --quick     # a smoke run that writes no file
    python benchmarks/bench_seq2seq.py --checkpoint runs/compare-translation/runs/bahdanau   # decode real verses

The table is printed and written to ``benchmarks/results/seq2seq-<cpu>-torch<version>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.models.seq2seq import Seq2Seq, Seq2SeqConfig

RESULTS = Path(__file__).resolve().parent / "results"


class PlainRNNsearch(nn.Module):
    """RNNsearch written the way a tutorial writes it: torch.nn layers, one decoder step per position."""

    def __init__(self, v: int, e: int, d: int):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(v, e), nn.Embedding(v, e)
        self.encoder = nn.GRU(e, d // 2, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(d, d)
        self.decoder = nn.GRU(e + d, d, batch_first=True)
        self.w_query, self.w_key, self.v = (
            nn.Linear(d, d, bias=False),
            nn.Linear(d, d),
            nn.Linear(d, 1, bias=False),
        )
        self.readout, self.out = nn.Linear(2 * d + e, 2 * d), nn.Linear(d, v)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        mask = src != 0
        lengths = mask.sum(1)
        packed = pack_padded_sequence(self.src_embed(src), lengths, batch_first=True, enforce_sorted=False)
        out, h_n = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))  # (b, s, d)
        s = torch.tanh(self.bridge(torch.cat([h_n[0], h_n[1]], -1)))[None]  # (1, b, d)
        keys = self.w_key(memory)
        logits = []
        for i in range(tgt_in.size(1)):
            emb = self.tgt_embed(tgt_in[:, i])  # (b, e)
            scores = self.v(torch.tanh(self.w_query(s[0])[:, None] + keys)).squeeze(-1)  # (b, s)
            alpha = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            ctx = (alpha[:, None] @ memory)[:, 0]  # (b, d)
            y, s = self.decoder(torch.cat([emb, ctx], -1)[:, None], s)
            r = self.readout(torch.cat([y[:, 0], ctx, emb], -1)).unflatten(-1, (-1, 2)).amax(-1)
            logits.append(self.out(r))
        return torch.stack(logits, 1)


def copy_weights(ours: Seq2Seq, plain: PlainRNNsearch) -> None:
    sd = ours.state_dict()
    with torch.no_grad():
        plain.src_embed.weight.copy_(sd["src_embed.weight"])
        plain.tgt_embed.weight.copy_(sd["tgt_embed.weight"])
        for name, _ in plain.encoder.named_parameters():
            getattr(plain.encoder, name).copy_(sd[f"encoder.rnn.{name}"])
        for name, _ in plain.decoder.named_parameters():
            getattr(plain.decoder, name).copy_(sd[f"rnn.{name}"])
        for mine, theirs in [
            ("bridge", plain.bridge),
            ("attn.query_proj", plain.w_query),
            ("attn.key_proj", plain.w_key),
            ("attn.v", plain.v),
            ("readout", plain.readout),
            ("out_proj", plain.out),
        ]:
            theirs.weight.copy_(sd[f"{mine}.weight"])
            if theirs.bias is not None:
                theirs.bias.copy_(sd[f"{mine}.bias"])


def make_batch(b: int, s_max: int, t_max: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    s_len = torch.randint(s_max // 3, s_max + 1, (b,), generator=g)
    t_len = torch.randint(t_max // 3, t_max + 1, (b,), generator=g)
    src = torch.randint(3, v, (b, s_max), generator=g) * (torch.arange(s_max) < s_len[:, None])
    y = torch.randint(3, v, (b, t_max), generator=g) * (torch.arange(t_max) < t_len[:, None])
    tgt_in = torch.cat([torch.ones(b, 1, dtype=torch.long), y[:, :-1]], 1)
    return src, tgt_in, y


def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=0)


def timed(fn, repeats: int, names: list[str]) -> dict[str, float]:
    for name in names:  # warm-up
        fn(name)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fn(name)
            times[name].append(time.perf_counter() - start)
    return {n: statistics.median(t) for n, t in times.items()}


def bench_training(args) -> tuple[dict[str, float], int, float]:
    torch.manual_seed(0)
    config = Seq2SeqConfig(vocab_size=args.vocab, d_model=args.d_model, attention="bahdanau", dropout=0.0)
    ours = Seq2Seq(config)
    plain = PlainRNNsearch(args.vocab, args.d_model, args.d_model)
    copy_weights(ours, plain)
    src, tgt_in, y = make_batch(args.batch, args.src_len, args.tgt_len, args.vocab, seed=1)
    with torch.no_grad():
        gap = (ours(src, tgt_in) - plain(src, tgt_in)).abs().max().item()
    if gap > 1e-4:
        raise SystemExit(f"the two implementations disagree: max |logit difference| = {gap:.2e}")
    models = {"torch.nn": plain, "seqlab": ours}

    def step(name: str) -> None:
        m = models[name]
        m.zero_grad(set_to_none=True)
        loss_of(m(src, tgt_in), y).backward()

    return timed(step, args.repeats, list(models)), int((y != 0).sum()), gap


def test_sources(checkpoint: str, n: int):
    """A trained model and the first n test sources of its translation task, as padded batches' rows."""
    from seqlab.run import build_task
    from seqlab.tasks.translation import EOS
    from seqlab.training.checkpoint import load_config, load_model

    model = load_model(checkpoint).eval()
    task = build_task(load_config(checkpoint)["run"])
    ids = task.tokenizer.source.encode_batch([p.source for p in task.pairs("test")[:n]])
    ids = sorted(ids, key=len)  # batched by length, as seqlab translate batches them
    return model, [[*i, EOS] for i in ids], task.max_len + 8


def bench_decoding(args) -> tuple[dict[str, float], int, str]:
    torch.manual_seed(0)
    if args.checkpoint:
        model, rows, max_new = test_sources(args.checkpoint, args.sentences)
        what = f"the first {len(rows)} Bible test verses with the trained model in {args.checkpoint}"
    else:
        config = Seq2SeqConfig(vocab_size=args.vocab, d_model=args.d_model, attention="bahdanau", dropout=0.0)
        model = Seq2Seq(config).eval()
        src, _, _ = make_batch(args.sentences, args.src_len, args.tgt_len, args.vocab, seed=2)
        rows, max_new = [r[r != 0].tolist() for r in src], args.tgt_len
        what = f"{len(rows)} random sources with an untrained model (each runs to max_new_tokens)"
    from seqlab.tasks.translation import _pad

    batches = [_pad(rows[j : j + args.batch]) for j in range(0, len(rows), args.batch)]
    beams = {"greedy": 1, "beam 5": 5}

    def decode(name: str) -> None:
        for src in batches:
            model.generate(src, max_new_tokens=max_new, beam_size=beams[name])

    return timed(decode, max(3, args.repeats // 3), list(beams)), len(rows), what


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=40)
    p.add_argument("--tgt-len", type=int, default=48)
    p.add_argument("--sentences", type=int, default=256, help="decoded sentences")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--checkpoint", help="decode the test verses with this trained translation checkpoint")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.d_model, args.vocab, args.batch, args.repeats, args.sentences = 64, 500, 16, 3, 32
    train, tokens, gap = bench_training(args)
    decode, n, what = bench_decoding(args)
    lines = [
        f"# seqlab RNNsearch (attentive GRU encoder–decoder) on {cpu_name()}",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, {dt.date.today()}, "
        f"python {platform.python_version()}. `python benchmarks/bench_seq2seq.py`",
        f"d_model {args.d_model} (a bidirectional GRU encoder of {args.d_model // 2} per direction), vocabulary {args.vocab}, "
        f"batch {args.batch}, sources up to {args.src_len} and targets up to {args.tgt_len} tokens (random "
        f"lengths). Medians of {args.repeats} alternating repeats. The two give the same logits to {gap:.1e}.",
        "",
        "| training (forward + backward) | ms per batch | target tokens/s | speed vs torch.nn |",
        "|---|---:|---:|---:|",
    ]
    for name, sec in train.items():
        lines.append(f"| {name} | {1e3 * sec:.0f} | {tokens / sec:,.0f} | {train['torch.nn'] / sec:.2f}x |")
    lines += [
        "",
        f"Decoding {what}, batches of {args.batch} sentences:",
        "",
        f"| decoding {n} sentences | s | time vs greedy |",
        "|---|---:|---:|",
    ]
    for name, sec in decode.items():
        lines.append(f"| {name} | {sec:.2f} | {sec / decode['greedy']:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        out = RESULTS / f"seq2seq-{hardware_slug(cpu_name())}-torch{torch.__version__.split('+')[0]}.md"
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
