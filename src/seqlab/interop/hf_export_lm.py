"""seqlab ``LM`` -> Hugging Face causal LMs: ``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``MambaForCausalLM``.

The inverse of ``hf_gpt2``, ``hf_llama`` and ``hf_mamba`` (their docstrings have the name tables, read right
to left here). Which class an attention LM becomes is decided by its position scheme, then every other field
is checked against that class:

    GPT-2 (GPT2LMHeadModel)     position='learned', rope=False, LayerNorm with biases, a GELU/ReLU MLP,
                                biases on the attention projections, n_kv_heads = n_heads, head_dim = d / h
    Llama (LlamaForCausalLM)    position='none', rope=True, RMSNorm, SwiGLU; GQA, head_dim and both bias
                                switches (attention_bias, mlp_bias) are free
    Mamba (MambaForCausalLM)    the 'mamba' mixer, no channel MLP, RMSNorm, position='none'
    Mamba2 (Mamba2ForCausalLM)  the 'mamba2' mixer, likewise

Anything else the target class would compute differently (a sliding window, an untied head with a bias, float
inputs) is a ValueError naming the field and the value it needs; nothing is exported approximately. Dropout
differences affect training only and are logged. GPT-2's ``Conv1D`` stores weights (in, out): every projection
weight is transposed on the way out, as it was on the way in.

transformers is imported inside the functions: it is an optional extra (``pip install 'seqlab[hf]'``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from seqlab.models.lm import LM

__all__ = [
    "build_hf",
    "export_gpt2",
    "export_llama",
    "export_lm",
    "export_mamba",
    "export_mamba2",
    "lm_hf_config",
    "refuse",
    "transformers_lib",
]

log = logging.getLogger(__name__)

_GPT2_ACT = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu", "relu": "relu"}


def transformers_lib():
    """The transformers module, or a MissingDependencyError that says how to install it."""
    try:
        import transformers
    except ImportError:  # pragma: no cover - depends on the environment
        from seqlab.tasks.base import MissingDependencyError

        raise MissingDependencyError(
            "exporting to Hugging Face needs transformers: pip install 'seqlab[hf]'"
        ) from None
    return transformers


def refuse(target: str, problems: list[tuple[bool, str]]) -> None:
    """A ValueError listing every ``what`` whose ``ok`` is False: the fields ``target`` cannot represent."""
    bad = [what for ok, what in problems if not ok]
    if bad:
        raise ValueError(f"cannot export this model as {target}: " + "; ".join(bad))


@torch.no_grad()
def build_hf(
    cls_name: str,
    hf_config,
    state: dict[str, Tensor],
    like: nn.Module,
    kwargs: dict[str, Any] | None = None,
    rename: Callable[[dict], dict] | None = None,
) -> nn.Module:
    """A transformers ``cls_name`` holding ``state`` (its own names), on ``like``'s device, dtype and mode.

    ``kwargs`` go to the class (``add_pooling_layer``); ``rename`` maps a dict keyed by the built model's
    names to the names ``state`` uses (so a map written for one transformers layout fills another).
    Every parameter must come from ``state`` and every tensor of ``state`` must land: anything else is a bug
    in the map, raised rather than left at its random initialization.
    """
    ref = next(like.parameters())
    hf = getattr(transformers_lib(), cls_name)(hf_config, **(kwargs or {}))
    hf = hf.to(device=ref.device, dtype=ref.dtype)
    if rename is not None:
        actual = rename({k: k for k in hf.state_dict()})  # {state's name: the model's name}
        state = {actual.get(k, k): v for k, v in state.items()}
    state = {k: v.detach().contiguous() for k, v in state.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    params = {name for name, _ in hf.named_parameters(remove_duplicate=False)}
    missing = [k for k in missing if k in params]  # a non-persistent buffer (position ids) is not a weight
    if missing or unexpected:
        raise RuntimeError(f"{cls_name} export map incomplete: missing {missing}, unexpected {unexpected}")
    return hf.train(like.training)


def _common_lm_checks(model: LM) -> list[tuple[bool, str]]:
    c = model.config
    return [
        (c.layout == "pre-norm", f"layout={c.layout!r} (needs 'pre-norm')"),
        (c.d_input is None, f"d_input={c.d_input} (needs token inputs, None)"),
        (c.d_output is None, f"d_output={c.d_output} (needs next-token outputs, None)"),
        (not c.head_bias, "head_bias=True (the LM head has no bias)"),
    ]


def _no_token_ids() -> dict[str, Any]:
    """Special-token ids left unset: the classes' defaults (GPT-2's 50256, Llama's 1 and 2) would be wrong."""
    return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


# ---- GPT-2 ----------------------------------------------------------------------------------------------------


def gpt2_hf_config(model: LM):
    """The ``GPT2Config`` of a GPT-2-shaped seqlab LM; a ValueError names every field GPT-2 lacks."""
    c, m = model.config, model.config.mixer_config
    n_kv, head_dim = m["n_kv_heads"], m["head_dim"]
    refuse(
        "GPT2LMHeadModel (learned positions, no RoPE)",
        [
            *_common_lm_checks(model),
            (c.norm == "layernorm", f"norm={c.norm!r} (needs 'layernorm')"),
            (c.bias, "bias=False (GPT-2's LayerNorms and MLP have biases)"),
            (m["bias"], "mixer_config.bias=False (GPT-2's attention projections have biases)"),
            (n_kv in (None, m["n_heads"]), f"n_kv_heads={n_kv} (GPT-2 has no grouped-query attention)"),
            (head_dim in (None, c.d_model // m["n_heads"]), f"head_dim={head_dim} (needs d_model / n_heads)"),
            (m["window"] is None, f"window={m['window']} (GPT-2 attends to the whole context)"),
            (c.mlp in _GPT2_ACT, f"mlp={c.mlp!r} (needs one of {sorted(_GPT2_ACT)})"),
            (c.ff_width > 0, "d_ff=0 (GPT-2's blocks have an MLP)"),
        ],
    )
    return transformers_lib().GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_seq_len,
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=m["n_heads"],
        n_inner=c.ff_width,
        activation_function=_GPT2_ACT[c.mlp],
        layer_norm_epsilon=model.norm.eps,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        tie_word_embeddings=c.tied,
        **_no_token_ids(),
    )


def gpt2_state(model: LM) -> dict[str, Tensor]:
    """seqlab LM tensors under ``GPT2LMHeadModel``'s names (Linear (out, in) -> Conv1D (in, out))."""
    sd = model.state_dict()
    out = {
        "transformer.wte.weight": sd["embed.weight"],
        "transformer.wpe.weight": sd["pos_embed.weight"],
        "transformer.ln_f.weight": sd["norm.weight"],
        "transformer.ln_f.bias": sd["norm.bias"],
        "lm_head.weight": sd["head.weight"],
    }
    pairs = [
        ("norm1", "ln_1", False),
        ("mixer.out_proj", "attn.c_proj", True),
        ("norm2", "ln_2", False),
        ("mlp.fc1", "mlp.c_fc", True),
        ("mlp.fc2", "mlp.c_proj", True),
    ]
    for i in range(model.config.n_layers):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        out[dst + "attn.c_attn.weight"] = sd[src + "mixer.in_proj_weight"].t()  # (3d, d) -> Conv1D (d, 3d)
        out[dst + "attn.c_attn.bias"] = sd[src + "mixer.in_proj_bias"]
        for a, b, conv in pairs:
            w = sd[src + a + ".weight"]
            out[dst + b + ".weight"] = w.t() if conv else w
            out[dst + b + ".bias"] = sd[src + a + ".bias"]
    return out


def export_gpt2(model: LM) -> nn.Module:
    """A ``GPT2LMHeadModel`` computing the same logits as ``model`` (GPT-2's layout)."""
    return build_hf("GPT2LMHeadModel", gpt2_hf_config(model), gpt2_state(model), model)


# ---- Llama ----------------------------------------------------------------------------------------------------


def _head_dim(model: LM) -> int:
    m = model.config.mixer_config
    return m["head_dim"] or model.config.d_model // m["n_heads"]


def llama_hf_config(model: LM):
    """The ``LlamaConfig`` of a Llama-shaped seqlab LM (RoPE, RMSNorm, SwiGLU); a ValueError names misfits."""
    c, m = model.config, model.config.mixer_config
    refuse(
        "LlamaForCausalLM (rotary positions)",
        [
            *_common_lm_checks(model),
            (c.position == "none", f"position={c.position!r} (Llama has no learned position table)"),
            (c.norm == "rmsnorm", f"norm={c.norm!r} (needs 'rmsnorm')"),
            (c.mlp == "swiglu", f"mlp={c.mlp!r} (needs 'swiglu')"),
            (c.ff_width > 0, "d_ff=0 (Llama's blocks have an MLP)"),
            (m["window"] is None, f"window={m['window']} (LlamaForCausalLM has no sliding window)"),
        ],
    )
    if c.dropout:
        log.warning(
            "dropout=%s: LlamaForCausalLM has attention dropout only (no embedding or residual dropout); "
            "the exported model computes the same logits, but would train with less dropout",
            c.dropout,
        )
    return transformers_lib().LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ff_width,
        num_hidden_layers=c.n_layers,
        num_attention_heads=m["n_heads"],
        num_key_value_heads=m["n_kv_heads"] or m["n_heads"],
        head_dim=_head_dim(model),
        hidden_act="silu",
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=model.norm.eps,
        rope_theta=float(m["rope_base"]),
        attention_bias=bool(m["bias"]),
        mlp_bias=bool(c.bias),
        attention_dropout=c.dropout,
        tie_word_embeddings=c.tied,
        **_no_token_ids(),
    )


def llama_state(model: LM) -> dict[str, Tensor]:
    """seqlab LM tensors under ``LlamaForCausalLM``'s names (the stacked [q; k; v] split in three)."""
    c, m = model.config, model.config.mixer_config
    sd, k = model.state_dict(), _head_dim(model)
    kv_rows = (m["n_kv_heads"] or m["n_heads"]) * k
    sizes = [m["n_heads"] * k, kv_rows, kv_rows]  # rows of W_q, W_k, W_v in in_proj_weight
    out = {
        "model.embed_tokens.weight": sd["embed.weight"],
        "model.norm.weight": sd["norm.weight"],
        "lm_head.weight": sd["head.weight"],
    }
    for i in range(c.n_layers):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        names = [dst + f"self_attn.{p}_proj" for p in "qkv"]
        for name, w in zip(names, sd[src + "mixer.in_proj_weight"].split(sizes), strict=True):
            out[name + ".weight"] = w  # (h k | g k | g k, d) -> three (rows, d)
        out[dst + "self_attn.o_proj.weight"] = sd[src + "mixer.out_proj.weight"]
        out[dst + "input_layernorm.weight"] = sd[src + "norm1.weight"]
        out[dst + "post_attention_layernorm.weight"] = sd[src + "norm2.weight"]
        for p in ("gate", "up", "down"):
            out[dst + f"mlp.{p}_proj.weight"] = sd[src + f"mlp.{p}.weight"]
            if c.bias:
                out[dst + f"mlp.{p}_proj.bias"] = sd[src + f"mlp.{p}.bias"]
        if m["bias"]:
            for name, b in zip(names, sd[src + "mixer.in_proj_bias"].split(sizes), strict=True):
                out[name + ".bias"] = b
            out[dst + "self_attn.o_proj.bias"] = sd[src + "mixer.out_proj.bias"]
    return out


def export_llama(model: LM) -> nn.Module:
    """A ``LlamaForCausalLM`` computing the same logits as ``model`` (RoPE, RMSNorm, SwiGLU, GQA)."""
    return build_hf("LlamaForCausalLM", llama_hf_config(model), llama_state(model), model)


# ---- Mamba ----------------------------------------------------------------------------------------------------


def _mamba_like(model: LM, hf_class: str, checks: list[tuple[bool, str]]) -> dict:
    """The config fields Mamba and Mamba-2 share, after refusing what ``hf_class`` lacks (its ``checks`` beside
    the shared ones)."""
    c, mixer, name = model.config, model.blocks[0].mixer, hf_class.removesuffix("ForCausalLM")
    refuse(
        hf_class,
        [
            *_common_lm_checks(model),
            (c.ff_width == 0, f"d_ff={c.ff_width} ({name}'s blocks have no channel MLP; needs d_ff=0)"),
            (c.norm == "rmsnorm", f"norm={c.norm!r} (needs 'rmsnorm')"),
            (c.position == "none", f"position={c.position!r} ({name} has no position table)"),
            (mixer.in_proj.bias is None, f"a {name} mixer with in_proj/out_proj biases"),
            (mixer.conv1d.bias is not None, f"a {name} mixer without a conv bias"),
            *checks,
        ],
    )
    if c.dropout:
        log.warning("dropout=%s: %s has no dropout (the logits are the same)", c.dropout, hf_class)
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        state_size=mixer.d_state,
        num_hidden_layers=c.n_layers,
        layer_norm_epsilon=model.norm.eps,
        expand=mixer.expand,
        conv_kernel=mixer.d_conv,
        use_bias=False,
        use_conv_bias=True,
        hidden_act="silu",
        tie_word_embeddings=c.tied,
        **_no_token_ids(),
    )


def mamba_hf_config(model: LM):
    """The ``MambaConfig`` of a seqlab Mamba LM; a ValueError names the fields MambaForCausalLM lacks."""
    fields = _mamba_like(model, "MambaForCausalLM", [])
    return transformers_lib().MambaConfig(**fields, time_step_rank=model.blocks[0].mixer.dt_rank)


def mamba_state(model: LM) -> dict[str, Tensor]:
    """seqlab Mamba LM tensors under ``MambaForCausalLM``'s names: a renaming, the mixers' names are HF's."""
    top = {
        "embed.weight": "backbone.embeddings.weight",
        "norm.weight": "backbone.norm_f.weight",
        "head.weight": "lm_head.weight",
    }
    out = {}
    for name, t in model.state_dict().items():
        if name.startswith("blocks."):
            _, i, part, rest = name.split(".", 3)  # blocks.{i}.{norm1|mixer}.{rest}
            name = f"backbone.layers.{i}.{'norm' if part == 'norm1' else 'mixer'}.{rest}"
        out[top.get(name, name)] = t
    return out


def export_mamba(model: LM) -> nn.Module:
    """A ``MambaForCausalLM`` computing the same logits as ``model``."""
    return build_hf("MambaForCausalLM", mamba_hf_config(model), mamba_state(model), model)


def mamba2_hf_config(model: LM):
    """The ``Mamba2Config`` of a seqlab Mamba-2 LM; a ValueError names the fields Mamba2ForCausalLM lacks."""
    mixer = model.blocks[0].mixer
    eps = (
        mixer.norm_eps == model.norm.eps,
        f"the gated norm's eps {mixer.norm_eps} other than the RMSNorms'",
    )
    fields = _mamba_like(model, "Mamba2ForCausalLM", [eps])
    return transformers_lib().Mamba2Config(
        **fields, head_dim=mixer.headdim, num_heads=mixer.n_heads, n_groups=mixer.n_groups
    )


def export_mamba2(model: LM) -> nn.Module:
    """A ``Mamba2ForCausalLM`` computing the same logits as ``model`` (the same renaming as Mamba's)."""
    return build_hf("Mamba2ForCausalLM", mamba2_hf_config(model), mamba_state(model), model)


def _lm_target(model: LM) -> str:
    """Which transformers class an LM exports as ('gpt2', 'llama', 'mamba' or 'mamba2'); a ValueError when none
    fits."""
    c = model.config
    if c.mixer in ("mamba", "mamba2"):
        return c.mixer
    if c.mixer != "attention":
        raise ValueError(
            f"cannot export an LM with the {c.mixer!r} mixer: transformers has no class for it; exportable LMs "
            "use the 'attention' mixer (as GPT2LMHeadModel or LlamaForCausalLM), the 'mamba' mixer "
            "(as MambaForCausalLM) or the 'mamba2' mixer (as Mamba2ForCausalLM)"
        )
    if c.mixer_config["rope"]:
        return "llama"
    if c.position != "learned":
        raise ValueError(
            f"cannot export this attention LM: it has no positions at all (rope=False, position={c.position!r});"
            " GPT2LMHeadModel needs position='learned', LlamaForCausalLM needs rope=True"
        )
    return "gpt2"


def lm_hf_config(model: LM):
    """The transformers config ``export_lm`` would write; needs no weights (a model on the meta device will do)."""
    configs = {
        "gpt2": gpt2_hf_config,
        "llama": llama_hf_config,
        "mamba": mamba_hf_config,
        "mamba2": mamba2_hf_config,
    }
    return configs[_lm_target(model)](model)


def export_lm(model: LM) -> nn.Module:
    """GPT-2, Llama, Mamba or Mamba-2, chosen by the mixer and the position scheme (module docstring)."""
    exporters = {"gpt2": export_gpt2, "llama": export_llama, "mamba": export_mamba, "mamba2": export_mamba2}
    return exporters[_lm_target(model)](model)
