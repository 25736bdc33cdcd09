"""Compiling seqlab's C++ kernels on first use, once per machine kind, and saying what it cost.

``load_kernel()`` builds ``selective_scan.cpp`` with ``torch.utils.cpp_extension.load`` (g++ and ninja) the
first time a process needs it and loads it as a library of torch operators (``torch.ops.seqlab_scan``, no
Python binding to compile). The build is cached on disk, so later processes only load it:

* where: ``$TORCH_EXTENSIONS_DIR/seqlab`` if that is set, else ``$XDG_CACHE_HOME/seqlab/kernels`` (by default
  ``~/.cache/seqlab/kernels``), one folder per build name;
* the build name is the cache key: the kernel, the vector instruction set, the Python and torch versions and
  a digest of the sources and flags (``seqlab_scan_avx2_py311_torch2_13_0_3f9a0c21d4``), so two seqlab
  versions on one machine keep a build each instead of rebuilding over each other.

Instruction set: ``-O3`` plus the vector extensions torch itself dispatches to on this CPU
(``torch.backends.cpu.get_cpu_capability()``: ``-mavx2 -mfma`` for AVX2, the AVX-512 subsets for AVX512,
nothing beyond the baseline otherwise), never ``-march=native``. A cache shared between machines (a home
directory on NFS, a container image) then holds one build per instruction set, each of which runs on every
CPU that reports that capability, instead of a binary tuned for whichever CPU built it first, which can die
with SIGILL on another. The loops are written for the compiler's auto-vectorizer (``#pragma omp simd``).

A missing compiler or ninja, or a failed build, is reported once as a warning with the reason, and the
callers take their PyTorch path (:func:`kernel_unavailable` gives the reason). ``build_info()`` tells how long
the build or load took and whether it came from the cache, for benchmarks to print.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from seqlab.kernels import cache

__all__ = [
    "ISA_FLAGS",
    "BuildInfo",
    "build_info",
    "cache_root",
    "kernel_unavailable",
    "library",
    "library_path",
    "load_kernel",
    "missing_tool",
]

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("selective_scan.cpp")
ISA_FLAGS = {  # the vector extensions torch itself dispatches to on this CPU (never -march=native)
    "AVX2": ["-mavx2", "-mfma"],
    "AVX512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw"],
}


@dataclass(frozen=True)
class BuildInfo:
    """How the kernel library was obtained in this process."""

    name: str
    """The build name, which is the cache key (kernel, instruction set, Python and torch versions)."""
    loaded: bool
    cached: bool
    """True when an earlier process's build was loaded without compiling."""
    seconds: float
    """Wall time of the build (or of the load alone, when cached)."""
    flags: tuple[str, ...]
    path: str
    reason: str | None = None
    """Why the kernel is unavailable; None when it loaded."""


_lock = threading.Lock()
_info: BuildInfo | None = None  # set once per process by load_kernel


def cache_root() -> Path:
    """Where every compiled kernel is kept: ``$TORCH_EXTENSIONS_DIR/seqlab``, else ``$XDG_CACHE_HOME/seqlab/kernels``
    (by default ``~/.cache/seqlab/kernels``), one folder per build name."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "seqlab"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "seqlab" / "kernels"


def library_path(name: str) -> Path:
    """The library a build named ``name`` leaves in the cache."""
    return cache_root() / name / f"{name}.so"


def library() -> Path:
    """The selective scan's library on this machine (present once built)."""
    return library_path(_build_name_and_flags()[0])


def abi_tag() -> str:
    """``py311_torch2_13_0``: a library is built against one Python and one torch and imports into no other
    (a cache shared by two environments keeps one build for each)."""
    version = torch.__version__.split("+")[0].replace(".", "_")
    return f"py{sys.version_info.major}{sys.version_info.minor}_torch{version}"


def _build_name_and_flags() -> tuple[str, list[str]]:
    capability = torch.backends.cpu.get_cpu_capability()
    isa = "".join(ch for ch in capability.lower() if ch.isalnum()) or "default"
    # -fno-tree-pre: GCC's partial redundancy elimination turns the clamp in the kernel's exp into branches,
    # which stops the vectorizer (other compilers ignore the flag with a warning)
    flags = ["-O3", "-fopenmp", "-fno-tree-pre", *ISA_FLAGS.get(capability, [])]
    return f"seqlab_scan_{isa}_{abi_tag()}_{sources_digest(flags)[:10]}", flags


def missing_tool() -> str | None:
    """Why no C++ kernel can be built here (no compiler, no ninja), or None."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on PATH (install g++, or set CXX)"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def sources_digest(flags: list[str]) -> str:
    """SHA-256 of the scan's source, the header it includes and the flags: what a recorded library was built
    from (checked again at load, so a library edited or replaced in place is never imported)."""
    text = b"".join(p.read_bytes() for p in (SOURCE, SOURCE.with_name("vec_math.h")))
    return hashlib.sha256(text + " ".join(flags).encode()).hexdigest()


class _NoTool(RuntimeError):
    """No compiler or no ninja: nothing can be built here."""


def _compile(name: str, flags: list[str], folder: Path) -> None:
    """Load the operator library: as it is when the cache records it as built from these sources and flags
    (nothing written: a read-only cache works), else built (or found up to date) by torch's ``load``; raises on
    any failure."""
    library = folder / f"{name}.so"
    sources = sources_digest(flags)
    if not cache.recorded(library, sources):
        if (reason := missing_tool()) is not None:
            raise _NoTool(reason)
        folder.mkdir(parents=True, exist_ok=True)
        if not cache.ready_after_wait(library, sources):  # else another process built it meanwhile
            _torch_load(name, flags, library, sources)
            return
    torch.ops.load_library(str(library))


def unversioned(name: str) -> str:
    """``name``, with torch's in-process versioning of it forgotten before a build: torch names a second build of
    one name in a process (another folder, a damaged library rebuilt) ``<name>_v1``, a library no cache lookup
    finds. seqlab's names already change with every source and flag, so the version adds nothing."""
    from torch.utils import cpp_extension

    getattr(cpp_extension.JIT_EXTENSION_VERSIONER, "entries", {}).pop(name, None)
    return name


def _torch_load(name: str, flags: list[str], library: Path, sources: str) -> None:
    """torch's ``load``: builds the library under its lock (or finds it up to date) and loads it; recorded."""
    from torch.utils.cpp_extension import load

    load(
        name=unversioned(name),
        sources=[str(SOURCE)],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(library.parent),
        is_python_module=False,
        verbose=False,
    )
    cache.record(library, sources)


def _first_error(e: Exception) -> str:
    """The compiler's first error line if the message has one (cpp_extension puts the whole log in it)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    return next((line for line in lines if "error:" in line), lines[0])[:300]


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None


def _build() -> BuildInfo:
    name, flags = _build_name_and_flags()
    library = library_path(name)
    folder = library.parent
    start, before = time.perf_counter(), _mtime(library)
    reason = None
    try:
        _compile(name, flags, folder)
    except _NoTool as e:
        reason = str(e)
    except Exception as e:  # a compiler error, a linker error, a bad cache folder: all mean "no kernel"
        log.debug("building %s failed", name, exc_info=True)
        reason = f"the build failed ({_first_error(e)})"
    seconds = time.perf_counter() - start
    cached = reason is None and before is not None and _mtime(library) == before
    return BuildInfo(name, reason is None, cached, seconds, tuple(flags), str(library), reason)


# every kernel by the name SEQLAB_DISABLE_KERNELS knows it by: the C++ file's stem ("scan" for this one), and
# "gemm", seqlab.kernels.gemm's oneDNN products (no C++ of seqlab's)
KERNEL_NAMES = (
    "scan",
    "recurrent",
    "decode",
    "activations",
    "causal_conv",
    "layer_norm",
    "gated_norm",
    "attention",
    "mingru_scan",
    "linear_attention",
    "additive_score",
    "gemm",
)


def disabled_reason(name: str) -> str | None:
    """Why the kernel ``name`` is switched off by ``SEQLAB_DISABLE_KERNELS`` (``all``, or a comma-separated list
    of ``KERNEL_NAMES``), or None. Read at every call, so that a process can switch a kernel off and on; then
    the code that kernel stands in for runs (torch's ops), as when no compiler is present."""
    value = os.environ.get("SEQLAB_DISABLE_KERNELS", "").strip()
    if not value:
        return None
    names = {n.strip() for n in value.split(",") if n.strip()}
    if unknown := names - {"all", *KERNEL_NAMES}:
        raise ValueError(
            f"SEQLAB_DISABLE_KERNELS={value!r} names no kernel {sorted(unknown)}; expected 'all' or a "
            f"comma-separated list of {', '.join(KERNEL_NAMES)}"
        )
    return f"switched off by SEQLAB_DISABLE_KERNELS={value}" if "all" in names or name in names else None


def load_kernel() -> bool:
    """Build or load the kernels once per process; True when they are usable. Logs the cost (info) or, once,
    why they are not (warning). False, without building, while SEQLAB_DISABLE_KERNELS switches the scan off."""
    global _info
    if disabled_reason("scan") is not None:
        return False
    with _lock:
        if _info is None:
            _info = _build()
            if _info.loaded:
                how = "loaded from the cache" if _info.cached else "compiled"
                log.info("seqlab kernels %s in %.1f s (%s): %s", how, _info.seconds, _info.name, _info.path)
            else:
                log.warning(
                    "seqlab's C++ selective-scan kernel is unavailable: %s; the chunked PyTorch scan is used",
                    _info.reason,
                )
    return _info.loaded


def kernel_unavailable() -> str | None:
    """None when the kernels load (building them on first call), else the reason."""
    if (reason := disabled_reason("scan")) is not None:
        return reason
    return None if load_kernel() else _info.reason


def build_info() -> BuildInfo | None:
    """How this process got the kernels; None before anything asked for them."""
    return _info
