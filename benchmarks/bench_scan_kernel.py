"""The fused C++ selective scan (seqlab.kernels) against the chunked PyTorch scan and TorchInductor, on the CPU.

    python benchmarks/bench_scan_kernel.py                 # 7 repeats, Inductor included, fresh-build cost
    python benchmarks/bench_scan_kernel.py --quick         # 5 repeats, no Inductor, no fresh build

Measured, in one process with the contenders alternating within each repeat (the order rotates), medians and
interquartile ranges over the repeats:

* Mamba LM training step (forward + cross-entropy + backward), tokens/s, at the widths seqlab uses: the lab's
  suites (the width matched to their 60k-parameter budget, 2 layers, batch 32 x 128), the
  configs/mamba-shakespeare.yaml run (d_model 192, 4 layers, 32 x 128) and benchmarks/bench_mamba.py's model
  (d_model 256, 4 layers, 16 x 256). The same model runs on seqlab's kernels (``selective_scan(impl="kernel")``,
  the fused causal conv + SiLU, ``seqlab.kernels.causal_conv``, and LayerNorm) and on PyTorch alone
  (``impl="chunked"``, torch's conv1d and F.layer_norm): the "chunked" column is the step before any kernel.
* The raw scan, forward + backward of sum(y), at b=16, t=256, d=512, n=16 with D, the z gate, delta_bias and
  softplus (the Mamba block's call): the kernel, the chunked scan, and ``torch.compile`` (Inductor's CPU code
  generation) of ``selective_scan_ref``, the loop over t.
* Compile costs: the kernel's build in a fresh cache folder (a child process; ``build_info()``), the load from
  the cache, and Inductor's first call.

Writes benchmarks/results/scan-kernel-<cpu>-torch<version>.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._inductor.config
import torch.nn.functional as F

import seqlab.kernels.layer_norm as layer_norm_module
import seqlab.layers.mamba as mamba_module
from seqlab.kernels import build_info, load_kernel
from seqlab.lab.budget import lab_model_fields
from seqlab.lab.report import cpu_name, hardware_slug
from seqlab.lab.suite import QUICK
from seqlab.layers.scan import selective_scan, selective_scan_ref
from seqlab.models import build, make_config

VOCAB = 65
RAW = (16, 256, 512, 16)  # b, t, d, n
INDUCTOR_T = 16  # Inductor's compile of the 256-step loop (forward + backward) did not finish in 20 minutes


def lm_settings() -> list[tuple[str, dict, int, int]]:
    """(label, LM fields, batch, length) at the lab's widths."""
    lab, _ = lab_model_fields("mamba", QUICK, {"vocab_size": VOCAB})
    return [
        (f"lab suites (d_model {lab['d_model']}, {lab['n_layers']} layers)", lab, 32, 128),
        (
            "mamba-shakespeare.yaml (d_model 192, 4 layers)",
            {"mixer": "mamba", "d_model": 192, "n_layers": 4},
            32,
            128,
        ),
        (
            "bench_mamba.py (d_model 256, 4 layers)",
            {"mixer": "mamba", "d_model": 256, "n_layers": 4},
            16,
            256,
        ),
    ]


@contextlib.contextmanager
def scan_impl(impl: str):
    """The Mamba block's selective_scan with ``impl`` fixed (the block looks the names up at each call); for
    "chunked" the conv and LayerNorm kernels are off too, so that contender is PyTorch alone."""
    original = mamba_module.selective_scan, mamba_module.why_not_conv_kernel, layer_norm_module.why_not_kernel
    mamba_module.selective_scan = functools.partial(selective_scan, impl=impl)
    if impl == "chunked":
        mamba_module.why_not_conv_kernel = lambda x: "the PyTorch-only contender"
        layer_norm_module.why_not_kernel = lambda *a: "the PyTorch-only contender"
    try:
        yield
    finally:
        mamba_module.selective_scan, mamba_module.why_not_conv_kernel, layer_norm_module.why_not_kernel = (
            original
        )


def lm_step(model, ids) -> None:
    logits = model(ids)
    F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)).backward()
    model.zero_grad(set_to_none=True)


def alternate(contenders: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds per call for each contender (one warm-up call each), the order rotating every repeat."""
    names = list(contenders)
    for name in names:
        contenders[name]()
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
        print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()), flush=True)
    return times


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def bench_lm(repeats: int) -> list[tuple[str, int, int, dict]]:
    rows = []
    for label, fields, b, t in lm_settings():
        torch.manual_seed(0)
        model = build("lm", make_config("lm", {"vocab_size": VOCAB, **fields})).train()
        ids = torch.randint(0, VOCAB, (b, t))

        def run(impl, m=model, x=ids):
            with scan_impl(impl):
                lm_step(m, x)

        print(label, flush=True)
        times = alternate({impl: functools.partial(run, impl) for impl in ("kernel", "chunked")}, repeats)
        rows.append((label, b, t, times))
    return rows


def raw_inputs(t: int) -> tuple[list, dict]:
    b, _, d, n = RAW
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(b, t, d, generator=g), torch.randn(b, t, d, generator=g) - 2.0]
    args += [-torch.arange(1.0, n + 1).expand(d, n).contiguous()]
    args += [torch.randn(b, t, n, generator=g), torch.randn(b, t, n, generator=g)]
    kw = {
        "D": torch.ones(d),
        "z": torch.randn(b, t, d, generator=g),
        "delta_bias": torch.randn(d, generator=g),
    }
    return [a.requires_grad_() for a in args], {k: v.requires_grad_() for k, v in kw.items()}


def bench_raw(repeats: int, t: int, inductor: bool) -> tuple[dict[str, list[float]], float | None]:
    args, kw = raw_inputs(t)

    def fwd_bwd(fn):
        fn(*args, **kw, delta_softplus=True).sum().backward()

    contenders = {
        "kernel": lambda: fwd_bwd(functools.partial(selective_scan, impl="kernel")),
        "chunked": lambda: fwd_bwd(functools.partial(selective_scan, impl="chunked")),
    }
    first_call = None
    if inductor:
        torch._inductor.config.force_disable_caches = True  # time a cold compile, not an earlier run's cache
        compiled = torch.compile(selective_scan_ref)
        start = time.perf_counter()
        fwd_bwd(compiled)  # compiles the forward and the backward graphs
        first_call = time.perf_counter() - start
        print(f"inductor first call {first_call:.1f}s", flush=True)
        contenders["inductor"] = lambda: fwd_bwd(compiled)
    return alternate(contenders, repeats), first_call


def fresh_build_seconds() -> float:
    """The kernel's build time in an empty cache folder, in a child process."""
    code = (
        "import dataclasses, json; from seqlab.kernels import build_info, load_kernel; "
        "load_kernel(); print(json.dumps(dataclasses.asdict(build_info())))"
    )
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": folder}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["loaded"] and not info["cached"], info
    return info["seconds"]


def fmt_iqr(xs: list[float], scale: float = 1.0, digits: int = 0) -> str:
    """'median (q1-q3)' of the values times ``scale``."""
    q1, q2, q3 = (q * scale for q in quartiles(xs))
    return f"{q2:.{digits}f} ({q1:.{digits}f}-{q3:.{digits}f})"


def lm_table(rows) -> list[str]:
    lines = [
        "| model | batch x length | kernels tok/s (IQR) | PyTorch only, chunked scan tok/s (IQR) | speed-up |",
        "|---|---|---:|---:|---:|",
    ]
    for label, b, t, times in rows:
        rate = {k: [b * t / s for s in v] for k, v in times.items()}
        speedup = statistics.median(times["chunked"]) / statistics.median(times["kernel"])
        cells = [fmt_iqr(rate[k]) for k in ("kernel", "chunked")]
        lines.append(f"| {label} | {b} x {t} | {cells[0]} | {cells[1]} | {speedup:.2f}x |")
    return lines


def raw_table(times: dict[str, list[float]]) -> list[str]:
    base = statistics.median(times["chunked"])
    lines = ["| contender | fwd+bwd ms (IQR) | vs chunked |", "|---|---:|---:|"]
    for name, xs in times.items():
        lines.append(f"| {name} | {fmt_iqr(xs, 1e3, 1)} | {base / statistics.median(xs):.2f}x |")
    return lines


def report(args, lm_rows, raw, short, fresh) -> list[str]:
    info = build_info()
    how = "loaded from the cache" if info.cached else "compiled"
    b, t, d, n = RAW
    cost = [
        f"- Kernel build: {how} in this run in {info.seconds:.2f} s ({info.name}, flags {' '.join(info.flags)})"
    ]
    if fresh is not None:
        cost.append(
            f"- Kernel first-use compile in an empty cache folder: {fresh:.1f} s (once per machine kind)"
        )
    if short is not None:
        cost.append(
            f"- Inductor: first call of the compiled reference at t={INDUCTOR_T} (compiling forward and "
            f"backward): {short[1]:.0f} s"
        )
    return [
        "# Selective scan: fused C++ kernel vs chunked PyTorch scan (and Inductor), CPU",
        "",
        f"- CPU: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"vector ISA {torch.backends.cpu.get_cpu_capability()}",
        f"- {args.repeats} repeats, contenders alternating within each repeat (order rotating); medians with the "
        "interquartile range. The machine is shared with other jobs: absolute numbers are noisy, ratios less so.",
        *cost,
        f"- Command: `python benchmarks/bench_scan_kernel.py{' --quick' if args.quick else ''}`",
        "",
        "## Mamba LM training step (forward + cross-entropy + backward), vocab 65",
        "",
        "seqlab's kernels (the fused scan, the causal conv + SiLU, and LayerNorm) against the same model in PyTorch alone.",
        "",
        *lm_table(lm_rows),
        "",
        f"## Raw scan, forward + backward (b={b}, t={t}, d={d}, n={n}; D, z gate, delta_bias, softplus)",
        "",
        *raw_table(raw),
        "",
        *([] if short is None else inductor_section(short[0])),
    ]


def inductor_section(times: dict[str, list[float]]) -> list[str]:
    b, _, d, n = RAW
    return [
        f"## Raw scan with Inductor, forward + backward (b={b}, t={INDUCTOR_T}, d={d}, n={n})",
        "",
        f"`torch.compile(selective_scan_ref)` unrolls the loop over t into one graph: at t=256 its forward and "
        f"backward compile did not finish in 20 minutes on this machine, so Inductor is measured at t={INDUCTOR_T}.",
        "",
        *raw_table(times),
        "",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 repeats, no Inductor, no fresh-build measurement")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    args.repeats = args.repeats or (5 if args.quick else 7)
    torch.set_num_threads(args.threads)
    if not load_kernel():
        sys.exit(f"the kernel is unavailable: {build_info().reason}")
    fresh = None if args.quick else fresh_build_seconds()
    lm_rows = bench_lm(args.repeats)
    raw, _ = bench_raw(args.repeats, RAW[1], inductor=False)
    short = None if args.quick or args.no_inductor else bench_raw(args.repeats, INDUCTOR_T, inductor=True)
    lines = report(args, lm_rows, raw, short, fresh)
    ver = torch.__version__.split("+")[0]
    out = (
        args.out
        or Path(__file__).parent / "results" / f"scan-kernel-{hardware_slug(cpu_name())}-torch{ver}.md"
    )
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
