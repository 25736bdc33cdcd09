"""seqlab's GPT against Hugging Face's GPT2LMHeadModel with the same weights: training and generation speed.

Model: 4 layers, 4 heads, d_model 256, context 256 (GPT-2 shape, dropout 0), vocabulary 256 by default;
seqlab's copy is made by the production converter (``seqlab.interop.hf_gpt2.convert_gpt2``), HF runs with
``attn_implementation="sdpa"``.

* Training: one AdamW step on a (16, 256) batch (forward, cross-entropy, backward, update); tokens/s from
  the median over repeats, the two models alternating which goes first from repeat to repeat.
* Achieved FLOP/s = 3 x forward FLOPs per token (``seqlab.models.flops``: 2 N_matmul + 4 n_layers t d_attn)
  x tokens/s, as a fraction of the fp32 matmul rate measured in the same run: the best median FLOP/s over
  square matmuls and the model's own GEMM shapes (the ceiling its matmuls can reach on this CPU).
* Generation: greedy, batch 1, a 16-token prompt and 200 new tokens through each library's KV cache
  (seqlab ``generate(temperature=0)``, HF ``generate(do_sample=False)``); tokens/s from the median. A third
  contender, the same model decoded by the bare kernels (``kernel_floor_generate``), measures the floor.

    python benchmarks/bench_gpt.py              # writes benchmarks/results/gpt-<hardware>-torch<version>.md
    python benchmarks/bench_gpt.py --quick      # a smoke run that writes no file

On a shared machine the absolute numbers move with the load; the ratios, measured alternately, move less.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from seqlab.lab.report import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_rate(shapes: list[tuple[int, int, int]], repeats: int = 7) -> tuple[float, tuple[int, int, int]]:
    """The best fp32 FLOP/s over (m, k) x (k, n) matmuls of the given shapes (median over repeats each).

    Square matmuls alone underestimate what the CPU reaches (a single 1024^3 product left a model at "105%");
    the best over squares and the model's own GEMM shapes is the honest ceiling for its matmuls.
    """
    best, best_shape = 0.0, shapes[0]
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        a @ b
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
        rate = 2 * m * k * n / statistics.median(times)
        if rate > best:
            best, best_shape = rate, (m, k, n)
    return best, best_shape


@torch.inference_mode()
def kernel_floor_generate(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding of a GPT-2-shaped seqlab GPT by the bare kernels: the floor of eager PyTorch here.

    The prompt goes through the model once; then every token is layer_norm, the packed QKV linear, an in-place
    write into a preallocated cache, SDPA over the filled part, and the rest of the block, called directly on
    the weights: no module calls, no checks, no masks, no state objects. What is left is the kernels' own
    time, mostly 17 matrix-vector products streaming the weights, which no eager implementation of this model
    can go under; it tells how much of a library's generation time is its own overhead.
    """
    c = model.config
    h, kd, d = c.n_heads, c.k, c.d_model
    logits, state = model(prompt, return_state=True)
    nxt = logits[:, -1].argmax(-1)  # (1,)
    pos = prompt.size(1)
    cap = pos + new_tokens
    caches = []
    for s in state:
        kb, vb = s.k.new_zeros(1, h, cap, kd), s.v.new_zeros(1, h, cap, kd)
        kb[:, :, :pos], vb[:, :, :pos] = s.k, s.v
        caches.append((kb, vb))
    out = [nxt]
    for _ in range(new_tokens - 1):
        x = model.tok_embed.weight[nxt] + model.pos_embed.weight[pos]  # (1, d)
        x = x[:, None]  # (1, 1, d)
        for blk, (kb, vb) in zip(model.blocks, caches, strict=True):
            a = blk.attn
            y = F.layer_norm(x, (d,), blk.norm1.weight, blk.norm1.bias, c.norm_eps)
            q, k, v = (
                F.linear(y, a.in_proj_weight, a.in_proj_bias)
                .view(1, 1, 3 * h, kd)
                .transpose(1, 2)
                .split(h, 1)
            )
            kb[:, :, pos : pos + 1], vb[:, :, pos : pos + 1] = k, v
            o = F.scaled_dot_product_attention(q, kb[:, :, : pos + 1], vb[:, :, : pos + 1])  # (1, h, 1, k)
            x = x + F.linear(o.transpose(1, 2).reshape(1, 1, d), a.out_proj.weight, a.out_proj.bias)
            y = F.layer_norm(x, (d,), blk.norm2.weight, blk.norm2.bias, c.norm_eps)
            y = F.gelu(F.linear(y, blk.mlp.fc1.weight, blk.mlp.fc1.bias), approximate="tanh")
            x = x + F.linear(y, blk.mlp.fc2.weight, blk.mlp.fc2.bias)
        x = F.layer_norm(x, (d,), model.norm.weight, model.norm.bias, c.norm_eps)
        nxt = F.linear(x[:, -1], model.head.weight).argmax(-1)
        out.append(nxt)
        pos += 1
    return torch.cat([prompt, torch.stack(out, 1)], dim=1)


def train_step_fn(model, logits_of, batch, lr=1e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step() -> None:
        logits = logits_of(model, batch)  # (b, t, v)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def alternate(fns: dict[str, callable], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, alternating the order from repeat to repeat."""
    names = list(fns)
    for f in fns.values():  # warm-up
        f()
    times = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, 50 new tokens, no file written")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats, new_tokens = (2, 50) if args.quick else (args.repeats, args.new_tokens)

    import transformers

    from seqlab.interop.hf_gpt2 import convert_gpt2
    from seqlab.models.flops import forward_flops_per_token

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=max(args.context, 16 + new_tokens),
        n_embd=256,
        n_layer=4,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="sdpa",
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = transformers.GPT2LMHeadModel(cfg)
    ours = convert_gpt2(hf)
    batch = torch.randint(0, args.vocab, (args.batch, args.context))
    hf.train(), ours.train()

    rows, d = args.batch * args.context, 256
    rate, rate_shape = matmul_rate(
        [(1024, 1024, 1024), (2048, 2048, 2048), (rows, d, 3 * d), (rows, d, 4 * d), (rows, 4 * d, d)]
    )
    train = alternate(
        {
            "seqlab": train_step_fn(ours, lambda m, x: m(x), batch),
            "hf": train_step_fn(hf, lambda m, x: m(x).logits, batch),
        },
        repeats,
    )
    tokens = args.batch * args.context
    flops_tok = 3 * forward_flops_per_token(ours, args.context)[0]

    hf.eval(), ours.eval()
    prompt = torch.randint(0, args.vocab, (1, 16))
    ones = torch.ones_like(prompt)
    gen = alternate(
        {
            "floor": lambda: kernel_floor_generate(ours, prompt, new_tokens),
            "seqlab": lambda: ours.generate(prompt, new_tokens, temperature=0),
            "hf": lambda: hf.generate(
                prompt,
                attention_mask=ones,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            ),
        },
        max(2, repeats // 2),
    )
    floor_same = torch.equal(
        kernel_floor_generate(ours, prompt, new_tokens), ours.generate(prompt, new_tokens, temperature=0)
    )
    same = torch.equal(
        ours.generate(prompt, new_tokens, temperature=0),
        hf.generate(
            prompt,
            attention_mask=ones,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        ),
    )

    lines = [
        f"# GPT (4 x 256, 4 heads, context {args.context}, vocab {args.vocab}) vs HF GPT2LMHeadModel",
        "",
        f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {dt.date.today()}; {repeats} repeats, medians, alternating order."
        + (" Quick run." if args.quick else ""),
        f"fp32 matmul rate measured in this run: {rate / 1e9:.1f} GFLOP/s (best median over square and the "
        f"model's GEMM shapes, reached at (m, k, n) = {rate_shape}).",
        "",
        "| | seqlab | HF | seqlab / HF |",
        "|---|---:|---:|---:|",
    ]
    tr = {k: tokens / v for k, v in train.items()}
    lines.append(
        f"| training tokens/s (batch {args.batch}) | {tr['seqlab']:,.0f} | {tr['hf']:,.0f} | "
        f"{tr['seqlab'] / tr['hf']:.2f} |"
    )
    fr = {k: v * flops_tok / rate for k, v in tr.items()}
    lines.append(f"| achieved FLOP/s / matmul rate | {fr['seqlab']:.2f} | {fr['hf']:.2f} | |")
    gr = {k: new_tokens / v for k, v in gen.items()}
    lines.append(
        f"| greedy generation tokens/s ({new_tokens} new) | {gr['seqlab']:,.0f} | {gr['hf']:,.0f} | "
        f"{gr['seqlab'] / gr['hf']:.2f} |"
    )
    lines.append(
        f"| greedy generation by the bare kernels (no library code; the eager floor) | {gr['floor']:,.0f} | | "
        f"{gr['floor'] / gr['hf']:.2f} |"
    )
    lines += [
        "",
        f"Greedy generations identical: {same} (the bare-kernel loop: {floor_same}). "
        f"Training FLOPs per token: {flops_tok:,}.",
        "",
        "The bare-kernel row calls only layer_norm, linear, SDPA and gelu on the same weights with a preallocated",
        "cache (benchmarks/bench_gpt.py, kernel_floor_generate): its tokens/s bound what any eager PyTorch decoder",
        "of this model reaches on this machine, so seqlab / floor is the share of the kernels' speed it keeps.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        plain = re.sub(r"\((r|tm)\)", "", cpu_name().lower())
        name = re.sub(r"[^a-z0-9]+", "-", plain).strip("-").split("-")[:2]
        out = RESULTS / f"gpt-{'-'.join(name)}-torch{torch.__version__.split('+')[0]}.md"
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
