"""Hugging Face ``MambaForCausalLM`` -> seqlab ``LM`` with the Mamba mixer.

HF's model is the shared backbone with no channel mixer, so the map is a renaming:

    backbone.embeddings.weight         -> embed.weight
    backbone.layers.{i}.norm.weight    -> blocks.{i}.norm1.weight     (RMSNorm, eps layer_norm_epsilon)
    backbone.layers.{i}.mixer.{name}   -> blocks.{i}.mixer.{name}     (same names: in_proj, conv1d,
                                                                      x_proj, dt_proj, A_log, D, out_proj)
    backbone.norm_f.weight             -> norm.weight
    lm_head.weight                     -> head.weight                 (tied to the embedding by default)

HF's block is ``residual + mixer(norm(x))`` with the residual kept in float32 (``residual_in_fp32``), which is
what seqlab's pre-norm block does in float32. Configurations seqlab's Mamba cannot express (biases on
in_proj/out_proj, no conv bias, an activation other than SiLU, an intermediate size other than expand · d)
are rejected with the field to change.
"""

from __future__ import annotations

import torch
from torch import nn

from seqlab.models.lm import LM, LMConfig

__all__ = ["convert_mamba", "mamba_config"]


def mamba_config(hf_config) -> LMConfig:
    """The LMConfig equivalent to a transformers ``MambaConfig``."""
    c = hf_config
    checks = [
        (not c.use_bias, "use_bias=True (biases on in_proj/out_proj)"),
        (c.use_conv_bias, "use_conv_bias=False"),
        (c.hidden_act == "silu", f"hidden_act={c.hidden_act!r} (seqlab's Mamba uses SiLU)"),
        (c.intermediate_size == c.expand * c.hidden_size, "intermediate_size != expand * hidden_size"),
    ]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"cannot convert this MambaConfig: seqlab's Mamba does not support {what}")
    return LMConfig(
        mixer="mamba",
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        d_ff=0,
        norm="rmsnorm",
        norm_eps=c.layer_norm_epsilon,
        tie_weights=bool(getattr(c, "tie_word_embeddings", True)),
        mixer_config={
            "d_state": c.state_size,
            "d_conv": c.conv_kernel,
            "expand": c.expand,
            "dt_rank": int(c.time_step_rank),
        },
    )


def _rename(key: str) -> str:
    if key == "lm_head.weight":
        return "head.weight"
    key = key.removeprefix("backbone.")
    if key == "embeddings.weight":
        return "embed.weight"
    if key == "norm_f.weight":
        return "norm.weight"
    if key.startswith("layers."):
        _, i, rest = key.split(".", 2)
        return f"blocks.{i}.{'norm1' if rest.startswith('norm.') else 'mixer'}.{rest.split('.', 1)[1]}"
    raise KeyError(f"unexpected key in MambaForCausalLM state dict: {key!r}")


@torch.no_grad()
def convert_mamba(hf_model: nn.Module) -> LM:
    """A seqlab LM with a copy of the weights of a transformers ``MambaForCausalLM``, on its device/dtype."""
    config = mamba_config(hf_model.config)
    ref = next(hf_model.parameters())
    model = LM(config, device=torch.device("meta"))
    state = {_rename(k): v for k, v in hf_model.state_dict().items()}
    if config.tied:
        state.setdefault("head.weight", state["embed.weight"])
    model = model.to_empty(device=ref.device).to(ref.dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if config.tied:
        model.head.weight = model.embed.weight  # to_empty() unties; tie again
        missing = [k for k in missing if k != "head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"MambaForCausalLM conversion: missing {missing}, unexpected {unexpected}")
    return model.train(hf_model.training)
