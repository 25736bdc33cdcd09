"""Weight maps between seqlab and other libraries: ``from_torch`` converts torch.nn modules to seqlab's,
``from_hf`` Hugging Face models to seqlab's, ``to_hf`` / ``save_hf`` seqlab models to Hugging Face's."""

from seqlab.interop.hf import from_hf
from seqlab.interop.hf_export import save_hf, to_hf
from seqlab.interop.torch import from_torch

__all__ = ["from_hf", "from_torch", "save_hf", "to_hf"]
