"""Hugging Face transformers -> seqlab: ``from_hf(model)`` returns the seqlab model with the same weights.

    from transformers import MambaConfig, MambaForCausalLM
    from seqlab.interop import from_hf

    ours = from_hf(MambaForCausalLM(MambaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2)))

``CONVERTERS`` maps a transformers class name to its converter; dispatch is on the name, so transformers is
never imported here (it is an optional extra: ``pip install seqlab[hf]``), and each converter module imports
only seqlab. Supported now: MambaForCausalLM, Mamba2ForCausalLM, GPT2LMHeadModel, LlamaForCausalLM,
BertModel, ViTModel, ViTForImageClassification.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from seqlab.interop.hf_bert import convert_bert
from seqlab.interop.hf_gpt2 import convert_gpt2
from seqlab.interop.hf_llama import convert_llama
from seqlab.interop.hf_mamba import convert_mamba
from seqlab.interop.hf_vit import convert_vit

__all__ = ["CONVERTERS", "from_hf"]

CONVERTERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "MambaForCausalLM": convert_mamba,
    "Mamba2ForCausalLM": convert_mamba,
    "GPT2LMHeadModel": convert_gpt2,
    "LlamaForCausalLM": convert_llama,
    "BertModel": convert_bert,
    "ViTModel": convert_vit,
    "ViTForImageClassification": convert_vit,
}


def from_hf(model: nn.Module) -> nn.Module:
    """The seqlab equivalent of a transformers model, holding a copy of its weights."""
    name = type(model).__name__
    if name not in CONVERTERS:
        raise ValueError(f"from_hf cannot convert {name}; supported: {', '.join(sorted(CONVERTERS))}")
    return CONVERTERS[name](model)
