"""Every kernel source is C++17: torch.utils.cpp_extension built extensions as C++17 up to torch 2.11 at least
(seqlab takes torch >= 2.6), as C++20 by 2.13. A C++20 call (std::bit_cast) built under torch 2.13 and failed
under 2.11, so GRU and RNN fell back to torch.nn there. Syntax only: no library is built."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import seqlab.kernels
from seqlab.kernels.build import ISA_FLAGS

KERNELS = Path(seqlab.kernels.__file__).parent


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to check the kernels with")
def test_every_kernel_source_is_cpp17():
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in (*include_paths(), sysconfig.get_paths()["include"], KERNELS)]
    sources = sorted(KERNELS.glob("*.cpp"))
    assert len(sources) >= 7, sources
    # the sources branch on __AVX512F__ alone: the baseline build and the AVX-512 one (AVX2 adds no branch)
    builds = [(source, isa) for source in sources for isa in ("DEFAULT", "AVX512")]

    def check(build: tuple[Path, str]) -> tuple[str, int, str]:
        source, isa = build
        argv = ["c++", "-std=c++17", "-fsyntax-only", "-fopenmp", "-w", *ISA_FLAGS.get(isa, []), *includes]
        done = subprocess.run([*argv, str(source)], capture_output=True, text=True, timeout=300)
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        return f"{source.name} ({isa})", done.returncode, "\n".join(errors[:5]) or done.stderr[-800:]

    probe = subprocess.run(  # torch's own headers: C++17 through torch 2.13, C++20 from 2.14
        ["c++", "-std=c++17", "-fsyntax-only", "-w", *includes, "-x", "c++", "-"],
        input="#include <torch/extension.h>\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        pytest.skip(
            f"torch {torch.__version__}'s headers need C++20, as its builds use: nothing to check here"
        )
    with ThreadPoolExecutor(2) as pool:
        failed = [(name, err) for name, rc, err in pool.map(check, builds) if rc != 0]
    assert not failed, failed
