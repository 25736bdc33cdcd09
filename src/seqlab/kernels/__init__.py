"""seqlab's compiled kernels: C++ built on first use (``build``), each behind a Python function with the
signature of the PyTorch code it speeds up. This package imports torch only; the layers import it.

* :func:`selective_scan_kernel`: Mamba's selective scan on the CPU, forward and backward, fused.
* ``triton_scan.selective_scan_triton``: the same scan on CUDA tensors, as Triton kernels (imported on use).
"""

from seqlab.kernels.build import BuildInfo, build_info, cache_root, kernel_unavailable, load_kernel
from seqlab.kernels.selective_scan import DEFAULT_CHUNK, selective_scan_kernel, why_not_kernel

__all__ = [
    "DEFAULT_CHUNK",
    "BuildInfo",
    "build_info",
    "cache_root",
    "kernel_unavailable",
    "load_kernel",
    "selective_scan_kernel",
    "why_not_kernel",
]
