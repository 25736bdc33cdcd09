"""Mamba-2's SSD on the CPU: its forms against each other and against Hugging Face's, and the Mamba-2 LM against
Hugging Face's Mamba2ForCausalLM.

    python benchmarks/bench_mamba2.py            # writes benchmarks/results/mamba2-<cpu>-torch<v>.md
    python benchmarks/bench_mamba2.py --quick    # a smoke run: fewer repeats, writes nothing

1. The sequence transformation alone, forward + backward (every input's gradient), float32, at a lab Mamba-2
   layer's shapes and at a wider one: ``seqlab.layers.ssd.ssd_scan`` (the selective-scan kernel with one A per
   channel: one exp per channel and position, the states' sum in the adjoint), the same kernel given A repeated
   over the n states (Mamba's general path: n exps), ``ssd_chunked`` (the paper's block decomposition in
   PyTorch's products), and Hugging Face's ``mamba2_chunk_scan`` (what ``Mamba2ForCausalLM`` runs on a CPU).
2. The LM: seqlab's Mamba-2 LM and HF's Mamba2ForCausalLM with the same weights (``seqlab.interop.from_hf``),
   one training step (forward, cross-entropy, backward), tokens/s.
3. The gated RMSNorm, forward + backward: its C++ kernel (``seqlab.kernels.gated_norm``), the torch ops with
   their own backward (where the kernel cannot run) and the plain ops; and the lab's Mamba-2 LM training step
   (the quick suite's model, b 8, t 1024) with the kernel and with ``SEQLAB_DISABLE_KERNELS=gated_norm``.

Contenders alternate within each repeat (``common.alternate``), medians and interquartile ranges over repeats.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import statistics

import torch
import torch.nn.functional as F

from common import alternate, report
from seqlab.lab.report import cpu_name
from seqlab.lab.systems import load_1min
from seqlab.layers.scan import selective_scan
from seqlab.layers.ssd import ssd_chunked, ssd_scan
from seqlab.training.allocator import keep_freed_memory

SSD_SHAPES = [  # b, t, h, p, n: a lab Mamba-2 layer (d_model 48, the registry's defaults), and a wider one
    (8, 1024, 12, 8, 64),
    (4, 1024, 8, 64, 64),
]


def _spread(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4)
    med = statistics.median(xs)
    return med, (q[2] - q[0]) / med


def ssd_inputs(b, t, h, p, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, h, p, generator=g)
    dt = F.softplus(torch.randn(b, t, h, generator=g) - 2)
    A = -torch.rand(h, generator=g) * 15 - 1
    B, C = torch.randn(b, t, 1, n, generator=g), torch.randn(b, t, 1, n, generator=g)
    D = torch.randn(h, generator=g)
    return [v.requires_grad_() for v in (x, dt, A, B, C, D)]


def per_state(x, dt, A, B, C, D):
    """ssd_scan's mapping with A repeated over the n states: the kernel's general (Mamba) path."""
    b, t, h, p = x.shape
    n = B.size(-1)
    y, _ = selective_scan(
        x.reshape(b, t, h * p),
        dt[..., None].expand(b, t, h, p).reshape(b, t, h * p),
        A.repeat_interleave(p)[:, None].expand(h * p, n).contiguous(),
        B[:, :, 0].contiguous(),
        C[:, :, 0].contiguous(),
        D=D.repeat_interleave(p),
        return_last_state=True,
    )
    return y.view(b, t, h, p), None


def hf_chunk_scan(x, dt, A, B, C, D, chunk=256):
    from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

    return mamba2_chunk_scan(x, dt, A, B, C, chunk_size=chunk, D=D), None


def _ssd_step(f, args):
    """One forward + backward of form f, the gradients dropped after."""

    def step():
        y, _ = f(*args)
        y.sum().backward()
        for a in args:
            a.grad = None

    return step


def _lm_step(model, ids, logits_of):
    """One training step's forward, cross-entropy and backward (no optimizer: the same for both libraries)."""

    def step():
        logits = logits_of(model(ids))
        F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)).backward()
        model.zero_grad(set_to_none=True)

    return step


def ssd_rows(repeats: int) -> list[str]:
    forms = {
        "ssd_scan (kernel, one A a channel)": ssd_scan,
        "kernel with A per state (Mamba's path)": per_state,
        "ssd_chunked (block decomposition, chunk 64)": lambda *a: ssd_chunked(*a, chunk_size=64),
        "HF mamba2_chunk_scan (chunk 256)": hf_chunk_scan,
    }
    rows = []
    for shape in SSD_SHAPES:
        args = ssd_inputs(*shape)
        fns = {name: _ssd_step(f, args) for name, f in forms.items()}
        times = alternate(fns, repeats)
        base = statistics.median(times[next(iter(forms))])
        b, t, h, p, n = shape
        for name, ts in times.items():
            med, iqr = _spread(ts)
            rows.append(
                f"| b {b}, t {t}, h {h} x p {p}, n {n} | {name} | {med * 1e3:.1f} | ±{iqr:.0%} | {med / base:.2f} |"
            )
    return rows


def lm_rows(repeats: int) -> list[str]:
    import transformers

    from seqlab.interop import from_hf

    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = transformers.Mamba2Config(
        vocab_size=256,
        hidden_size=256,
        num_hidden_layers=4,
        state_size=64,
        head_dim=64,
        num_heads=8,
        n_groups=1,
        chunk_size=256,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    hf = transformers.Mamba2ForCausalLM(cfg).train()
    ours = from_hf(hf).train()
    rows = []
    for b, t in ((16, 256), (8, 1024)):
        ids = torch.randint(0, 256, (b, t))
        our_step = _lm_step(ours, ids, lambda out: out)
        hf_step = _lm_step(hf, ids, lambda out: out.logits)
        times = alternate({"seqlab": our_step, "HF": hf_step}, repeats)
        (ms, rs), (mh, rh) = _spread(times["seqlab"]), _spread(times["HF"])
        rows.append(
            f"| {b} x {t} | {b * t / ms:,.0f} ±{rs:.0%} | {b * t / mh:,.0f} ±{rh:.0%} | {mh / ms:.2f} |"
        )
    return rows


NORM_SHAPES = [
    (8, 1024, 104, 104),
    (4, 1024, 512, 512),
]  # b, t, d, group: the lab's layer, the LM rows' layer


def norm_rows(repeats: int) -> list[str]:
    from seqlab.kernels.gated_norm import _GatedRMSNorm, gated_rms_norm, gated_rms_norm_ref

    forms = {
        "C++ kernel": gated_rms_norm,
        "torch ops, their own backward": _GatedRMSNorm.apply,
        "torch ops": gated_rms_norm_ref,
    }
    rows = []
    for b, t, d, group in NORM_SHAPES:
        g = torch.Generator().manual_seed(0)
        y, z = (torch.randn(b, t, d, generator=g).requires_grad_() for _ in range(2))
        args = (y, z, torch.ones(d, requires_grad=True))
        fns = {
            name: _ssd_step(lambda *a, f=f, group=group: (f(*a, group, 1e-5), None), args)
            for name, f in forms.items()
        }
        times = alternate(fns, repeats)
        base = statistics.median(times["C++ kernel"])
        for name, ts in times.items():
            med, iqr = _spread(ts)
            rows.append(f"| b {b}, t {t}, d {d} | {name} | {med * 1e3:.2f} | ±{iqr:.0%} | {med / base:.2f} |")
    return rows


def lab_step_rows(repeats: int) -> list[str]:
    """The quick suite's Mamba-2 LM, one training step with the norm's kernel and without."""
    from seqlab.lab.budget import build_lab_model
    from seqlab.lab.suite import QUICK

    model, _, _ = build_lab_model("mamba2", QUICK, {"vocab_size": 256}, 0)
    ids = torch.randint(0, 256, (8, 1024))
    plain = _lm_step(model, ids, lambda out: out)

    def switched(off: bool):
        def run():
            if off:
                os.environ["SEQLAB_DISABLE_KERNELS"] = "gated_norm"
            try:
                plain()
            finally:
                os.environ.pop("SEQLAB_DISABLE_KERNELS", None)

        return run

    times = alternate({"kernel": switched(False), "ops": switched(True)}, repeats)
    (mk, rk), (mo, ro) = _spread(times["kernel"]), _spread(times["ops"])
    return [f"| {mk * 1e3:.1f} ±{rk:.0%} | {mo * 1e3:.1f} ±{ro:.0%} | {mo / mk:.2f} |"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run that writes no file")
    args = p.parse_args()
    keep = keep_freed_memory()
    repeats = 3 if args.quick else 15
    before = load_1min()
    ssd = ssd_rows(repeats)
    lm = lm_rows(max(3, repeats // 3))
    norm, lab_step = norm_rows(repeats), lab_step_rows(repeats)
    after = load_1min()
    import transformers

    lines = [
        "# Mamba-2's SSD on the CPU: its forms, Hugging Face's, and the LM",
        "",
        f"{cpu_name()}, torch {torch.__version__}, transformers {transformers.__version__}, {dt.date.today()}, "
        f"{torch.get_num_threads()} threads, float32; medians over {repeats} repeats (the LM: "
        f"{max(3, repeats // 3)}) with the interquartile range over the median, contenders alternating. "
        f"malloc keeps freed memory: {'yes' if keep else 'no'}. Load average (1 min) before / after: "
        f"{before:.2f} / {after:.2f} ({os.cpu_count()} cores). Command: `python benchmarks/bench_mamba2.py`.",
        "",
        "## The sequence transformation, forward + backward (every input's gradient)",
        "",
        "| shape | form | ms | ± | × ssd_scan's time |",
        "|---|---|---:|---:|---:|",
        *ssd,
        "",
        "## The LM: one training step (forward, cross-entropy, backward), tokens/s",
        "",
        "d_model 256, 4 layers, state 64, head_dim 64 (8 heads), one group, vocabulary 256, tied; the same "
        "weights (`from_hf`).",
        "",
        "| batch x length | seqlab | HF Mamba2ForCausalLM | seqlab / HF |",
        "|---|---:|---:|---:|",
        *lm,
        "",
        "## The gated RMSNorm, forward + backward",
        "",
        "| shape | form | ms | ± | × the kernel's time |",
        "|---|---|---:|---:|---:|",
        *norm,
        "",
        "The lab's Mamba-2 LM (the quick suite's model: d_model 52, 2 layers), one training step (forward, "
        "cross-entropy, backward) at b 8, t 1024, ms:",
        "",
        "| norm kernel | `SEQLAB_DISABLE_KERNELS=gated_norm` (ops, their own backward) | speed-up |",
        "|---:|---:|---:|",
        *lab_step,
    ]
    report("mamba2", "\n".join(lines) + "\n", args.quick)


if __name__ == "__main__":
    main()
