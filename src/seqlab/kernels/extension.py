"""Compiling one of seqlab's pybind C++ kernels on first use, caching it across processes, saying what it cost.

Each kernel is one source file beside this module (``recurrent.cpp``, ``decode.cpp``, ``activations.cpp``,
``causal_conv.cpp``, ``mingru_scan.cpp``, ``linear_attention.cpp``, ``layer_norm.cpp``, ``gated_norm.cpp``,
``attention.cpp``, ``additive_score.cpp``) wrapped
by a :class:`CppExtension`. Its first ``load()`` in a process builds the file with
``torch.utils.cpp_extension.load`` (g++ and ninja) or, when an earlier process built it, only imports it;
``build_info()`` says which and how long. (The selective scan, a library of torch operators rather than a
pybind module, has its own loader in ``build.py``.)

* where (``build.cache_root``, shared with the scan): ``$TORCH_EXTENSIONS_DIR/seqlab`` if set, else
  ``$XDG_CACHE_HOME/seqlab/kernels`` (by default ``~/.cache/seqlab/kernels``), in a folder
  ``seqlab_<stem>_<isa>_<python and torch versions>_<hash of the sources and flags>``, so an edited source builds
  afresh, and so does another Python or torch (a library built against one imports into no other);
* instruction set: ``-O3`` plus the vector extensions torch itself dispatches to on this CPU, never
  ``-march=native``: a cache shared between machines then holds one build per instruction set, each runnable
  wherever that set is. ``-fno-trapping-math`` lets the clamps in the polynomial exp become vector min/max
  (without it those loops stay scalar), and ``-fno-tree-pre`` keeps GCC's partial redundancy elimination from
  turning them back into branches (4.5x on the GELU loop); neither flag changes a result.

When a kernel cannot be built (no compiler, no ninja, a compile error, a broken cache), ``load()`` warns once,
naming the reason and what is used instead, and returns None; its callers then take their PyTorch path.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

from seqlab.kernels import cache
from seqlab.kernels.build import (
    ISA_FLAGS,
    abi_tag,
    disabled_reason,
    library_path,
    missing_tool,
    unversioned,
)

__all__ = [
    "CppExtension",
    "cpu_float_reason",
    "cpu_float_reason_of",
    "matmul_dtype",
    "spaced_rows",
    "with_spaced_rows",
]

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


def cpu_float_reason(x: torch.Tensor, bf16: bool = False) -> str | None:
    """Why a C++ kernel here cannot take x, as far as all of them care (a float32 or float64 CPU tensor; with
    ``bf16``, for a kernel that also takes bfloat16, torch.autocast's CPU dtype, computing in float32), or None."""
    return cpu_float_reason_of(x.device, x.dtype, bf16=bf16)


def cpu_float_reason_of(
    device: torch.device, dtype: torch.dtype, name: str = "x", bf16: bool = False
) -> str | None:
    """:func:`cpu_float_reason` for a tensor not made yet, known by its device and dtype."""
    if device.type != "cpu":
        return f"the kernel runs on the CPU, {name} is on {device.type}"
    if dtype not in (torch.float32, torch.float64) and not (bf16 and dtype == torch.bfloat16):
        return f"the kernel takes float32 or float64{' (or bfloat16)' if bf16 else ''}, {name} is {dtype}"
    return None


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer gives for input x: autocast's lower precision where torch.autocast is on for x's
    device (its outputs are what a kernel after the projection receives), else x's own dtype."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def spaced_rows(x: torch.Tensor) -> bool:
    """(b, t, m) with a contiguous last dimension and evenly spaced rows: the views of a wider projection output
    (Mamba's in_proj and x_proj halves) that the scan and causal-conv kernels read in place."""
    return (
        x.dim() == 3
        and x.stride(2) == 1
        and x.stride(1) >= x.size(2)
        and x.stride(0) == x.size(1) * x.stride(1)
    )


def with_spaced_rows(x: torch.Tensor) -> torch.Tensor:
    """x (b, t, m) itself when :func:`spaced_rows`, else a copy that is: ``x.contiguous()`` is not enough, since
    torch calls a tensor contiguous whatever the strides of its size-1 dimensions (a batch of 1 cut from a
    time-major tensor), and the kernels read those strides."""
    return x if spaced_rows(x) else x.clone(memory_format=torch.contiguous_format)


def _first_error(e: Exception) -> str:
    """The compiler's first ``error:`` line when there is one, else the exception's first line."""
    lines = str(e).strip().splitlines() or [""]
    found = [line for line in lines if "error:" in line]
    return f"{type(e).__name__}: {(found or lines)[0].strip()[:300]}"


def _import_extension(name: str, library: Path) -> ModuleType:
    """The pybind module in ``library`` (built as ``name``), imported without torch's build step."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CppExtension:
    """The kernel in ``<stem>.cpp`` (plus the headers it includes, listed in ``headers``), built on first use.

    ``what`` names it in messages ("fused recurrent kernel"); ``instead`` says what runs without it; ``label``
    names what it serves in ``seqlab doctor``'s list ("GRU / RNN / LSTM").
    """

    def __init__(
        self,
        stem: str,
        what: str,
        instead: str,
        headers: tuple[str, ...] = (),
        openmp: bool = False,
        *,
        label: str,
    ):
        self.source = HERE / f"{stem}.cpp"
        self.stem, self.what, self.instead, self.label = stem, what, instead, label
        self.headers = tuple(HERE / h for h in headers)
        self.openmp = openmp
        self._lock = threading.Lock()
        self._loaded: dict[str, object] = {}  # "module" (or None after a failure) and "info", once tried

    def name_and_flags(self) -> tuple[str, list[str]]:
        """``seqlab_<stem>_<isa>_<python and torch>_<hash of sources and flags>`` and the compiler flags for this
        CPU."""
        isa = torch.backends.cpu.get_cpu_capability()  # "AVX2", "AVX512", "DEFAULT", ...
        flags = ["-O3", "-fno-trapping-math", "-fno-tree-pre", *ISA_FLAGS.get(isa, [])]
        flags += ["-fopenmp"] if self.openmp else []
        text = b"".join(p.read_bytes() for p in (self.source, *self.headers)) + " ".join(flags).encode()
        digest = hashlib.sha256(text).hexdigest()[:10]
        return f"seqlab_{self.stem}_{isa.lower()}_{abi_tag()}_{digest}", flags

    def library(self) -> Path:
        """This kernel's library on this machine (present once built)."""
        return library_path(self.name_and_flags()[0])

    def _compile(self) -> tuple[ModuleType, dict]:
        """Build (or load from the cache) the extension; return it with what the build cost.

        A library recorded by the process that built it (``cache``) is imported as it is, writing nothing (a
        read-only cache works); otherwise torch's ``load`` builds it, or finds it up to date, under its lock."""
        name, flags = self.name_and_flags()
        library = library_path(name)
        directory = library.parent
        start = time.perf_counter()
        if not cache.recorded(library, name):  # the name holds the digest of the sources and flags
            if (reason := missing_tool()) is not None:
                raise RuntimeError(reason)
            directory.mkdir(parents=True, exist_ok=True)
            if not cache.ready_after_wait(library, name):  # else another process built it meanwhile
                return self._build(name, flags, library, start)
        module = _import_extension(name, library)
        return module, {"seconds": time.perf_counter() - start, "cached": True, "directory": str(directory)}

    def _build(self, name: str, flags: list[str], library: Path, start: float) -> tuple[ModuleType, dict]:
        """torch's ``load``: builds the library under its lock (or finds it up to date), imports it, and the
        library is recorded."""
        from torch.utils.cpp_extension import load  # imported here: it is slow and only needed once

        before = library.stat().st_mtime_ns if library.exists() else None
        module = load(
            unversioned(name),
            [str(self.source)],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"] if self.openmp else [],
            extra_include_paths=[str(HERE)],
            build_directory=str(library.parent),
            verbose=False,
        )
        cached = before is not None and library.stat().st_mtime_ns == before
        cache.record(library, name)
        return module, {
            "seconds": time.perf_counter() - start,
            "cached": cached,
            "directory": str(library.parent),
        }

    def load(self, even_if_disabled: bool = False) -> ModuleType | None:
        """The compiled module, built on the first call of the process; None (after one warning) if it cannot be,
        and None (silently, nothing built) while SEQLAB_DISABLE_KERNELS switches it off, unless
        ``even_if_disabled``: a backward whose forward ran the kernel needs it, whatever the switch says now."""
        if disabled_reason(self.stem) is not None and not (even_if_disabled and "module" in self._loaded):
            return None
        if "module" in self._loaded:
            return self._loaded["module"]  # type: ignore[return-value]
        with self._lock:
            if "module" not in self._loaded:
                try:
                    module, info = self._compile()
                except Exception as e:  # every failure means "use the PyTorch path"
                    module, info = None, {"error": _first_error(e)}
                    warnings.warn(
                        f"seqlab's {self.what} could not be built ({info['error']}); {self.instead}",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                else:
                    how = "loaded from the cache" if info["cached"] else "built"
                    log.info(
                        "seqlab's %s %s in %.1f s (%s)", self.what, how, info["seconds"], info["directory"]
                    )
                self._loaded["info"], self._loaded["module"] = info, module
        return self._loaded["module"]  # type: ignore[return-value]

    def unbuilt_reason(self) -> str | None:
        """None once the kernel is loaded (building it on the first call), else why it could not be built (or why
        it is switched off)."""
        if (reason := disabled_reason(self.stem)) is not None:
            return reason
        if self.load() is None:
            return f"the kernel could not be built: {self.build_info()['error']}"
        return None

    def build_info(self) -> dict | None:
        """After ``load()``: ``{"seconds", "cached", "directory"}``, or ``{"error"}`` when the build failed; None
        before the first load. ``seconds`` is the whole ``load`` call: compile and link when ``cached`` is
        False, only the up-to-date check and import when it is True."""
        return self._loaded.get("info")  # type: ignore[return-value]
