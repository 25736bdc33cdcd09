"""Model registry: ``create(name, **overrides)`` builds a preset; ``list_models()`` names them.

A family is a (config dataclass, model class) pair; a preset is a family plus literal config fields. Models
keep their config as ``model.config`` and their family as ``model.family``, which is all a checkpoint needs
to rebuild them (``build(family, config_dict)``). Every causal LM is family "lm" (``seqlab.models.lm``):
GPT, the char-RNN LMs, Mamba and S4D are its presets. For it, a mixer's own fields may be given flat
(``create('gpt-tiny', n_heads=3)`` sets ``mixer_config['n_heads']``). Configs written by seqlab 0.1 (families
"gpt" and "rnn_lm", the flat LM config) are upgraded on the way in (``seqlab.models.legacy``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seqlab.layers.mixer import mixer_spec
from seqlab.models import captioner, encoder, gpt, lm, mamba, rnn_lm, seq2seq, speech, transformer, video, vit
from seqlab.models.legacy import split_mixer_fields, upgrade_config
from seqlab.validation import check_bool_fields

FAMILIES: dict[str, tuple[type, type[nn.Module]]] = {
    "lm": (lm.LMConfig, lm.LM),
    "encoder": (encoder.EncoderConfig, encoder.Encoder),
    "transformer": (transformer.TransformerConfig, transformer.Transformer),
    "seq2seq": (seq2seq.Seq2SeqConfig, seq2seq.Seq2Seq),
    "vit": (vit.ViTConfig, vit.ViT),
    "captioner": (captioner.CaptionerConfig, captioner.Captioner),
    "video": (video.VideoConfig, video.VideoModel),
    "speech": (speech.SpeechConfig, speech.SpeechModel),
}
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: ("lm", fields) for name, fields in rnn_lm.PRESETS.items()},
    **{name: ("lm", fields) for name, fields in lm.PRESETS.items()},
    **{name: ("lm", fields) for name, fields in mamba.PRESETS.items()},
    **{name: ("lm", fields) for name, fields in gpt.PRESETS.items()},
    **{name: ("encoder", fields) for name, fields in encoder.PRESETS.items()},
    **{name: ("transformer", fields) for name, fields in transformer.PRESETS.items()},
    **{name: ("seq2seq", fields) for name, fields in seq2seq.PRESETS.items()},
    **{name: ("vit", fields) for name, fields in vit.PRESETS.items()},
    **{name: ("captioner", fields) for name, fields in captioner.PRESETS.items()},
    **{name: ("video", fields) for name, fields in video.PRESETS.items()},
    **{name: ("speech", fields) for name, fields in speech.PRESETS.items()},
}

__all__ = [
    "FAMILIES",
    "PRESETS",
    "build",
    "check_can_train",
    "count_parameters",
    "create",
    "list_models",
    "make_config",
]


def list_models(pattern: str | None = None) -> list[str]:
    """Preset names, sorted; ``pattern`` is a shell-style filter such as ``'lstm*'``, case-insensitive (as
    ``seqlab list`` matches; the names are lower-case) on every system."""
    names = sorted(PRESETS)
    return [n for n in names if fnmatch.fnmatchcase(n, pattern.lower())] if pattern else names


def make_config(family: str, fields: dict[str, Any]):
    """The family's config dataclass from a dict, rejecting unknown fields with the list of known ones."""
    family, fields = upgrade_config(family, fields)
    if family == "lm":
        fields = split_mixer_fields(fields, strict=True)
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    cls = FAMILIES[family][0]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        hint = ""
        if family == "lm":
            mixer = fields.get("mixer", "lstm")
            own = [f.name for f in dataclasses.fields(mixer_spec(mixer).config)]
            hint = f", nor of the {mixer!r} mixer (its fields: {own or 'none'})"
        raise ValueError(f"unknown field(s) {unknown}: not {cls.__name__} fields {sorted(known)}{hint}")
    check_bool_fields(cls, fields, "model")
    return cls(**fields)


def _resolve(name: str, overrides: dict[str, Any]):
    if name not in PRESETS:
        raise ValueError(
            f"unknown model {name!r}; `seqlab list` shows the presets: {', '.join(list_models())}"
        )
    family, fields = PRESETS[name]
    if family == "lm":  # the mixer's own fields merge one by one, unless the override changes the mixer
        mixer = overrides.get("mixer", fields["mixer"])
        base = (
            split_mixer_fields(fields, strict=True)
            if mixer == fields["mixer"]
            else {**fields, "mixer_config": {}}
        )
        over = split_mixer_fields({"mixer": mixer, **overrides}, strict=True)
        overrides = {**over, "mixer_config": {**base["mixer_config"], **over["mixer_config"]}}
        fields = base
    return family, make_config(family, {**fields, **overrides})


def build(family: str, config, device=None, dtype=None) -> nn.Module:
    """A model of ``family`` from its config (a dataclass or a dict, e.g. read from a checkpoint)."""
    if isinstance(config, dict):
        family, config = upgrade_config(family, config)
        config = make_config(family, config)
    cls = FAMILIES[family][1]
    if torch.device(device or "cpu").type == "cpu":  # refuse what cannot fit before allocating any of it
        check_fits_in_memory(cls(config, device=torch.device("meta"), dtype=dtype), family)
    return cls(config, device=device, dtype=dtype)


def _available_bytes() -> int | None:
    """The memory this process may still take: the least of the machine's available memory, the cgroup's limit
    less its use (a container), and the address-space limit (``ulimit -v``); None where none can be read."""
    found = []
    with contextlib.suppress(OSError, ValueError, StopIteration):
        text = Path("/proc/meminfo").read_text(encoding="ascii")
        found.append(
            next(int(ln.split()[1]) * 1024 for ln in text.splitlines() if ln.startswith("MemAvailable:"))
        )
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text(encoding="ascii").strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text(encoding="ascii")))
    with contextlib.suppress(OSError, ValueError, AttributeError):
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            used = (
                int(Path("/proc/self/statm").read_text(encoding="ascii").split()[0]) * resource.getpagesize()
            )
            found.append(soft - used)
    return min(found) if found else None


def _check_room(need: int, refusal) -> None:
    """A ValueError with ``refusal(available GiB)`` when ``need`` bytes exceed the memory available now."""
    have = _available_bytes()
    if have is not None and need > have:
        raise ValueError(refusal(have / 2**30))


def check_fits_in_memory(meta_model: nn.Module, what: str) -> None:
    """A ValueError when the weights of a model (built on the meta device) exceed the memory available now."""
    n = sum(p.numel() for p in meta_model.parameters())
    need = sum(p.numel() * p.element_size() for p in meta_model.parameters())
    _check_room(
        need,
        lambda have: (
            f"a {what!r} model of {n:,} parameters needs {need / 2**30:,.1f} GiB for its weights alone; "
            f"this machine has {have:,.1f} GiB available. Nothing was allocated: choose a smaller config"
        ),
    )


def check_can_train(model: nn.Module) -> None:
    """Before step 1 on the CPU: a ValueError when the gradients and AdamW's two moments (three more copies of
    the weights, activations on top) exceed the memory available now, rather than an allocator error later."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    need = 3 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    _check_room(
        need,
        lambda have: (
            f"training this model ({n:,} trained parameters) needs {need / 2**30:,.1f} GiB more for its "
            f"gradients and AdamW's two moments, activations on top; {have:,.1f} GiB are available: choose a "
            "smaller config"
        ),
    )


def create(name: str, *, device=None, dtype=None, **overrides) -> nn.Module:
    """Build the preset ``name`` with config fields overridden, e.g. ``create('lstm-lm-small', n_layers=1)``."""
    family, config = _resolve(name, overrides)
    return build(family, config, device=device, dtype=dtype)


def count_parameters(name_or_model, **overrides) -> int:
    """Parameter count of a model or a preset; presets are built on the meta device (nothing allocated)."""
    if isinstance(name_or_model, nn.Module):
        model = name_or_model
    else:
        model = create(name_or_model, device=torch.device("meta"), **overrides)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
