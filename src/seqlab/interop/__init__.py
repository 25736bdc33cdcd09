"""Weight maps between seqlab and other libraries: ``from_torch`` converts torch.nn modules to seqlab's."""

from seqlab.interop.hf import from_hf
from seqlab.interop.torch import from_torch

__all__ = ["from_hf", "from_torch"]
