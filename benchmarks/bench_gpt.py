"""seqlab's GPT against Hugging Face's GPT2LMHeadModel with the same weights: training and generation speed.

Model: 4 layers, 4 heads, d_model 256, context 256 (GPT-2 shape, dropout 0), vocabulary 256 by default;
seqlab's copy is made by the production converter (``seqlab.interop.hf_gpt2.convert_gpt2``), HF runs with
``attn_implementation="sdpa"``.

* Training: one AdamW step (torch's fused AdamW, each library's trainer default) on a (16, 256) batch
  (forward, cross-entropy, backward, update); tokens/s from
  the median over repeats, the two models alternating which goes first from repeat to repeat.
* Achieved FLOP/s = 3 x forward FLOPs per token (``seqlab.models.flops``: 2 N_matmul + 4 n_layers t d_attn)
  x tokens/s, as a fraction of the fp32 matmul rate measured in the same run: the best median FLOP/s over
  square matmuls and the model's own GEMM shapes (the ceiling its matmuls can reach on this CPU), or that best
  shape's products timed alternating with the steps where they ran faster.
* The floor under the training step: its weight GEMMs alone (each linear layer's forward X Wᵀ and backward
  dY W, dYᵀ X, same shapes and transposes, into preallocated outputs, nothing between them), timed alternating
  with the steps, and the achieved fraction of the matmul rate a step would reach if nothing but those GEMMs
  and the attention products (at the matmul rate) cost time: the bound any fp32 implementation built on
  these GEMMs meets. On a CPU where ``seqlab.kernels.gemm`` chooses oneDNN (AMD with AVX-512), seqlab's
  forward products and input gradients run through it; the matmul rate is then the best of MKL and oneDNN.
* Generation: greedy and sampled (temperature 0.8, top-k 50), at batch 1 and batch 8, a 16-token prompt and
  200 new tokens through each library's KV cache (seqlab ``generate``, which decodes through
  ``StaticCacheDecoder`` and, for a float32 model on the CPU, the fused kernel ``seqlab.kernels.decode``, whose
  greedy and sampled loops run the whole generation in one call; HF
  ``generate``); tokens/s from the median. Alternating with them: the ceiling set by the model's weight
  products alone (``ceiling_fn``); at batch 8 also those products plus a read of the KV caches at each step's
  position (``kv_ceiling_fn``: at batch 8 the caches hold about as many bytes as the weights); and at batch 1
  greedy seqlab stepping module by module (``fast_path=False``: the reference path).

    python benchmarks/bench_gpt.py              # writes benchmarks/results/gpt-<hardware>-torch<version>.md
    python benchmarks/bench_gpt.py --quick      # a smoke run that writes no file
    python benchmarks/bench_gpt.py --keep-heap  # both keep freed memory, as seqlab train runs (glibc's
                                                # defaults re-map HF's temporaries every step)

On a shared machine the absolute numbers move with the load; the ratios, measured alternately, move less.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import time

import torch
import torch.nn.functional as F

from common import add_keep_heap, alternate, keep_heap, report
from seqlab.lab.report import cpu_name
from seqlab.training.config import cpu_has_bf16_matmul

SAMPLING = {"temperature": 0.8, "top_k": 50}  # both libraries' sampled decoding


def _onednn_mm(a: torch.Tensor, b: torch.Tensor):
    """a @ b through oneDNN (seqlab.kernels.gemm's call, b's transpose as its weight)."""
    from seqlab.kernels.gemm import _onednn

    return _onednn(a, b.t(), None)


def matmul_rate(
    shapes: list[tuple[int, int, int]], repeats: int = 7, dtype: torch.dtype = torch.float32
) -> tuple[float, tuple[int, int, int], str]:
    """The best FLOP/s (fp32 unless ``dtype``) over (m, k) x (k, n) matmuls of the given shapes (median over
    repeats each), the shape and the library that gave it: in float32 both torch's ``@`` (MKL) and oneDNN
    (seqlab's products on CPUs where it is the faster, ``seqlab.kernels.gemm``) are timed; other dtypes ``@``.

    Square matmuls alone underestimate what the CPU reaches (a single 1024^3 product left a model at "105%");
    the best over squares and the model's own GEMM shapes is the honest ceiling for its matmuls.
    """
    libraries = {"MKL": torch.matmul}
    if dtype == torch.float32 and torch.backends.mkldnn.is_available():
        libraries["oneDNN"] = _onednn_mm
    best, best_shape, best_library = 0.0, shapes[0], "MKL"
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for name, mm in libraries.items():
            mm(a, b)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                mm(a, b)
                times.append(time.perf_counter() - t)
            rate = 2 * m * k * n / statistics.median(times)
            if rate > best:
                best, best_shape, best_library = rate, (m, k, n), name
    return best, best_shape, best_library


def products_fn(shape: tuple[int, int, int], rate: float, library: str, seconds: float = 0.1):
    """A call that runs the (m, k) x (k, n) product about ``seconds`` long at ``rate`` through ``library``
    (as ``matmul_rate`` names it), and its FLOPs: the matmul rate timed alternating with the steps, under the
    same load as they are."""
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    mm = _onednn_mm if library == "oneDNN" else torch.matmul
    reps = max(1, round(seconds * rate / (2 * m * k * n)))

    def run() -> None:
        for _ in range(reps):
            mm(a, b)

    return run, reps * 2 * m * k * n


def weight_matrices(model) -> list[torch.Tensor]:
    """The model's linear weights in the order a step uses them: per layer the packed QKV, the output projection
    and the MLP's two, then the head (detached)."""
    mats = []
    for blk in model.blocks:
        mats += [blk.mixer.in_proj_weight, blk.mixer.out_proj.weight, blk.mlp.fc1.weight, blk.mlp.fc2.weight]
    return [w.detach() for w in mats] + [model.head.weight.detach()]


def ceiling_fn(model, batch: int, steps: int):
    """A call that runs, ``steps`` times, the model's weight products alone, the weights read in decoding order.

    Every decoding step streams each weight matrix once (per layer the packed QKV, the output projection
    and the MLP's two layers, then the head): at batch 1 as matrix-vector products (``torch.mv``), at batch b
    as (b, d_in) x (d_in, d_out) products. This runs exactly those products on the model's own weights, with
    nothing between them; timed like a generation of ``steps`` tokens (alternating with the decoders), its
    rate is a ceiling on the tokens/s of any fp32 decoder of this model on this machine that reads its weights
    once per step through torch's kernels.
    """
    mats = weight_matrices(model)
    if batch == 1:
        inputs = {w.size(1): torch.randn(w.size(1)) for w in mats}
        products = [(torch.mv, w, inputs[w.size(1)]) for w in mats]  # W x, x (d_in,)
    else:
        inputs = {w.size(1): torch.randn(batch, w.size(1)) for w in mats}
        products = [(torch.mm, inputs[w.size(1)], w.t()) for w in mats]  # X W^T, X (b, d_in)

    def run() -> None:
        for _ in range(steps):
            for f, a, b in products:
                f(a, b)

    return run


def kv_ceiling_fn(model, batch: int, prompt: int, steps: int):
    """``ceiling_fn`` plus what the weights leave out: at each step, a read of the key and value caches of every
    layer up to that step's position (``prompt`` + steps so far), as a sum over buffers of the caches' size and
    layout (b, positions, 2 d) per layer. Any decoder reads those bytes once per step; at batch 8 and a few
    hundred positions they are as many as the weights'."""
    products = ceiling_fn(model, batch, 1)
    d = model.blocks[0].mixer.in_proj_weight.size(1)
    caches = [torch.randn(batch, prompt + steps, 2 * d) for _ in model.blocks]

    def run() -> None:
        for s in range(steps):
            products()
            for c in caches:
                c[:, : prompt + s + 1].sum()

    return run


def gemm_floor_fn(model, rows: int):
    """A call that runs one training step's weight GEMMs alone: per linear layer (packed QKV, output projection,
    the MLP's two, the head) the forward X Wᵀ and the backward dY W and dYᵀ X, with the shapes and transposed
    operands autograd gives them, through the library seqlab's step uses for each (``seqlab.kernels.gemm``:
    oneDNN for the forward and dY W where it is the faster, MKL otherwise), nothing between them. Its time is
    what the step would take if attention, the elementwise ops and the optimizer cost nothing; also returns
    its FLOPs."""
    from seqlab.kernels.gemm import linear

    mats = weight_matrices(model)
    calls = []
    for w in mats:
        d_out, d_in = w.shape
        x, dy = torch.randn(rows, d_in), torch.randn(rows, d_out)
        calls += [(linear, x, w), (linear, dy, w.t())]  # X Wᵀ and dY W as seqlab's Linear runs them
        calls.append((torch.mm, dy.t(), x))  # dYᵀ X: torch's (MKL), as seqlab's backward runs it

    def run() -> None:
        with torch.no_grad():
            for f, a, b in calls:
                f(a, b)

    return run, sum(6 * rows * w.numel() for w in mats)


def gemm_said() -> str:
    """Which library runs each library's float32 products in this run."""
    from seqlab.kernels.gemm import MIN_WORK, onednn_reason

    if (why := onednn_reason()) is not None:
        return f"Both libraries' products: MKL (torch's `addmm`/`mm`; seqlab.kernels.gemm: {why})."
    return (
        "seqlab's linear layers ran their forward products and input gradients through oneDNN and their weight "
        f"gradients through MKL (`seqlab.kernels.gemm`: oneDNN on this CPU for products of >= {MIN_WORK:,} "
        "multiply-adds); HF's Conv1D layers run MKL's `addmm`."
    )


def generate_ref(model, prompt, new_tokens):
    """Greedy generation through the modules' ``step`` (the reference path the static decoder stands in for)."""
    model.fast_path = False
    try:
        return model.generate(prompt, new_tokens, temperature=0)
    finally:
        model.fast_path = True


def kernel_cost() -> str:
    """What the decode kernel cost this process: its build, or its load from the cache (excluded from timings,
    which start after a warm-up call)."""
    from seqlab.kernels.decode import EXTENSION

    info = EXTENSION.build_info()
    if info is None or "error" in info:
        return "not used: " + (info or {}).get("error", "never loaded")
    how = "loaded from the build cache" if info["cached"] else "compiled on first use"
    return f"{how} in {info['seconds']:.1f} s, before the timed calls"


def hf_generate(hf, prompt, new_tokens, sampled):
    return hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=sampled,
        top_k=SAMPLING["top_k"] if sampled else None,
        temperature=SAMPLING["temperature"] if sampled else None,
        pad_token_id=0,
    )


def generation_rows(ours, hf, args, batch, sampled, new_tokens, repeats):
    """Table rows for one (batch, greedy or sampled) setting: seqlab and HF alternating, the module path (batch 1
    greedy only) and the weight-product ceiling; and, for greedy, whether the outputs agree."""
    prompt = torch.randint(0, args.vocab, (batch, 16))
    kw = SAMPLING if sampled else {"temperature": 0}
    fns = {
        "seqlab": lambda: ours.generate(prompt, new_tokens, **kw),
        "hf": lambda: hf_generate(hf, prompt, new_tokens, sampled),
    }
    reference = batch == 1 and not sampled
    if reference:
        fns["modules"] = lambda: generate_ref(ours, prompt, new_tokens)
    fns["ceiling"] = ceiling_fn(ours, batch, new_tokens)
    if batch > 1:
        fns["kv ceiling"] = kv_ceiling_fn(ours, batch, prompt.size(1), new_tokens)
    medians, spread = medians_and_spread(fns, repeats)
    rate = {k: batch * new_tokens / v for k, v in medians.items()}
    ceiling = rate["ceiling"]
    what = f"{'sampled' if sampled else 'greedy'} generation tokens/s, batch {batch} ({new_tokens} new)"
    rows = [
        f"| {what} | {cell(rate['seqlab'], spread['seqlab'])} | {cell(rate['hf'], spread['hf'])} | "
        f"{rate['seqlab'] / rate['hf']:.2f} | "
        f"{rate['seqlab'] / ceiling:.0%} |"
    ]
    if reference:
        rows.append(
            f"| greedy, batch 1, seqlab stepping module by module (`fast_path=False`) | "
            f"{cell(rate['modules'], spread['modules'])} | | "
            f"{rate['modules'] / rate['hf']:.2f} | {rate['modules'] / ceiling:.0%} |"
        )
    rows.append(
        f"| ceiling at batch {batch}: the weight products alone, per step | {cell(ceiling, spread['ceiling'])} | | "
        f"{ceiling / rate['hf']:.2f} | 100% |"
    )
    if batch > 1:
        kv = rate["kv ceiling"]
        rows.append(
            f"| ceiling at batch {batch}: the weight products and a read of the KV caches, per step | "
            f"{cell(kv, spread['kv ceiling'])} | | {kv / rate['hf']:.2f} | seqlab at {rate['seqlab'] / kv:.0%} of it |"
        )
    ok = None
    if not sampled:
        fast = ours.generate(prompt, new_tokens, temperature=0)
        ok = (
            torch.equal(fast, hf_generate(hf, prompt, new_tokens, False)),
            torch.equal(fast, generate_ref(ours, prompt, new_tokens)) if reference else None,
        )
    return rows, ok


def train_step_fn(model, logits_of, batch, lr=1e-3, bf16=False):
    """One AdamW step, torch's fused AdamW for both libraries (what seqlab's trainer and transformers' Trainer,
    ``optim="adamw_torch_fused"`` by default with torch >= 2.8, each run); ``bf16``: forward under CPU bf16
    autocast (fp32 weights and optimizer, as train.precision: bf16 runs it), the loss in fp32."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = logits_of(model, batch)  # (b, t, v)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def medians_and_spread(fns: dict[str, callable], repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per call of each function, timed alternately (common.alternate), and each one's spread:
    the interquartile range over the median (a rate's relative spread is the same)."""
    times = alternate(fns, repeats)
    spread = {}
    for n, v in times.items():
        q1, _, q3 = statistics.quantiles(v, n=4) if len(v) > 1 else (v[0], v[0], v[0])
        spread[n] = (q3 - q1) / statistics.median(v)
    return {n: statistics.median(v) for n, v in times.items()}, spread


def cell(rate: float, spread: float) -> str:
    """A rate with its relative interquartile range: '9,796 ±3%'."""
    return f"{rate:,.0f} ±{spread:.0%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, 50 new tokens, no file written")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--gen-repeats", type=int, default=11, help="rounds of the three generation contenders")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--bf16",
        action="store_true",
        help="add the bf16 autocast rows on a CPU without bf16 matmul units too",
    )
    add_keep_heap(p, "gpt")
    args = p.parse_args()
    malloc = keep_heap(p, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats, new_tokens = (2, 50) if args.quick else (args.repeats, args.new_tokens)
    gen_repeats = 2 if args.quick else args.gen_repeats

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
    load_before = os.getloadavg()[0]

    rows, d = args.batch * args.context, 256
    rate, rate_shape, rate_library = matmul_rate(
        [(1024, 1024, 1024), (2048, 2048, 2048), (rows, d, 3 * d), (rows, d, 4 * d), (rows, 4 * d, d)]
    )
    steps = {
        "seqlab": train_step_fn(ours, lambda m, x: m(x), batch),
        "hf": train_step_fn(hf, lambda m, x: m(x).logits, batch),
    }
    bf16 = cpu_has_bf16_matmul() or args.bf16
    if bf16:  # the same models under bf16 autocast, alternating with the fp32 steps
        steps["seqlab bf16"] = train_step_fn(ours, lambda m, x: m(x), batch, bf16=True)
        steps["hf bf16"] = train_step_fn(hf, lambda m, x: m(x).logits, batch, bf16=True)
        rate16, rate16_shape, _ = matmul_rate(
            [(rows, d, 3 * d), (rows, d, 4 * d), (rows, 4 * d, d)], dtype=torch.bfloat16
        )
    steps["gemms"], gemm_flops = gemm_floor_fn(ours, rows)
    steps["matmul"], matmul_flops = products_fn(rate_shape, rate, rate_library)
    train, train_spread = medians_and_spread(steps, repeats)
    scan_rate, alternated_rate = rate, matmul_flops / train["matmul"]
    rate = max(scan_rate, alternated_rate)  # the best measured in the run: the fractions below are against it
    # (the scan's best can catch a burst the sustained steps never see: a second row is against the alternated)
    tokens = args.batch * args.context
    fwd_flops, fwd_attn_flops = forward_flops_per_token(ours, args.context)
    flops_tok, attn_flops = 3 * fwd_flops, 3 * fwd_attn_flops * tokens

    hf.eval(), ours.eval()
    gen_rows, same, modules_same = [], None, None
    for b in (1, 8):
        for sampled in (False, True):
            rows_out, ok = generation_rows(ours, hf, args, b, sampled, new_tokens, gen_repeats)
            gen_rows += rows_out
            if b == 1 and not sampled:
                same, modules_same = ok
    lines = [
        f"# GPT (4 x 256, 4 heads, context {args.context}, vocab {args.vocab}) vs HF GPT2LMHeadModel",
        "",
        f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {dt.date.today()}; {repeats} repeats (generation: {gen_repeats}), medians "
        "± the interquartile range over the median, alternating order; load average before / after: "
        f"{load_before:.2f} / {os.getloadavg()[0]:.2f}."
        + (" Quick run." if args.quick else "")
        + f" {malloc}",
        f"fp32 matmul rate measured in this run: {rate / 1e9:.1f} GFLOP/s, the better of a scan before the steps "
        f"(best median over square and the model's GEMM shapes, through MKL and oneDNN: {scan_rate / 1e9:.1f} at "
        f"(m, k, n) = {rate_shape}, {rate_library}) "
        f"and that shape's products timed alternating with the steps ({alternated_rate / 1e9:.1f}, ±"
        f"{train_spread['matmul']:.0%}). {gemm_said()}",
        "",
        "| | seqlab | HF | seqlab / HF | of ceiling |",
        "|---|---:|---:|---:|---:|",
    ]
    tr = {k: tokens / v for k, v in train.items()}
    lines.append(
        f"| training tokens/s (batch {args.batch}) | {cell(tr['seqlab'], train_spread['seqlab'])} | "
        f"{cell(tr['hf'], train_spread['hf'])} | "
        f"{tr['seqlab'] / tr['hf']:.2f} | |"
    )
    fr = {k: v * flops_tok / rate for k, v in tr.items()}
    lines.append(f"| achieved FLOP/s / matmul rate | {fr['seqlab']:.2f} | {fr['hf']:.2f} | | |")
    fa = {k: v * flops_tok / alternated_rate for k, v in tr.items()}
    lines.append(
        f"| achieved FLOP/s / the products' rate timed alternating with the steps | {fa['seqlab']:.2f} | "
        f"{fa['hf']:.2f} | | |"
    )
    g = train["gemms"]
    lines.append(
        f"| the step's weight GEMMs alone: ms, and their FLOP/s / matmul rate | {g * 1e3:.0f} "
        f"({gemm_flops / g / rate:.2f}) | | {g / train['seqlab']:.2f} of seqlab's step | |"
    )
    bound = flops_tok * tokens / (g + attn_flops / rate) / rate
    lines.append(
        f"| achieved FLOP/s / matmul rate if only those GEMMs and attention at the rate cost time | {bound:.2f} | | | |"
    )
    if bf16:
        a, b = "seqlab bf16", "hf bf16"
        lines.append(
            f"| training tokens/s, bf16 autocast | {cell(tr[a], train_spread[a])} | {cell(tr[b], train_spread[b])} | "
            f"{tr[a] / tr[b]:.2f} | |"
        )
        lines.append(
            f"| bf16 autocast / fp32, same library | {tr[a] / tr['seqlab']:.2f} | {tr[b] / tr['hf']:.2f} | | |"
        )
        lines.append(
            f"| achieved FLOP/s / bf16 matmul rate | {tr[a] * flops_tok / rate16:.2f} | {tr[b] * flops_tok / rate16:.2f} | | |"
        )
    lines += gen_rows
    lines += [
        "",
        f"Greedy generations identical: {same} (seqlab's two paths: {modules_same}). "
        f"Training FLOPs per token: {flops_tok:,}.",
        "",
        "seqlab's `generate` decodes through `seqlab.models.gpt_decode.StaticCacheDecoder` (preallocated KV",
        "buffers), which steps a float32 model on the CPU through the fused C++ kernel `seqlab.kernels.decode`",
        f"({kernel_cost()}), greedy and sampled generation each as one call (sampling as `sample_next` with",
        "`torch.multinomial`'s draws: a seed gives the tokens of stepping); `fast_path=False` steps through the",
        "modules (LM.step).",
        "The ceiling rows time the matrix-vector products of each step (QKV, output and the MLP's two per layer,",
        "then the head) with nothing between them (at batch 8, the same products with 8 rows), alternating with the",
        "decoders like a generation of as many tokens: each product streams its",
        "weights once per step, as any fp32 decoder of this model must. The last column of a seqlab row is its",
        "fraction of that ceiling; a fused step (one C++ call, one parallel region) can pass 100%, because the",
        "ceiling pays torch's per-call dispatch and thread start-up 17 times per step. At batch 8 a second ceiling",
        "adds, at each step, a read of every layer's key and value caches up to that step's position (a sum over",
        "buffers of their size): the bytes any decoder streams besides the weights.",
    ]
    if bf16:
        lines += [
            "",
            'bf16 rows: both models under `torch.autocast("cpu", torch.bfloat16)` (fp32 weights, AdamW and loss; what',
            "`train.precision: bf16` runs), alternating with the fp32 steps above. bf16 matmul rate in this run:",
            f"{rate16 / 1e9:.0f} GFLOP/s at {rate16_shape} ({rate16 / rate:.1f}x the fp32 rate; this CPU's bf16 matmul "
            f"units: {'yes' if cpu_has_bf16_matmul() else 'none, emulated'}). Under autocast seqlab's GELU runs its kernel on",
            "bf16 tensors and attention its kernel on the bf16 projection (float32 inside); HF runs torch's bf16 ops.",
        ]
    text = "\n".join(lines) + "\n"
    report("gpt-keep-heap" if args.keep_heap else "gpt", text, args.quick)


if __name__ == "__main__":
    main()
