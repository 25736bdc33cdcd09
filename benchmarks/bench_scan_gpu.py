"""The Triton selective scan (seqlab.kernels.triton_scan) on a GPU, against the pure-PyTorch scan and Hugging Face.

    python benchmarks/bench_scan_gpu.py              # on a CUDA machine with Triton; writes the table
    python benchmarks/bench_scan_gpu.py --smoke      # tiny sizes on CPU, Triton only under TRITON_INTERPRET=1

Measured in one process, the contenders alternating within each repeat (the order rotates), medians and
interquartile ranges over the repeats, each timing between two ``torch.cuda.synchronize`` calls, float32:

* The raw scan, forward + backward of a weighted sum of y, at Mamba-130m's mixer geometry (d_inner 1536, n 16)
  with D, the z gate, delta_bias and softplus (the Mamba block's call): ``selective_scan(impl="triton")``,
  ``impl="chunked"`` (seqlab's PyTorch scan with its recomputing backward), and transformers' own scan
  function (``modeling_mamba.mamba_selective_scan`` where the installed version has it: the path
  ``MambaForCausalLM`` takes when the mamba_ssm CUDA kernels are not installed), differentiated by autograd.
* A training step (forward, cross-entropy, backward; no optimizer) of Mamba-130m's geometry (24 layers,
  d_model 768, vocabulary 50,280; random weights): ``MambaForCausalLM`` as transformers runs it here, and the
  same weights converted to seqlab (``seqlab.interop.from_hf``) with the Triton scan and with the PyTorch scan.
  The losses are printed side by side (the same model: they agree to float32 rounding).
* The first call's cost: Triton's compile into an empty cache folder (then cached in ~/.triton across
  processes), reported apart; every table row is timed after warm-up.

Writes benchmarks/results/scan-gpu-<gpu>-torch<version>.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import seqlab.layers.mamba as mamba_module
from seqlab.lab.report import hardware_slug
from seqlab.layers.scan import selective_scan

RESULTS = Path(__file__).resolve().parent / "results"


def hf_scan_fn():
    """transformers' fallback scan (b, d, t layout), or None when the installed version has none by that name."""
    try:
        from transformers.models.mamba import modeling_mamba
    except ImportError:
        return None
    fn = getattr(modeling_mamba, "mamba_selective_scan", None)
    return getattr(fn, "__wrapped__", fn)


def scan_inputs(b, t, d, n, device, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device).requires_grad_()

    A = (-torch.rand(d, n, generator=g) * 4 - 0.1).to(device).requires_grad_()
    return {
        "u": r(b, t, d),
        "delta": r(b, t, d, scale=0.5),
        "A": A,
        "B": r(b, t, n),
        "C": r(b, t, n),
        "D": r(d),
        "z": r(b, t, d),
        "delta_bias": r(d, scale=0.1),
    }


def scan_contenders(x: dict, hf_fn) -> dict:
    w = torch.randn_like(x["u"]).detach()
    leaves = list(x.values())

    def seqlab(impl):
        def run():
            y = selective_scan(**x, delta_softplus=True, impl=impl)
            torch.autograd.grad((y * w).sum(), leaves)

        return run

    out = {"seqlab Triton": seqlab("triton"), "seqlab PyTorch (chunked)": seqlab("chunked")}
    if hf_fn is not None:

        def hf():
            tr = {k: x[k].transpose(1, 2) for k in ("u", "delta", "B", "C", "z")}
            y = hf_fn(
                tr["u"], tr["delta"], x["A"], tr["B"], tr["C"], D=x["D"], z=tr["z"],
                delta_bias=x["delta_bias"], delta_softplus=True,
            )  # fmt: skip
            torch.autograd.grad((y.transpose(1, 2) * w).sum(), leaves)

        out["transformers mamba_selective_scan"] = hf
    return out


def check_scan(x: dict, hf_fn) -> dict:
    """Max |difference| of y against the chunked scan, for each contender (a check that they compute the same)."""
    with torch.no_grad():
        ref = selective_scan(**x, delta_softplus=True, impl="chunked")
        out = {
            "seqlab Triton": (selective_scan(**x, delta_softplus=True, impl="triton") - ref)
            .abs()
            .max()
            .item()
        }
        if hf_fn is not None:
            tr = {k: x[k].transpose(1, 2) for k in ("u", "delta", "B", "C", "z")}
            y = hf_fn(
                tr["u"], tr["delta"], x["A"], tr["B"], tr["C"], D=x["D"], z=tr["z"],
                delta_bias=x["delta_bias"], delta_softplus=True,
            )  # fmt: skip
            out["transformers mamba_selective_scan"] = (y.transpose(1, 2) - ref).abs().max().item()
    return out


def lm_contenders(args, device):
    from transformers import MambaConfig, MambaForCausalLM

    from seqlab.interop import from_hf

    torch.manual_seed(0)
    if args.smoke:
        cfg = MambaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2)
    else:  # state-spaces/mamba-130m-hf's geometry
        cfg = MambaConfig(vocab_size=50280, hidden_size=768, num_hidden_layers=24, state_size=16, expand=2)
    hf = MambaForCausalLM(cfg).to(device)
    ours = from_hf(hf).to(device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(cfg.vocab_size, (args.lm_batch, args.lm_len + 1), generator=g).to(device)
    x, y = ids[:, :-1], ids[:, 1:]

    def hf_step():
        hf.zero_grad(set_to_none=True)
        loss = F.cross_entropy(hf(x).logits.flatten(0, 1), y.flatten())
        loss.backward()
        return loss.item()

    def seqlab_step(impl):
        def run():
            ours.zero_grad(set_to_none=True)
            original = mamba_module.selective_scan
            mamba_module.selective_scan = functools.partial(selective_scan, impl=impl)
            try:
                loss = F.cross_entropy(ours(x).flatten(0, 1), y.flatten())
            finally:
                mamba_module.selective_scan = original
            loss.backward()
            return loss.item()

        return run

    return {
        "transformers MambaForCausalLM": hf_step,
        "seqlab Triton": seqlab_step("triton"),
        "seqlab PyTorch (chunked)": seqlab_step("chunked"),
    }


def timed(contenders: dict, repeats: int, sync) -> dict:
    """name -> (median s, IQR s, peak memory bytes), contenders alternating, the order rotating per repeat."""
    names = list(contenders)
    times = {k: [] for k in names}
    peaks = {}
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            contenders[k]()
            sync()
            times[k].append(time.perf_counter() - t0)
            if torch.cuda.is_available():
                peaks[k] = torch.cuda.max_memory_allocated()
    out = {}
    for k, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        out[k] = (statistics.median(ts), q[2] - q[0], peaks.get(k))
    return out


def first_call_cost(x: dict, sync) -> float:
    """Seconds of the Triton scan's first forward + backward with an empty Triton cache (compile + run)."""
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = tmp
        try:
            import seqlab.kernels.triton_scan as ts

            sync()
            t0 = time.perf_counter()
            y = ts.selective_scan_triton(**x, delta_softplus=True)
            torch.autograd.grad(y.sum(), list(x.values()))
            sync()
            return time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("TRITON_CACHE_DIR")
            else:
                os.environ["TRITON_CACHE_DIR"] = old


def sweep(x: dict, sync, repeats: int) -> str:
    """Forward and forward + backward times of the Triton scan for each (channels, warps) launch setting."""
    import seqlab.kernels.triton_scan as ts

    leaves, saved = list(x.values()), dict(ts.LAUNCH)
    lines = ["| channels per program | warps | forward ms | forward + backward ms |", "|---:|---:|---:|---:|"]

    def fwd():
        with torch.no_grad():
            ts.selective_scan_triton(**x, delta_softplus=True)

    def both():
        y = ts.selective_scan_triton(**x, delta_softplus=True)
        torch.autograd.grad(y.sum(), leaves)

    try:
        for block_d in (4, 8, 16, 32):
            for warps in (1, 2, 4):
                if block_d * 16 < 32 * warps:  # fewer elements than threads
                    continue
                ts.LAUNCH.update(fwd=(block_d, warps), bwd=(block_d, warps))
                fwd(), both()  # compile
                rows = timed({"fwd": fwd, "both": both}, repeats, sync)
                lines.append(
                    f"| {block_d} | {warps} | {1e3 * rows['fwd'][0]:.2f} | {1e3 * rows['both'][0]:.2f} |"
                )
                print(lines[-1], flush=True)
    finally:
        ts.LAUNCH.update(saved)
    return "\n".join(lines)


def table(rows: dict, unit: str, per: float, base: str) -> str:
    lines = [
        f"| contender | {unit} | median ms | IQR ms | peak memory GiB | vs {base} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k, (med, iqr, peak) in rows.items():
        mem = "n/a" if peak is None else f"{peak / 2**30:.2f}"
        lines.append(
            f"| {k} | {per / med:,.0f} | {1e3 * med:.1f} | {1e3 * iqr:.1f} | {mem} | {rows[base][0] / med:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--lm-repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--len", type=int, default=1024)
    p.add_argument("--lm-batch", type=int, default=4)
    p.add_argument("--lm-len", type=int, default=512)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU; writes no file")
    p.add_argument(
        "--sweep", action="store_true", help="only time the Triton scan's launch settings; no file"
    )
    p.add_argument(
        "--out", type=Path, help="the table's path (default: benchmarks/results/scan-gpu-<gpu>-...)"
    )
    a = p.parse_args()
    if a.smoke:
        a.repeats, a.lm_repeats, a.batch, a.len, a.lm_batch, a.lm_len = 2, 2, 2, 16, 2, 16
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise SystemExit("error: this benchmark needs a CUDA GPU (use --smoke to check the script on CPU)")
    else:
        device = torch.device("cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    d, n = (64, 16) if a.smoke else (1536, 16)
    x = scan_inputs(a.batch, a.len, d, n, device)
    if a.sweep:
        print(sweep(x, sync, a.repeats))
        return
    compile_s = first_call_cost(x, sync)
    hf_fn = hf_scan_fn()
    diffs = check_scan(x, hf_fn)
    contenders = scan_contenders(x, hf_fn)
    for f in contenders.values():  # warm-up
        f()
    scan_rows = timed(contenders, a.repeats, sync)
    print(table(scan_rows, "positions/s", a.batch * a.len, "seqlab PyTorch (chunked)"), flush=True)
    lm = lm_contenders(a, device)
    losses, out_of_memory = {}, []
    for k, f in list(lm.items()):  # warm-up, and the losses side by side
        try:
            losses[k] = f()
        except torch.OutOfMemoryError:
            out_of_memory.append(k)
            del lm[k]
            torch.cuda.empty_cache()
    lm_rows = timed(lm, a.lm_repeats, sync)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    import transformers
    import triton

    text = (
        f"# The selective scan on {name} (torch {torch.__version__}, triton {triton.__version__}, "
        f"transformers {transformers.__version__}, {dt.date.today().isoformat()})\n\n"
        f"Command: `python benchmarks/bench_scan_gpu.py`. float32; contenders alternating, order rotating; "
        f"medians and IQR over the repeats; peak memory is torch's allocator high-water mark during one call.\n\n"
        f"## Raw scan, forward + backward: b {a.batch}, t {a.len}, d {d}, n {n} (D, z gate, delta_bias, softplus), "
        f"{a.repeats} repeats\n\n"
        + table(scan_rows, "positions/s", a.batch * a.len, "seqlab PyTorch (chunked)")
        + "\n\nmax |y - chunked y|: "
        + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items())
        + f"\n\n## Mamba-130m geometry (24 layers, d_model 768), training step without optimizer: batch {a.lm_batch} x "
        f"{a.lm_len}, {a.lm_repeats} repeats\n\n"
        + table(lm_rows, "tokens/s", a.lm_batch * a.lm_len, next(iter(lm_rows)))
        + "".join(f"\n| {k} | out of GPU memory | | | | |" for k in out_of_memory)
        + "\n\nlosses (same weights): "
        + ", ".join(f"{k} {v:.6f}" for k, v in losses.items())
        + f"\n\nFirst Triton forward + backward into an empty cache (compile + run): {compile_s:.1f} s; later "
        f"processes load the compiled kernels from ~/.triton/cache. Not in the rows above (all timed after warm-up).\n"
    )
    if hf_fn is None:
        text += "\ntransformers has no `mamba_selective_scan` in this version: its raw-scan row is absent.\n"
    print(text)
    if not a.smoke:
        path = a.out or RESULTS / f"scan-gpu-{hardware_slug(name)}-torch{torch.__version__.split('+')[0]}.md"
        path.write_text(text, encoding="utf-8")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
