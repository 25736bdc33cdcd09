r"""The one causal language-model stack: every token mixer, GPT-2, Llama-style decoders, Mamba and char-RNN LMs.

Notation: ``b`` batch, ``t`` time, ``d`` d_model, ``v`` vocabulary (or d_output).

    x_0 = E[tokens]  (+ P[positions] with learned positions)           or  W_in features, with d_input
    pre-norm block (GPT-2, Radford et al. 2019; Llama; Mamba; the lab):
        x = x + mixer(norm1(x))                                          token mixer: moves information in t
        x = x + mlp(norm2(x))                                            channel mixer; absent when d_ff = 0
    stacked block (the char-RNN LM, Karpathy 2015; Zaremba et al. 2014):
        x = mixer(x)                                                     no norm, no residual
    logits = head(norm(x_L))                                             no final norm in the stacked layout

The token mixer comes from the registry (``seqlab.layers.list_mixers``): its own fields live in
``mixer_config``, its default block layout (with a channel MLP or without, as Mamba) in its ``MixerSpec``.
Pre-norm residuals keep deep stacks trainable: the residual stream itself is never normalized.

GPT-2 is this stack with the attention mixer (biases, no RoPE), learned positions, LayerNorm, the tanh GELU
MLP, a tied head and GPT-2's initialization (``init="gpt2"``: N(0, 0.02), and the projections that write into
the residual stream at N(0, 0.02 / √(2 n_layers)), section 2.3 of the paper). Llama-style: RoPE inside the
attention mixer, RMSNorm, SwiGLU, no biases, untied head. Mamba: no channel MLP, RMSNorm (MambaForCausalLM's
layout). The char-RNN LMs: the stacked layout, torch.nn's initialization and a head with a bias.

Interface (the token-mixer interface lifted to tokens):
``model(ids (b, t), state=None, return_state=False, mask=None) -> logits (b, t, v) [, state]``,
``init_state(b)``, ``step(ids (b,), state) -> (logits (b, v), state)``, ``generate(...)`` and
``attention_maps(ids)`` where the mixers are attention. The state is the list of the layers' mixer states.

``generate`` decodes through :class:`seqlab.models.gpt_decode.StaticCacheDecoder` (the same arithmetic on
preallocated buffers) when ``why_not_fast_path()`` is None: every mixer is full causal attention, no hooks,
and the model was built with ``fast_path=True``; otherwise it steps through the modules, the reference path.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from seqlab.layers.attention import MultiheadAttention
from seqlab.layers.checks import check_batch_size, dtype_checked
from seqlab.layers.linear import Linear
from seqlab.layers.mixer import make_mixer_config, mixer_spec
from seqlab.layers.mlp import MLP, SwiGLU
from seqlab.layers.norms import make_norm
from seqlab.layers.positional import LearnedPositionalEmbedding
from seqlab.layers.vocab_head import VocabHead
from seqlab.models.generation import check_request, check_token_ids, evaluating, generate
from seqlab.models.init import normal_init_
from seqlab.validation import (
    check_choices,
    check_dropout,
    check_nonnegative,
    check_positive_floats,
    check_positive_ints,
)

__all__ = ["LM", "Block", "LMConfig"]


@dataclass
class LMConfig:
    mixer: str = "lstm"
    """Token mixer, a name from ``seqlab.layers.list_mixers()``: 'rnn', 'lstm', 'attention', 'mamba', ..."""
    mixer_config: dict[str, Any] | None = None
    """The mixer's own fields (its config dataclass in the registry), e.g. {'n_heads': 8}; None: defaults."""
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    layout: Literal["pre-norm", "stacked"] = "pre-norm"
    """'pre-norm': norm -> mixer -> residual, norm -> MLP -> residual; 'stacked': the mixers alone (char-RNN)."""
    d_ff: int | None = None
    """Hidden width of the channel MLP; None: 4 * d_model if the mixer's block has one (not Mamba's), 0: none."""
    mlp: Literal["gelu", "gelu_tanh", "relu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float | None = None
    """Epsilon of every norm; None means the norm's default (1e-5 LayerNorm, 1e-6 RMSNorm)."""
    bias: bool = True
    """Biases on the MLP projections and the LayerNorms (GPT-2: yes; Llama: no). The mixer has its own."""
    position: Literal["none", "learned"] = "none"
    """Absolute positions added to the embeddings: a learned table of max_seq_len rows (GPT-2), or none."""
    max_seq_len: int = 1024
    """Size of the learned position table, and then the longest context; unused without it."""
    dropout: float = 0.0
    """Dropout on the embeddings, the residual branches (and inside attention and S4D); training only."""
    tie_weights: bool | None = None
    """Share the embedding with the head (Press & Wolf 2017); None: tie when inputs and outputs are tokens."""
    head_bias: bool = False
    init: Literal["default", "gpt2", "torch"] = "default"
    """'default': embedding N(0, 0.02) (a tied head starts with small logits), the rest as each layer does;
    'gpt2': GPT-2's scheme (module docstring); 'torch': every layer's torch.nn initialization."""
    d_input: int | None = None
    """If set, inputs are float features (b, t, d_input) read through a linear layer instead of token ids."""
    d_output: int | None = None
    """Output size of the head; None means vocab_size."""

    def __post_init__(self):
        check_choices(self)
        check_positive_ints(self, ("vocab_size", "d_model", "n_layers", "max_seq_len"))
        check_positive_ints(self, ("d_input", "d_output"), allow_none=True)
        check_positive_floats(self, ("norm_eps",), allow_none=True)
        check_dropout(self)
        check_nonnegative(self, ("d_ff",), hint=" (0: no channel MLP) or None")
        if self.layout == "stacked" and self.d_ff:
            raise ValueError(f"the stacked layout has no channel MLP; got d_ff={self.d_ff}")
        if self.tie_weights and not self._tokens_in_and_out:
            raise ValueError(
                "model.tie_weights (one embedding for the inputs and the head) needs token inputs and outputs, "
                f"got d_input={self.d_input}, d_output={self.d_output} (None: tokens): set it false"
            )
        self.mixer_config = asdict(make_mixer_config(self.mixer, self.mixer_config))
        if self.position == "learned" and not mixer_spec(self.mixer).counts_positions:
            raise ValueError(  # refused here, not after training, when stepping first needs the count
                f"position='learned' needs a mixer whose state counts positions (attention); {self.mixer}'s "
                "does not, so the model could not generate or carry a state: use position='none'"
            )

    @property
    def _tokens_in_and_out(self) -> bool:
        return self.d_input is None and self.d_output is None

    @property
    def tied(self) -> bool:
        return self._tokens_in_and_out if self.tie_weights is None else self.tie_weights

    @property
    def ff_width(self) -> int:
        if self.layout == "stacked":
            return 0
        if self.d_ff is not None:
            return self.d_ff
        return 4 * self.d_model if mixer_spec(self.mixer).channel_mlp else 0


class Block(nn.Module):
    """One layer: pre-norm ``x + mixer(norm1(x)); x + mlp(norm2(x))``, or stacked ``mixer(x)``."""

    def __init__(self, c: LMConfig, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.residual = c.layout == "pre-norm"
        self.norm1 = (
            make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw) if self.residual else None
        )
        spec = mixer_spec(c.mixer)
        self.mixer = spec.build(
            c.d_model, make_mixer_config(c.mixer, c.mixer_config), dropout=c.dropout, **kw
        )
        self.drop = nn.Dropout(c.dropout)
        self.norm2 = self.mlp = None
        if c.ff_width > 0:
            self.norm2 = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)
            if c.mlp == "swiglu":
                self.mlp = SwiGLU(c.d_model, c.ff_width, bias=c.bias, dropout=c.dropout, **kw)
            else:
                self.mlp = MLP(c.d_model, c.ff_width, activation=c.mlp, bias=c.bias, dropout=c.dropout, **kw)

    def mixer_input(self, x: Tensor) -> Tensor:
        return self.norm1(x) if self.residual else x

    def combine(self, x: Tensor, y: Tensor) -> Tensor:
        """The block's output from its input x and the mixer's output y."""
        if not self.residual:
            return self.drop(y)
        x = x + self.drop(y)
        return x if self.mlp is None else x + self.mlp(self.norm2(x))

    def forward(self, x: Tensor, state: Any = None, mask: Tensor | None = None) -> tuple[Tensor, Any]:
        y, state = self.mixer(self.mixer_input(x), state, mask)  # (b, t, d); every mixer takes a mask
        return self.combine(x, y), state

    def step(self, x_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        y, state = self.mixer.step(self.mixer_input(x_t), state)  # (b, d)
        return self.combine(x_t, y), state

    def residual_projections(self) -> list[nn.Linear]:
        """The layers that write into the residual stream (GPT-2 scales their initialization)."""
        out = [self.mixer.out_proj] if isinstance(self.mixer, MultiheadAttention) else []
        if self.mlp is not None:
            out.append(self.mlp.down if isinstance(self.mlp, SwiGLU) else self.mlp.fc2)
        return out


class LM(nn.Module):
    """The causal LM stack (see the module docstring). ``fast_path`` allows the static-cache decoder.

    Examples::

        >>> model = LM(LMConfig(mixer="gru", vocab_size=32, d_model=16))
        >>> model(torch.randint(0, 32, (2, 5))).shape
        torch.Size([2, 5, 32])
    """

    family = "lm"

    def __init__(self, config: LMConfig, device=None, dtype=None, fast_path: bool = True):
        super().__init__()
        self.config = c = config
        self.fast_path = fast_path
        kw = {"device": device, "dtype": dtype}
        if c.d_input is None:
            self.embed = nn.Embedding(c.vocab_size, c.d_model, **kw)
        else:
            self.embed = Linear(c.d_input, c.d_model, **kw)
        self.pos_embed = (
            LearnedPositionalEmbedding(c.max_seq_len, c.d_model, **kw) if c.position == "learned" else None
        )
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c, **kw) for _ in range(c.n_layers))
        self.norm = (
            make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)
            if c.layout == "pre-norm"
            else None
        )
        self.head = VocabHead(c.d_model, c.d_output or c.vocab_size, bias=c.head_bias, **kw)
        if c.tied:
            self.head.weight = self.embed.weight
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_legacy_keys_hook)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        c = self.config
        if c.init == "default" and c.d_input is None:  # N(0, 0.02) as GPT-2: tied, N(0, 1) gives huge logits
            nn.init.normal_(self.embed.weight, std=0.02)
        elif c.init == "gpt2":
            other_mixers = [b.mixer for b in self.blocks if not isinstance(b.mixer, MultiheadAttention)]
            normal_init_(self, std=0.02, skip=other_mixers)  # a recurrent or SSM mixer keeps its own init
            resid_std = 0.02 / math.sqrt(2 * c.n_layers)
            for block in self.blocks:
                for proj in block.residual_projections():
                    nn.init.normal_(proj.weight, std=resid_std)

    # ---- reading ------------------------------------------------------------------------------------------

    def _embed(self, x: Tensor, offset: int) -> Tensor:
        c = self.config
        if c.d_input is None:
            check_token_ids(x, c.vocab_size)
        # under torch.autocast the features may come in a lower precision than the weights, on purpose
        elif (
            x.size(-1) != c.d_input
            or not x.is_floating_point()
            or (x.dtype != self.embed.weight.dtype and dtype_checked(x))
        ):
            w = self.embed.weight
            raise ValueError(
                f"expected features (..., d_input={c.d_input}) of the model's dtype {w.dtype}, "
                f"got {tuple(x.shape)} {x.dtype}"
            )
        h = self.embed(x)  # (b, t) -> (b, t, d), or (b,) -> (b, d)
        if self.pos_embed is not None:  # + P[offset : offset + t]
            h = self.pos_embed(h if h.dim() == 3 else h[:, None], offset).view_as(h)
        return self.drop(h)

    def _offset(self, state: list | None) -> int:
        """Positions already in the state: only learned positions need it, and attention's cache counts them
        (LMConfig refuses learned positions with a mixer whose state does not: MixerSpec.counts_positions)."""
        first = state[0] if self.pos_embed is not None and state else None  # None: a fresh state, position 0
        return int(getattr(first, "pos", 0))  # (a state that is no KV cache: its mixer's check names it)

    def forward(
        self, x: Tensor, state: list | None = None, return_state: bool = False, mask: Tensor | None = None
    ):
        """x (b, t) token ids [or (b, t, d_input)] -> logits (b, t, v) [and the per-layer states].

        ``mask`` (b, t) bool, True at real positions (right padding): passed to every mixer.
        """
        if x.dim() != (2 if self.config.d_input is None else 3):
            raise ValueError(
                f"expected inputs of shape (b, t){'' if self.config.d_input is None else ' + (d_input,)'}, got {tuple(x.shape)}"
            )
        states = [None] * len(self.blocks) if state is None else self._check_state(state)
        h = self._embed(x, self._offset(state))  # (b, t, d)
        new = []
        for block, s in zip(self.blocks, states, strict=True):
            h, s = block(h, s, mask)
            new.append(s)
        logits = self.head(self._final_norm(h))  # (b, t, d) -> (b, t, v)
        return (logits, new) if return_state else logits

    def _check_state(self, state: list) -> list:
        if not isinstance(state, list | tuple) or len(state) != len(self.blocks):
            got = f"{len(state)} entries" if isinstance(state, list | tuple) else type(state).__name__
            raise ValueError(
                f"expected a state with one entry per layer ({len(self.blocks)}), as init_state makes; got {got}"
            )
        return state

    def _final_norm(self, h: Tensor) -> Tensor:
        return h if self.norm is None else self.norm(h)

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> list:
        check_batch_size(type(self).__name__, batch_size)
        return [b.mixer.init_state(batch_size, device=device, dtype=dtype) for b in self.blocks]

    def step(self, x_t: Tensor, state: list | None = None) -> tuple[Tensor, list]:
        """x_t (b,) token ids [or (b, d_input)] -> logits (b, v), new states: O(1) for RNN/SSM, O(t) attention."""
        want = 1 if self.config.d_input is None else 2
        if not isinstance(x_t, Tensor) or x_t.dim() != want:
            got = tuple(x_t.shape) if isinstance(x_t, Tensor) else type(x_t).__name__
            shape = "(b,) token ids" if want == 1 else f"(b, d_input={self.config.d_input}) features"
            raise ValueError(f"LM.step expects one position per row, {shape}; got {got}")
        p = self.head.weight
        states = self.init_state(x_t.size(0), device=p.device, dtype=p.dtype) if state is None else state
        self._check_state(states)
        h = self._embed(x_t, self._offset(states))  # (b, d)
        new = []
        for block, s in zip(self.blocks, states, strict=True):
            h, s = block.step(h, s)
            new.append(s)
        return self.head(self._final_norm(h)), new

    @property
    def context_limit(self) -> int | None:
        """Positions the model can hold: max_seq_len with learned positions; otherwise unbounded."""
        return self.config.max_seq_len if self.pos_embed is not None else None

    @torch.no_grad()
    def attention_maps(self, ids: Tensor, layers: list[int] | None = None) -> dict[int, Tensor]:
        """The attention weights (b, h, t, t) of the chosen layers (all by default) for ids (b, t)."""
        n = len(self.blocks)
        layers = list(range(n)) if layers is None else layers
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has {n} layers (0 ... {n - 1})")
        if not isinstance(self.blocks[0].mixer, MultiheadAttention):
            raise ValueError(
                f"a {self.config.mixer} mixer has no attention weights; an attention model is needed"
            )
        h, maps = self._embed(ids, 0), {}
        for i, block in enumerate(self.blocks[: max(layers, default=-1) + 1]):
            y, _, maps[i] = block.mixer(block.mixer_input(h), need_weights=True)
            h = block.combine(h, y)
        return {i: maps[i] for i in layers}

    # ---- generation ---------------------------------------------------------------------------------------

    def why_not_fast_path(self) -> str | None:
        """Why ``generate`` would step through the modules instead of the static-cache decoder, or None."""
        if not self.fast_path:
            return "fast_path=False was set on this model"
        from seqlab.models.gpt_decode import why_not_static_decode

        return why_not_static_decode(self)

    def generate(
        self, prompt_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, **sampling
    ) -> Tensor:
        """Prompt (b, t) or (t,) -> prompt + continuation. ``temperature=0`` is greedy; ``sampling``: top_k,
        top_p, generator, on_tokens (streaming), as in :func:`seqlab.models.generation.generate`.

        With learned positions the context slides past ``max_seq_len`` (see ``seqlab.models.generation``).
        """
        check_request(prompt_ids, max_new_tokens, temperature, sampling.get("top_k"), sampling.get("top_p"))
        c = self.config
        if c.d_input is not None or c.d_output not in (None, c.vocab_size):
            raise ValueError(
                "generate feeds each drawn token back as the next input, so it needs token inputs and outputs over "
                f"the same vocabulary; this model has d_input={c.d_input}, d_output={c.d_output} and vocab_size="
                f"{c.vocab_size} (call the model on sequences instead)"
            )
        model = self
        if self.why_not_fast_path() is None:
            from seqlab.models.gpt_decode import StaticCacheDecoder

            t = prompt_ids.size(-1)  # check_request: (b, t) or (t,)
            model = StaticCacheDecoder(self, capacity=t + max(max_new_tokens, 1))
        with evaluating(self):  # every module's own flag back afterwards (the decoder only knows the model's)
            return generate(model, prompt_ids, max_new_tokens, temperature, **sampling)


def _legacy_keys_hook(module: LM, state_dict: dict, prefix: str, *args) -> None:
    """Rename the weights of checkpoints written before the one-stack LM (GPT, RNNLM) to this stack's names."""
    from seqlab.models.legacy import rename_legacy_keys

    rename_legacy_keys(state_dict, prefix, tied=module.config.tied)


# The mixer backbone at test size, one per mixer family member (the lab builds its own at matched budgets).
PRESETS: dict[str, dict[str, Any]] = {
    "test-lm-lstm": {"mixer": "lstm", "d_model": 32, "n_layers": 2},
    "test-lm-gru": {"mixer": "gru", "d_model": 32, "n_layers": 2},
    "test-lm-rnn": {"mixer": "rnn", "d_model": 32, "n_layers": 2},
    "test-lm-attention": {
        "mixer": "attention",
        "mixer_config": {"n_heads": 4, "n_kv_heads": 2},
        "d_model": 32,
        "n_layers": 2,
    },
    "test-lm-linear-attention": {
        "mixer": "linear-attention",
        "mixer_config": {"n_heads": 4},
        "d_model": 32,
        "n_layers": 2,
    },
}
"""Family "lm" presets: literal LMConfig fields."""
