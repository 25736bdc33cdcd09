"""float32 CPU products: torch's MKL against oneDNN, alone and inside training steps, one process, alternating.

``seqlab.kernels.gemm.linear`` sends a linear layer's forward product and its input gradient to oneDNN on
CPUs where oneDNN is the faster library (AMD with AVX-512 unless ``SEQLAB_GEMM`` says otherwise), and keeps the
weight gradient with MKL. This benchmark measures that choice where it is made:

* the products of a GPT training step at batch 16 x context 256 (4,096 rows; d 256, MLP 1,024): forward
  x Wᵀ + b, input gradient dy W and weight gradient dyᵀ x, each through ``F.linear``/``@`` (MKL) and through
  ``torch.ops.mkldnn._linear_pointwise`` (oneDNN), and the same at 512 rows;
* whole training steps (forward, backward, AdamW) of seqlab models with ``SEQLAB_GEMM=torch`` and
  ``SEQLAB_GEMM=onednn`` (read at every call, so the two alternate in one process): the GPT of
  ``bench_gpt.py`` (beside Hugging Face's GPT2LMHeadModel, whose Conv1D products are MKL's ``addmm``),
  the ViT of ``bench_vit.py`` (Fashion-MNIST shape, batch 128) and the Mamba LM of ``bench_mamba.py``
  (batch 8 x 256).

    python benchmarks/bench_gemm.py          # writes benchmarks/results/gemm-<cpu>-torch<version>.md
    python benchmarks/bench_gemm.py --quick  # a smoke run that writes no file
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import time

import torch
import torch.nn.functional as F

from common import alternate, report
from seqlab.kernels import gemm
from seqlab.kernels.gemm import _onednn  # x (m, k) times weight (n, k)ᵀ in one oneDNN call
from seqlab.lab.report import cpu_name

SHAPES = [(256, 768), (256, 1024), (1024, 256), (256, 256)]  # (in, out): QKV, fc1, fc2, attention output


def product_rows(rows: int, repeats: int) -> list[str]:
    """One table row per (shape, product): MKL ms, oneDNN ms, MKL / oneDNN."""
    out = []
    for k, n in SHAPES:
        x, w, dy = torch.randn(rows, k), torch.randn(n, k), torch.randn(rows, n)
        pairs = {
            "forward x Wᵀ": (lambda x=x, w=w: F.linear(x, w), lambda x=x, w=w: _onednn(x, w, None)),
            "input gradient dy W": (lambda dy=dy, w=w: dy @ w, lambda dy=dy, w=w: _onednn(dy, w.t(), None)),
            "weight gradient dyᵀ x": (
                lambda dy=dy, x=x: dy.t() @ x,
                lambda dy=dy, x=x: _onednn(dy.t(), x.t(), None),
            ),
        }
        for what, (mkl, dnn) in pairs.items():
            t = alternate({"mkl": mkl, "onednn": dnn}, repeats)
            a, b = statistics.median(t["mkl"]) * 1e3, statistics.median(t["onednn"]) * 1e3
            flops = 2 * rows * k * n / 1e6
            out.append(
                f"| {rows} x {k} -> {n} | {what} | {a:.3f} ({flops / a:.0f}) | {b:.3f} ({flops / b:.0f}) | "
                f"{a / b:.2f} |"
            )
    return out


def first_call_cost(repeats: int) -> str:
    """oneDNN makes (JIT-compiles) a primitive for each new shape: a first call against the next, over fresh
    row counts near 4,096 at 256 -> 768, and MKL's first and next calls on the same shapes."""
    w, firsts = torch.randn(768, 256), {"oneDNN": [], "MKL": []}
    nexts = {k: [] for k in firsts}
    for i in range(max(repeats, 3)):
        x = torch.randn(4096 - 7 * (i + 1), 256)  # a row count no earlier call used
        for name, f in (("oneDNN", lambda x=x: _onednn(x, w, None)), ("MKL", lambda x=x: F.linear(x, w))):
            for times in (firsts[name], nexts[name]):
                t = time.perf_counter()
                f()
                times.append(time.perf_counter() - t)
    med = {k: (statistics.median(firsts[k]) * 1e3, statistics.median(nexts[k]) * 1e3) for k in firsts}
    return (
        "A new shape's first oneDNN call makes (compiles) its primitive, which oneDNN then caches: "
        f"{med['oneDNN'][0]:.2f} ms against {med['oneDNN'][1]:.2f} ms for the next call at 4,096 x 256 -> 768 "
        f"(MKL: {med['MKL'][0]:.2f} and {med['MKL'][1]:.2f} ms), medians over {max(repeats, 3)} fresh row counts."
    )


def with_gemm(value: str, step):
    def run() -> None:
        os.environ["SEQLAB_GEMM"] = value
        try:
            step()
        finally:
            os.environ.pop("SEQLAB_GEMM", None)

    return run


def adamw_step(model, loss_of):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        loss_of(model).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def models() -> dict[str, tuple[dict, int]]:
    """name -> ({contender: step}, tokens or images per step)."""
    import transformers

    import bench_mamba
    import bench_vit
    from seqlab.interop.hf_gpt2 import convert_gpt2

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=256, n_positions=256, n_embd=256, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, attn_implementation="sdpa", bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(cfg).train()
    gpt, ids = convert_gpt2(hf).train(), torch.randint(0, 256, (16, 256))

    def lm_loss(logits):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    _, vit, images, labels = bench_vit.contenders("fashion", 128)
    mamba, _ = bench_mamba.build()
    mids = torch.randint(0, bench_mamba.VOCAB, (8, 256))
    return {
        "GPT 4 x 256 (bench_gpt), batch 16 x 256": (
            {
                "seqlab": adamw_step(gpt, lambda m: lm_loss(m(ids))),
                "HF": adamw_step(hf, lambda m: lm_loss(m(ids).logits)),
            },
            ids.numel(),
        ),
        "ViT Fashion-MNIST shape (bench_vit), batch 128": (
            {"seqlab": adamw_step(vit.train(), lambda m: F.cross_entropy(m(images), labels))},
            128,
        ),
        "Mamba LM 4 x 256 (bench_mamba), batch 8 x 256": (
            {
                "seqlab": adamw_step(
                    mamba, lambda m: F.cross_entropy(m(mids)[:, :-1].flatten(0, 1), mids[:, 1:].flatten())
                )
            },
            mids.numel(),
        ),
    }


def step_rows(repeats: int) -> list[str]:
    out = []
    for name, (steps, items) in models().items():
        fns = {"torch": with_gemm("torch", steps["seqlab"]), "onednn": with_gemm("onednn", steps["seqlab"])}
        if "HF" in steps:
            fns["HF"] = steps["HF"]
        t = {k: statistics.median(v) for k, v in alternate(fns, repeats).items()}
        hf = f"{items / t['HF']:,.0f}" if "HF" in t else ""
        vs_hf = f"{t['HF'] / t['torch']:.2f} / {t['HF'] / t['onednn']:.2f}" if "HF" in t else ""
        out.append(
            f"| {name} | {items / t['torch']:,.0f} | {items / t['onednn']:,.0f} | {t['torch'] / t['onednn']:.2f} | "
            f"{hf} | {vs_hf} |"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, no file written")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--step-repeats", type=int, default=9)
    args = p.parse_args()
    repeats, step_repeats = (2, 2) if args.quick else (args.repeats, args.step_repeats)
    load_before = os.getloadavg()[0]
    lines = [
        f"# float32 products on the CPU: MKL (torch's default) and oneDNN\n\n{cpu_name()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {dt.date.today()}; medians of {repeats} "
        f"repeats (products) and {step_repeats} (steps), contenders alternating; seqlab's automatic choice "
        f"here: {'oneDNN' if (why := gemm.onednn_reason()) is None else 'MKL (' + why + ')'}.\n",
        "| rows x in -> out | product | MKL ms (GFLOP/s) | oneDNN ms (GFLOP/s) | MKL / oneDNN |",
        "|---|---|---:|---:|---:|",
        *product_rows(4096, repeats),
        *product_rows(512, repeats),
        "",
        first_call_cost(repeats),
        "",
        "Training steps (forward, backward, fused AdamW), fp32, tokens (or images) per second:\n",
        "| model | seqlab, SEQLAB_GEMM=torch | seqlab, SEQLAB_GEMM=onednn | onednn / torch | HF | seqlab / HF "
        "(torch / onednn) |",
        "|---|---:|---:|---:|---:|---:|",
        *step_rows(step_repeats),
    ]
    lines.append(f"\nLoad average before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f}.\n")
    report("gemm", "\n".join(lines), args.quick)


if __name__ == "__main__":
    main()
