"""Keep freed memory in a training process instead of handing it back to the OS after every step.

PyTorch's CPU tensors come from the C library's malloc. glibc serves a request above its mmap threshold with a
fresh mapping and, when the free space at the top of the heap exceeds its trim threshold, returns it to the OS.
Both thresholds adapt upwards only to 32 MB and 2 x that, so a training step whose temporaries are several MB
each (Mamba's scan buffers, (b, chunk, n, d)) gets new pages every step, and the kernel faults and zero-fills
each of them. Raising the thresholds makes malloc reuse the memory it already has, as PyTorch's CPU
performance guide gets by preloading jemalloc or tcmalloc.

Measured on one core (Mamba LM, d_model 60, 2 layers, batch 32 x 72 tokens, the lab's selective-copying run):
a training step 119 -> 112 ms, the selective scan's fwd+bwd 45 -> 39 ms and its page faults 5,900 -> about
100 per call (with 32-position chunks, whose buffers are 8 MB: 190 -> 148-153 ms per step, 22,000 -> 0
faults); the lab's LSTM and a 4 x 256 GPT were unchanged there. On a 2-core Intel Xeon VM, whose page faults
cost about 1.5 us a page, three alternating pairs of processes each: the ViT benchmark's step (fashion, batch 128)
261-278 -> 245-254 ms and its faults 3,400-8,800 -> 400-800 per step; the GPT benchmark's (4 x 256, batch 16)
406-410 -> 381-389 ms, faults 6,400-9,200 -> 400-1,000. The cost is that the process keeps its peak heap until it
exits, which a training run reaches anyway. (The benchmarks comparing seqlab with Hugging Face leave malloc as it
is for both.)

``seqlab train`` and ``seqlab compare`` (and the lab's worker processes) call :func:`keep_freed_memory`;
library code never does, because the setting belongs to the whole process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_applied = False


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when applied (Linux with glibc only)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # another C library (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
    return _applied
