"""Hugging Face ``MambaForCausalLM`` and ``Mamba2ForCausalLM`` -> seqlab ``LM`` with the Mamba or Mamba-2 mixer.

HF's models are the shared backbone with no channel mixer, so the map is a renaming:

    backbone.embeddings.weight         -> embed.weight
    backbone.layers.{i}.norm.weight    -> blocks.{i}.norm1.weight     (RMSNorm, eps layer_norm_epsilon)
    backbone.layers.{i}.mixer.{name}   -> blocks.{i}.mixer.{name}     (same names: in_proj, conv1d,
                                                                      x_proj, dt_proj, A_log, D, out_proj;
                                                                      Mamba-2: dt_bias, norm.weight too)
    backbone.norm_f.weight             -> norm.weight
    lm_head.weight                     -> head.weight                 (tied to the embedding by default)

HF's block is ``residual + mixer(norm(x))`` with the residual kept in float32 (``residual_in_fp32``), which is
what seqlab's pre-norm block does in float32. Configurations seqlab's Mamba cannot express (biases on
in_proj/out_proj, no conv bias, an activation other than SiLU, an intermediate size other than expand · d;
for Mamba-2 a head count other than expand · d / head_dim, or a limit on Δ) are rejected with the field to
change. Mamba-2's ``chunk_size`` is a kernel setting, not the model's: seqlab's scan needs none.
"""

from __future__ import annotations

import torch
from torch import nn

from seqlab.models.lm import LM, LMConfig

__all__ = ["convert_mamba", "mamba2_config", "mamba_config"]


def _refuse(what: str, checks: list[tuple[bool, str]]) -> None:
    for ok, field in checks:
        if not ok:
            raise ValueError(f"cannot convert this {what}: seqlab's mixer does not support {field}")


def _common_checks(c) -> list[tuple[bool, str]]:
    return [
        (not c.use_bias, "use_bias=True (biases on in_proj/out_proj)"),
        (c.use_conv_bias, "use_conv_bias=False"),
        (c.hidden_act == "silu", f"hidden_act={c.hidden_act!r} (seqlab's Mamba blocks use SiLU)"),
    ]


def _lm_config(c, mixer: str, mixer_config: dict) -> LMConfig:
    return LMConfig(
        mixer=mixer,
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        d_ff=0,
        norm="rmsnorm",
        norm_eps=c.layer_norm_epsilon,
        tie_weights=bool(getattr(c, "tie_word_embeddings", True)),
        mixer_config=mixer_config,
    )


def mamba_config(hf_config) -> LMConfig:
    """The LMConfig equivalent to a transformers ``MambaConfig``."""
    c = hf_config
    inner = (c.intermediate_size == c.expand * c.hidden_size, "intermediate_size != expand * hidden_size")
    _refuse("MambaConfig", [*_common_checks(c), inner])
    fields = {
        "d_state": c.state_size,
        "d_conv": c.conv_kernel,
        "expand": c.expand,
        "dt_rank": int(c.time_step_rank),
    }
    return _lm_config(c, "mamba", fields)


def mamba2_config(hf_config) -> LMConfig:
    """The LMConfig equivalent to a transformers ``Mamba2Config``."""
    c = hf_config
    heads = c.expand * c.hidden_size // c.head_dim
    lo, hi = c.time_step_limit
    _refuse(
        "Mamba2Config",
        [
            *_common_checks(c),
            (
                c.num_heads == heads,
                f"num_heads={c.num_heads} other than expand * hidden_size / head_dim = {heads}",
            ),
            (
                lo == 0.0 and hi == float("inf"),
                f"time_step_limit={tuple(c.time_step_limit)} (Δ is not clamped)",
            ),
        ],
    )
    fields = {"d_state": c.state_size, "d_conv": c.conv_kernel, "expand": c.expand, "headdim": c.head_dim}
    return _lm_config(c, "mamba2", {**fields, "n_groups": c.n_groups, "norm_eps": c.layer_norm_epsilon})


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
    raise KeyError(f"unexpected key in a Mamba state dict: {key!r}")


@torch.no_grad()
def convert_mamba(hf_model: nn.Module) -> LM:
    """A seqlab LM with a copy of the weights of a transformers ``MambaForCausalLM`` or ``Mamba2ForCausalLM``, on
    its device and dtype."""
    config = (mamba2_config if hf_model.config.model_type == "mamba2" else mamba_config)(hf_model.config)
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
        raise RuntimeError(
            f"{type(hf_model).__name__} conversion: missing {missing}, unexpected {unexpected}"
        )
    return model.train(hf_model.training)
