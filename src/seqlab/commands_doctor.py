"""``seqlab doctor``: what this machine has and what each task and suite needs, before anything spends minutes.

It prints the Python, torch (CPU or CUDA build, threads, devices) and CPU; each compiled kernel (built already,
built on first use, or why it cannot be; the GPU scan's Triton) and the build cache (its size, and the builds
this seqlab's sources superseded, which ``seqlab doctor --prune-kernels`` removes: ``seqlab.kernels.prune``); every optional package with its
version or the line that installs it; the data sets read from Debian packages or other PyPI packages; and for
each task and ``seqlab compare`` suite, ready or what is missing. It imports nothing heavy to find a package
(``importlib.util.find_spec``), so it answers in a second or two. Exit status 0 (it is a report, not a check).

The same tables stop a run before it spends minutes: ``seqlab train`` (``run.build_run``) calls
:func:`require` with :func:`task_needs` before the data is built, and ``seqlab compare`` calls it with
:func:`suite_needs` before the first run trains, so a missing package or data set is one error line that
names what to install, not a traceback after the other runs have trained.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import shutil
import sys
from pathlib import Path

__all__ = ["NEEDS", "add_doctor", "missing", "require", "suite_needs", "task_needs"]

PACKAGES: dict[str, tuple[str, str]] = {
    # import name -> (what it is for, how to install it)
    "tokenizers": ("subword and word vocabularies", "pip install tokenizers"),
    "sacrebleu": ("BLEU and chrF", "pip install sacrebleu"),
    "pycocoevalcap": ("CIDEr-D for captions", "pip install pycocoevalcap"),
    "sklearn": ("the 8×8 digits, macro F1", "pip install scikit-learn"),
    "PIL": ("reading images", "pip install pillow"),
    "statsmodels": ("built-in time series", "pip install statsmodels"),
    "vega_datasets": (
        "built-in time series (hourly temperatures, Seattle weather)",
        "pip install vega_datasets",
    ),
    "mnist1d": ("MNIST-1D for the lab's sequence classification", "pip install mnist1d requests"),
    "requests": ("imported by mnist1d (seqlab downloads nothing)", "pip install requests"),
    "ninja": ("builds the fused CPU kernels (else slower fallbacks)", "pip install ninja"),
    "soundfile": ("reading and writing WAV files", "pip install soundfile"),
    "librosa": ("the mel filterbank", "pip install librosa"),
    "jiwer": ("word and character error rates", "pip install jiwer"),
    "flashlight": ("CTC prefix beam search", "pip install flashlight-text"),
    "transformers": ("weight import and parity tests (optional)", "pip install transformers"),
    "tensorboard": ("TensorBoard logs (optional)", "pip install tensorboard"),
}
DATA: dict[str, tuple[str, str]] = {
    # name -> (a path or program that shows it is installed, how to install it)
    "fashion-mnist": ("/usr/share/datasets/fashion-mnist", "apt-get install -y dataset-fashion-mnist"),
    "tuxpaint-stamps": (
        "/usr/share/tuxpaint/stamps",
        "apt-get install -y --no-install-recommends tuxpaint-stamps-default",
    ),
    "freedict-deu-eng": (
        "/usr/share/dictd/freedict-deu-eng.index",
        "apt-get install -y dict-freedict-deu-eng",
    ),
    "espeak-ng": ("espeak-ng", "apt-get install -y espeak-ng"),
}
SOURCE_NEEDS: dict[str, tuple[str, ...]] = {
    # a task's data source -> what it needs beyond seqlab's own dependencies (pip install seqlab brings those)
    "fashion_mnist": ("fashion-mnist",),  # unless the run gives its own task.data_dir
    "mnist1d": ("mnist1d", "requests"),
    "freedict": ("freedict-deu-eng",),
    "tuxpaint": ("tuxpaint-stamps",),
}
SPEECH_TASKS = ("keywords", "speech_ctc")  # their source "generated" is spoken by espeak-ng
SUITE_NEEDS: dict[str, tuple[str, ...]] = {
    # the suites that are not lists of task settings (SUITES in lab/suite.py holds those: quick, full)
    "translation": ("tokenizers", "sacrebleu"),
    "captioning": ("tokenizers", "sacrebleu", "pycocoevalcap"),
    "video": ("tokenizers", "sacrebleu", "sklearn"),
    "timeseries": ("statsmodels", "vega_datasets"),
    "speech": ("espeak-ng", "soundfile", "librosa", "jiwer", "flashlight"),
}
NEEDS: dict[str, tuple[str, ...]] = {
    # a task (its default source) or a suite -> packages and data it needs
    "task shakespeare / text (the corpus ships with seqlab)": (),
    "task adding / copy / selective_copy / associative_recall / induction": (),
    "task seq_image (fashion_mnist | mnist1d)": ("fashion-mnist|mnist1d",),
    "task seq_image, source=mnist1d": ("mnist1d", "requests"),
    "task translation (the built-in Bible pairs)": ("tokenizers", "sacrebleu"),
    "task translation, source=freedict": ("tokenizers", "sacrebleu", "freedict-deu-eng"),
    "task image_classification (fashion_mnist)": ("fashion-mnist",),
    "task image_classification, source=digits": ("sklearn",),
    "task captioning (generated scenes)": ("tokenizers", "sacrebleu", "pycocoevalcap"),
    "task captioning, source=tuxpaint": (
        "tokenizers",
        "sacrebleu",
        "pycocoevalcap",
        "tuxpaint-stamps",
        "PIL",
    ),
    "task video": ("tokenizers", "sacrebleu", "sklearn"),
    "task forecast / series_classification": ("statsmodels", "vega_datasets", "sklearn"),
    "task keywords / speech_ctc": ("espeak-ng", "soundfile", "librosa", "jiwer", "flashlight"),
    "compare --suite quick / full": ("mnist1d", "requests"),
    **{f"compare --suite {name}": needs for name, needs in SUITE_NEEDS.items()},
}


def _installed(name: str) -> bool:
    if name in DATA:
        where = DATA[name][0]
        return Path(where).exists() if where.startswith("/") else shutil.which(where) is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing(needs: tuple[str, ...]) -> list[str]:
    """The install lines of what ``needs`` lacks here ('a|b' is satisfied by either)."""
    out = []
    for need in needs:
        options = need.split("|")
        if not any(_installed(o) for o in options):
            out.append(" or ".join((PACKAGES.get(o) or DATA[o])[1] for o in options))
    return out


def task_needs(task: str, fields: dict) -> tuple[str, ...]:
    """What one task setting needs beyond seqlab's own dependencies: its data source's package or data set."""
    from seqlab.tasks import task_signature

    param = task_signature(task).parameters.get("source")
    source = fields.get("source", param.default if param is not None else None)
    if source == "fashion_mnist" and fields.get("data_dir"):
        return ()  # the user's own copy of the IDX files
    if task in SPEECH_TASKS and source == "generated":
        return ("espeak-ng",)
    return SOURCE_NEEDS.get(source, ()) if isinstance(source, str) else ()


def suite_needs(suite: str, tasks: list[str] | None = None) -> tuple[str, ...]:
    """What ``seqlab compare --suite SUITE [--tasks ...]`` needs: its task settings' sources, or the table's."""
    from seqlab.lab.suite import SUITES

    if suite not in SUITES:
        return SUITE_NEEDS.get(suite, ())
    entries = [e for e in SUITES[suite].entries if not tasks or e.task in tasks]
    return tuple(dict.fromkeys(n for e in entries for n in task_needs(e.task, e.task_args)))


def require(needs: tuple[str, ...], what: str) -> None:
    """Raise MissingDependencyError naming the install line of everything ``needs`` lacks; before step 1."""
    lack = missing(needs)
    if lack:
        from seqlab.tasks.base import MissingDependencyError

        raise MissingDependencyError(
            f"{what} needs what this machine lacks; nothing was trained. Install it with: {'; '.join(lack)}"
            " (`seqlab doctor` shows what each task and suite needs)"
        )


def _version(name: str) -> str:
    dist = {"sklearn": "scikit-learn", "PIL": "pillow"}.get(name, name)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def _machine() -> list[str]:
    import torch

    from seqlab import __version__
    from seqlab.lab.report import cpu_name
    from seqlab.training.config import cpu_has_bf16_matmul

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    bf16 = (
        "yes (AMX or AVX512-BF16): train.precision=bf16 trains in bf16 autocast"
        if cpu_has_bf16_matmul()
        else "no (emulated, far slower than fp32): train.precision=bf16 is refused on the CPU"
    )
    return [
        f"seqlab {__version__}, Python {platform.python_version()} ({sys.executable})",
        f"torch {torch.__version__} ({build}), {torch.get_num_threads()} threads",
        f"CPU: {cpu_name()}; GPU: {', '.join(gpus) if gpus else 'none'}",
        f"CPU bf16 matmul units: {bf16}",
    ]


def _kernels() -> list[str]:
    """Each compiled kernel: already built on this machine (in the cache), built on first use, or why it cannot
    be; and the GPU scan's Triton. Nothing is built here: doctor stays a second or two."""
    import torch

    from seqlab.kernels import build as scan_build
    from seqlab.kernels.prune import EXTENSIONS

    libraries = [("selective scan (Mamba)", scan_build.library(), "scan")]
    for extension in EXTENSIONS:
        libraries.append((extension.label, extension.library(), extension.stem))
    tool = scan_build.missing_tool()
    lines = []
    for label, library, name in libraries:
        if (off := scan_build.disabled_reason(name)) is not None:
            state = off
        elif library.exists():
            state = f"built ({library.parent})"
        else:
            state = f"cannot build: {tool}" if tool else "built on first use (10-60 s once, then cached)"
        lines.append(f"  {label:<23} {state}")
    if not torch.cuda.is_available():
        gpu = "not used: no CUDA GPU"
    elif _installed("triton"):
        gpu = f"ready (triton {_version('triton')})"
    else:
        gpu = "missing: pip install triton (the chunked PyTorch scan runs instead)"
    return [
        *lines,
        f"  {'selective scan on GPU':<23} {gpu}",
        f"  {'float32 products':<23} {_gemm()}",
        f"  {'build cache':<23} {_cache_state()}",
    ]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _cache_state() -> str:
    """The kernel cache's folder, size and superseded builds (``seqlab.kernels.prune``)."""
    from seqlab.kernels import build, prune

    root = build.cache_root()
    if not root.is_dir():
        return f"{root} (empty)"
    sizes = {f: prune.folder_bytes(f) for f in root.iterdir() if f.is_dir()}  # each folder walked once
    old = prune.superseded(root)
    line = f"{root}: {len(sizes)} builds, {_mb(sum(sizes.values()))}"
    if old:
        size = sum(sizes[f] for f in old)
        line += (
            f"; {len(old)} superseded by this seqlab's sources ({_mb(size)}): seqlab doctor --prune-kernels"
        )
    return line


def _prune_kernels() -> int:
    from seqlab.kernels import prune

    removed = prune.prune(prune.superseded())
    for folder, size in removed:
        print(f"removed {folder} ({_mb(size)})")
    print(f"{len(removed)} superseded kernel builds removed, {_mb(sum(s for _, s in removed))}")
    return 0


def _gemm() -> str:
    """Which library multiplies seqlab's large float32 CPU matrices (``seqlab.kernels.gemm``)."""
    from seqlab.kernels.gemm import onednn_reason

    if (why := onednn_reason()) is None:
        return "oneDNN for forward products and input gradients, MKL for weight gradients"
    return f"MKL (torch's): {why}"


def _cmd_doctor(args: argparse.Namespace) -> int:
    if args.prune_kernels:
        return _prune_kernels()
    lines = ["machine", *(f"  {m}" for m in _machine()), "", "kernels (CPU: C++; GPU: Triton)", *_kernels()]
    lines += ["", "packages"]
    for name, (what, how) in PACKAGES.items():
        state = _version(name) if _installed(name) else f"missing: {how}"
        lines.append(f"  {name:<14} {state:<34} {what}")
    lines += ["", "data"]
    for name, (where, how) in DATA.items():
        lines.append(f"  {name:<17} {'installed (' + where + ')' if _installed(name) else 'missing: ' + how}")
    lines += ["", "tasks and suites"]
    for what, needs in NEEDS.items():
        lack = missing(needs)
        lines.append(
            f"  {'ready  ' if not lack else 'missing'} {what}" + (f": {'; '.join(lack)}" if lack else "")
        )
    print("\n".join(lines))
    return 0


def add_doctor(sub) -> None:
    d = sub.add_parser("doctor", help="what this machine has, and what each task and suite still needs")
    d.add_argument(
        "--prune-kernels",
        action="store_true",
        help="remove the compiled kernels that this seqlab's sources superseded (same Python, torch and CPU "
        "instruction set; builds for other environments are kept), then exit",
    )
    d.set_defaults(func=_cmd_doctor)
