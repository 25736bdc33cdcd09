"""Reading what seqlab 0.1 wrote: checkpoints of the GPT, RNNLM and flat-config LM models.

Before the one-stack LM (``seqlab.models.lm``), causal LMs came in three families with their own configs and
weight names. A checkpoint's ``config.json`` names its family; :func:`upgrade_config` turns the three old
configs into today's ``LMConfig`` fields, and :func:`rename_legacy_keys` (a load_state_dict pre-hook of
``LM``) renames the weights, so ``seqlab generate --checkpoint OLD_RUN`` and ``load_model`` keep working:

    GPT     tok_embed.*            -> embed.*            blocks.{i}.attn.*  -> blocks.{i}.mixer.*
    RNNLM   rnn.{w}_l{k}[_reverse] -> blocks.{k}.mixer.{w}_l0[_reverse]     (one stacked layer per block)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from seqlab.layers.mixer import mixer_spec

__all__ = ["LEGACY_FAMILIES", "rename_legacy_keys", "upgrade_config"]

LEGACY_FAMILIES = ("gpt", "rnn_lm")
_OLD_LM_SIGNATURE = ("n_heads", "rope_base", "d_state", "d_conv")  # 0.1 stored every field, these included
_OLD_LM_MIXER_FIELDS = (
    "n_heads",
    "n_kv_heads",
    "window",
    "rope_base",
    "d_state",
    "d_conv",
    "expand",
    "dt_rank",
)


def split_mixer_fields(fields: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Move the fields that belong to the mixer's own config into ``mixer_config`` (flat fields are sugar:
    ``--model.n_heads=8`` means ``mixer_config.n_heads``). ``strict=False`` drops the old LM's shared mixer
    fields that the chosen mixer does not have, which is what seqlab 0.1 stored for every mixer."""
    from seqlab.models.lm import LMConfig

    fields = dict(fields)
    mixer = fields.get("mixer", "lstm")
    own = {f.name for f in dataclasses.fields(mixer_spec(mixer).config)}
    own -= {f.name for f in dataclasses.fields(LMConfig)}  # 'bias' is the model's; the mixer's goes nested
    given = fields.pop("mixer_config", None)
    if given is not None and not isinstance(given, dict):
        raise ValueError(
            f"mixer_config must be a mapping of the mixer's fields, e.g. --model.mixer_config='{{n_heads: 4}}' "
            f"(or --model.n_heads=4), got {given!r}"
        )
    nested = dict(given or {})
    for name in list(fields):
        if name in own:
            nested[name] = fields.pop(name)
        elif not strict and name in _OLD_LM_MIXER_FIELDS:
            fields.pop(name)
    return {**fields, "mixer_config": nested}


def _from_old_lm(f: dict[str, Any]) -> dict[str, Any]:
    f = split_mixer_fields(f, strict=False)
    if f.get("d_ff") is None:
        f["d_ff"] = 4 * f.get("d_model", 128)  # 0.1 gave every mixer an MLP unless told d_ff=0
    if f.get("d_input") is not None or f.get("d_output") is not None:
        f["tie_weights"] = False  # 0.1 untied silently
    return f


def _from_gpt(f: dict[str, Any]) -> dict[str, Any]:
    f = dict(f)
    position = f.pop("position", "learned")
    mixer = {k: f.pop(k) for k in ("n_heads", "n_kv_heads", "head_dim", "rope_base") if k in f}
    mixer.update(bias=f.get("bias", True), rope=position == "rope")
    return {
        **f,
        "mixer": "attention",
        "mixer_config": mixer,
        "position": "learned" if position == "learned" else "none",
        "init": "gpt2",
    }


def _from_rnn_lm(f: dict[str, Any]) -> dict[str, Any]:
    f = dict(f)
    cell = f.pop("cell", "lstm")
    return {
        **f,
        "mixer": cell,
        "mixer_config": {"forget_bias": None} if cell == "lstm" else {},
        "layout": "stacked",
        "head_bias": True,
        "init": "torch",
    }


def upgrade_config(family: str, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(family, config fields) as seqlab 0.1 stored them -> today's; current configs pass unchanged."""
    if family == "gpt":
        return "lm", _from_gpt(fields)
    if family == "rnn_lm":
        return "lm", _from_rnn_lm(fields)
    if family == "lm" and "mixer_config" not in fields and set(_OLD_LM_SIGNATURE) <= set(fields):
        return "lm", _from_old_lm(fields)
    return family, fields


_RNN_KEY = re.compile(r"rnn\.(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$")
_GPT_ATTN = re.compile(r"blocks\.(\d+)\.attn\.")


def rename_legacy_keys(state_dict: dict, prefix: str, tied: bool) -> None:
    """Rename, in place, GPT's and RNNLM's weight names to the stack's (see the module docstring)."""
    for key in list(state_dict):
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix) :]
        new = rest.replace("tok_embed.", "embed.", 1) if rest.startswith("tok_embed.") else rest
        new = _GPT_ATTN.sub(r"blocks.\1.mixer.", new, count=1)
        m = _RNN_KEY.match(new)
        if m:
            w, kind, layer, rev = m.groups()
            new = f"blocks.{layer}.mixer.{w}_{kind}_l0{rev or ''}"
        if new != rest:
            state_dict[prefix + new] = state_dict.pop(key)
    if tied and prefix + "head.weight" not in state_dict and prefix + "embed.weight" in state_dict:
        state_dict[prefix + "head.weight"] = state_dict[prefix + "embed.weight"]  # stored once, under embed
