"""The float32 decoding step of a pre-norm attention LM as one C++ call (the C++ is ``decode.cpp``).

:class:`seqlab.models.gpt_decode.StaticCacheDecoder` steps through this kernel when it loads and the model is
float32 on the CPU; otherwise (float64, another device, no compiler) it runs the same arithmetic as torch ops.
The kernel is built on first use and cached like every seqlab kernel (``seqlab.kernels.extension``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqlab.kernels.extension import CppExtension

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["EXTENSION", "load_decode_kernel"]

EXTENSION = CppExtension(
    "decode",
    "fused decoding kernel",
    "attention LMs decode through torch's kernels instead",
    headers=("vec_math.h",),
    openmp=True,
    label="decoding step (GPT)",
)


def load_decode_kernel() -> ModuleType | None:
    """The compiled decoder module (its class ``Decoder``), or None after one warning when it cannot be built."""
    return EXTENSION.load()
