"""The token-mixer contract and the registry of mixers.

Every sequence layer that moves information between positions (a recurrence, attention, a state-space scan)
is a *token mixer* and speaks one interface (docs/design.md):

    y, state = mixer(x, state=None, mask=None)      # x (b, t, d) -> y (b, t, d)
    state = mixer.init_state(b, device=None, dtype=None)
    y_t, state = mixer.step(x_t, state)              # x_t (b, d) -> y_t (b, d)

``mask`` is a (b, t) boolean padding mask, True at real positions, padding on the right. Four laws hold for
every registered mixer and are tested over the registry (tests/layers/test_mixer_contract.py):

1. step: running ``step`` position by position gives the full forward's outputs and final state;
2. chunks: a forward over [x1; x2] equals a forward over x1 then over x2 with the carried state;
3. causality: the output at position s never depends on inputs after s;
4. padding: with a mask, the outputs at real positions and the returned state equal those of each sequence
   run alone (for attention, the state's keys and values at the real positions).

A mixer registers once, beside its layer, with a :class:`MixerSpec`: how to build it from ``d_model`` and its
own small config dataclass, its block layout in the language-model backbone, its family and a cost hint for
the lab's scheduler. The backbone (``seqlab.models.lm``), the lab, the budget matcher, the CLI and the
contract tests learn which mixers exist from here only (docs/adding-a-mixer.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor, nn

from seqlab.validation import check_bool_fields

__all__ = [
    "FAMILIES",
    "MixerSpec",
    "TokenMixer",
    "create_mixer",
    "list_mixers",
    "make_mixer_config",
    "mixer_spec",
    "mixer_table",
    "register_mixer",
]

Family = Literal["RNN", "Transformer", "SSM"]
FAMILIES: tuple[str, ...] = ("RNN", "Transformer", "SSM")
"""The families of the literature, in the order tables list them."""


@runtime_checkable
class TokenMixer(Protocol):
    """What every token mixer implements (see the module docstring for the four laws)."""

    def forward(self, x: Tensor, state: Any = None, mask: Tensor | None = None) -> tuple[Tensor, Any]: ...

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> Any: ...

    def step(self, x_t: Tensor, state: Any) -> tuple[Tensor, Any]: ...


def _default_multiple(config: Any) -> int:
    return 4


@dataclass(frozen=True)
class MixerSpec:
    """Everything the rest of seqlab needs to know about one mixer."""

    name: str
    """Registry key, lowercase-hyphen: 'lstm', 'linear-attention'."""
    config: type
    """The mixer's own config dataclass (its fields only; d_model and dropout come from the model)."""
    build: Callable[..., nn.Module]
    """``build(d_model, config, *, dropout, device, dtype) -> TokenMixer``."""
    family: Family
    summary: str
    """One line for ``seqlab list --mixers``: what it is and its paper."""
    year: int | None = None
    """Year of its paper: tables list mixers by family, then in the literature's order (None: last)."""
    channel_mlp: bool = True
    """Block layout in the LM backbone: followed by a channel MLP (True), or carrying its own (Mamba)."""
    step_cost: float = 1.0
    """A lab run's training step (the whole LM at the suite's budget, one CPU thread) relative to the LSTM's, the
    median over the quick suite's runs (``docs/adding-a-mixer.md``, section 7); orders and times the lab's runs."""
    width_multiple: Callable[[Any], int] = _default_multiple
    """The budget matcher's step for d_model, from the config (attention: 2 x n_heads, for RoPE's pairs)."""
    counts_positions: bool = False
    """Its carried state has ``pos``, the number of tokens it has read (attention's KV cache): what an LM with
    learned absolute positions needs to step and to train on carried states."""


_REGISTRY: dict[str, MixerSpec] = {}


def register_mixer(spec: MixerSpec) -> MixerSpec:
    """Add a mixer to the registry (once; a second registration under the same name is an error)."""
    if not dataclasses.is_dataclass(spec.config):
        raise TypeError(f"mixer {spec.name!r}: config must be a dataclass, got {spec.config!r}")
    if spec.family not in FAMILIES:
        raise ValueError(f"mixer {spec.name!r}: family must be one of {FAMILIES}, got {spec.family!r}")
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"a mixer named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def _ensure_builtins() -> None:
    import seqlab.layers  # noqa: F401  (importing the package registers the built-in mixers)


def list_mixers(family: str | None = None) -> list[str]:
    """Registered mixer names, by family (RNN, Transformer, SSM), then by the year of their paper."""
    _ensure_builtins()
    names = [n for n, s in _REGISTRY.items() if family is None or s.family == family]

    def key(name: str) -> tuple[int, float]:
        spec = _REGISTRY[name]
        return FAMILIES.index(spec.family), float("inf") if spec.year is None else spec.year

    return sorted(names, key=key)  # stable: ties keep the registration order


def mixer_spec(name: str) -> MixerSpec:
    """The :class:`MixerSpec` registered under ``name``; a clear error lists the known ones."""
    _ensure_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown mixer {name!r}; known mixers: {', '.join(list_mixers())}")
    return _REGISTRY[name]


def make_mixer_config(name: str, fields: Any = None):
    """The mixer's config dataclass from a dict (or an instance, returned as is); unknown fields are refused."""
    cls = mixer_spec(name).config
    if isinstance(fields, cls):
        return fields
    if fields is not None and not isinstance(fields, dict):
        raise ValueError(f"the config of mixer {name!r} must be a mapping of its fields, got {fields!r}")
    fields = dict(fields or {})
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} for mixer {name!r}; its fields: {known or 'none'}"
            " (`seqlab list --mixers` shows each mixer's fields)"
        )
    check_bool_fields(cls, fields, f"the {name} mixer")
    return cls(**fields)


def create_mixer(
    name: str, d_model: int, *, dropout: float = 0.0, device=None, dtype=None, **fields
) -> nn.Module:
    """Build the mixer ``name`` at width ``d_model``, e.g. ``create_mixer('attention', 64, n_heads=8)``."""
    if not isinstance(d_model, int) or isinstance(d_model, bool) or d_model < 1:
        raise ValueError(f"d_model must be a positive integer, got {d_model!r}")
    spec = mixer_spec(name)
    config = make_mixer_config(name, fields)
    return spec.build(d_model, config, dropout=dropout, device=device, dtype=dtype)


def mixer_table(fields: Callable[[type], list[str]]) -> list[str]:
    """The registered mixers as text lines: name, family and summary, then ``fields(config class)``."""
    lines = [f"{'mixer':<18} {'family':<12} (a model's token mixer; `seqlab compare --mixers` takes these)"]
    for name in list_mixers():
        spec = mixer_spec(name)
        lines.append(f"{name:<18} {spec.family:<12} {spec.summary}")
        lines.append(f"{'':<31} fields: {', '.join(fields(spec.config)) or 'none'}")
    return lines
