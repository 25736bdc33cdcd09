r"""Speech as spectrogram slices: an acoustic model with any token mixer over the frames.

Notation: ``b`` batch, ``t`` feature frames, ``m`` mel bands, ``s`` the front end's subsampling, ``t' = ⌈t / s⌉``
output frames, ``f`` the front end's width (d_frontend), ``d`` d_model, ``K`` classes or CTC outputs (the
blank, id 0, then the tokens).

    front end       u = FrontEnd(x)                        (b, t, m) -> (b, t', f)
    over time       z = LM(u)                              the LM stack (seqlab.models.lm) with d_input = f,
                                                           d_output = K: W_in u, n_layers blocks of a registered
                                                           token mixer, a norm, the head
    head 'classify' a keyword per utterance (many to one): logits = mean_τ z_τ over the real frames ('mean')
                                                           or z at the last real frame ('last'); (b, K)
    head 'ctc'      a transcript (many to many, unaligned): per-frame logits z (b, t', K) read by CTC
                                                           (Graves et al. 2006; the loss is the task's)

Front ends (``frontend``), each shortening time by ``subsample`` (a CTC model needs t' ≥ the label length, and
the mixers run s times fewer steps):

* 'conv' — two 1-D convolutions over time, as in Deep Speech 2 (Amodei et al. 2015, arXiv 1512.02595, there
  2-D): u = GELU(Conv_k(GELU(Conv_{k, stride s}(x)))), the mel bands as input channels, 'same' zero padding;
* 'linear' — frame stacking (Sak et al. 2015, arXiv 1507.06947): s consecutive frames concatenated,
  u_τ = GELU(W [x_{sτ}; ...; x_{sτ+s-1}]).

Ragged batches: with ``mask`` (b, t) True at real frames (right padding), the padded frames are zeroed before
each convolution (as the convolution's own zero padding would be for the utterance alone) and the mixers get
the subsampled mask, so every utterance's outputs equal those of the utterance run alone.

Direction: every registered mixer is causal, so by default z_τ depends on frames up to τ only (plus the front
end's look-ahead of k // 2 frames per convolution): a streaming model. ``bidirectional=True`` adds a second
LM stack over the time-reversed frames (each utterance reversed within its own length) and sums the two
stacks' logits, z = LM_→(u) + reverse(LM_←(reverse(u))); deviation from a bidirectional RNN (Schuster &
Paliwal 1997), which concatenates the directions' states inside every layer: here they meet only at the logits,
which lets any mixer run backwards unchanged. It doubles the parameters of the temporal model.

Interface: ``model(x (b, t, m), mask=None)`` -> logits (b, K) ('classify') or (b, t', K) ('ctc');
``output_lengths(lengths (b,))`` -> (b,) frames t' of each utterance's output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.checks import check_dtype
from seqlab.layers.linear import Linear
from seqlab.layers.masks import check_padding_mask
from seqlab.layers.mixer import make_mixer_config, mixer_spec
from seqlab.models.lm import LM, LMConfig
from seqlab.validation import check_choices, check_dropout, check_nonnegative, check_positive_ints

__all__ = ["PRESETS", "SpeechConfig", "SpeechModel"]


@dataclass
class SpeechConfig:
    head: Literal["classify", "ctc"] = "ctc"
    n_mels: int = 40
    """Mel bands per input frame (the task's features)."""
    n_outputs: int = 29
    """'classify': the classes; 'ctc': the blank (id 0) plus the tokens."""
    frontend: Literal["conv", "linear"] = "conv"
    d_frontend: int | None = None
    """Width of the front end's output; None: d_model."""
    subsample: int = 3
    """Frames per output frame (the first convolution's stride, or the frames stacked)."""
    kernel_size: int = 5
    """'conv': the convolutions' width in frames (odd)."""
    mixer: str = "lstm"
    """A registered token mixer (``seqlab.layers.list_mixers()``)."""
    mixer_config: dict[str, Any] | None = None
    d_model: int = 96
    n_layers: int = 2
    d_ff: int | None = None
    """Channel MLP width; None: the LM stack's default (4 d_model, none for Mamba)."""
    dropout: float = 0.0
    pool: Literal["mean", "last"] = "mean"
    """'classify': average the frames' logits, or read the last real frame's (what a streaming model knows)."""
    bidirectional: bool = False
    """A second stack over the reversed frames, its logits added (module docstring)."""

    def __post_init__(self):
        check_choices(self)
        ints = ("n_mels", "n_outputs", "subsample", "kernel_size", "d_model", "n_layers")
        check_positive_ints(self, ints)
        check_positive_ints(self, ("d_frontend",), allow_none=True)
        check_nonnegative(self, ("d_ff",), hint=" (0: no channel MLP) or None")
        check_dropout(self)
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd ('same' padding), got {self.kernel_size}")
        if self.bidirectional and self.head == "classify" and self.pool == "last":
            raise ValueError("a bidirectional model has no last frame to read: pool='mean'")
        self.mixer_config = dataclasses.asdict(
            make_mixer_config(mixer_spec(self.mixer).name, self.mixer_config)
        )

    @property
    def frontend_width(self) -> int:
        return self.d_frontend or self.d_model


def reverse_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """(b, t, d): each row's first ``lengths[i]`` positions reversed, its padding left in place (an involution)."""
    b, t = x.shape[:2]
    pos = torch.arange(t, device=x.device).expand(b, t)  # (b, t)
    back = lengths.to(x.device)[:, None] - 1 - pos
    index = torch.where(back >= 0, back, pos)  # (b, t)
    return x.gather(1, index[..., None].expand_as(x))


class FrontEnd(nn.Module):
    """(b, t, m) frames, (b, t) mask -> (b, t', f): two convolutions over time, or frame stacking."""

    def __init__(self, c: SpeechConfig, device=None, dtype=None):
        super().__init__()
        kw, f, s = {"device": device, "dtype": dtype}, c.frontend_width, c.subsample
        self.kind, self.subsample = c.frontend, s
        if c.frontend == "conv":
            p = c.kernel_size // 2
            self.conv1 = nn.Conv1d(c.n_mels, f, c.kernel_size, stride=s, padding=p, **kw)
            self.conv2 = nn.Conv1d(f, f, c.kernel_size, padding=p, **kw)
        else:
            self.proj = Linear(s * c.n_mels, f, **kw)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x.masked_fill(~mask[..., None], 0.0)  # padded frames are zeros (whatever they held: -inf too)
        if self.kind == "linear":
            b, t, m = x.shape
            x = F.pad(x, (0, 0, 0, (-t) % self.subsample))  # (b, s t', m)
            return F.gelu(self.proj(x.reshape(b, -1, self.subsample * m)))  # (b, t', s m) -> (b, t', f)
        sub = output_mask(mask, self.subsample)  # (b, t')
        h = F.gelu(self.conv1(x.transpose(1, 2)))  # (b, m, t) -> (b, f, t')
        h = h * sub[:, None, :]
        return F.gelu(self.conv2(h)).transpose(1, 2)  # (b, f, t') -> (b, t', f)


def output_mask(mask: Tensor, subsample: int) -> Tensor:
    """(b, t) -> (b, t'): True at the output frames of each utterance's real frames."""
    lengths = (mask.sum(1) + subsample - 1) // subsample  # (b,)
    t_out = (mask.size(1) + subsample - 1) // subsample
    return torch.arange(t_out, device=mask.device)[None, :] < lengths[:, None]


class SpeechModel(nn.Module):
    """An acoustic model; see the module docstring.

    Examples::

        >>> model = SpeechModel(SpeechConfig(n_outputs=29, d_model=16, n_layers=1))
        >>> model(torch.randn(2, 50, 40)).shape
        torch.Size([2, 25, 29])
    """

    family = "speech"

    def __init__(self, config: SpeechConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        self.frontend = FrontEnd(c, **kw)
        lm = LMConfig(
            mixer=c.mixer,
            mixer_config=c.mixer_config,
            d_model=c.d_model,
            n_layers=c.n_layers,
            d_ff=c.d_ff,
            dropout=c.dropout,
            d_input=c.frontend_width,
            d_output=c.n_outputs,
            head_bias=True,
        )
        self.temporal = LM(lm, **kw)
        self.backward_temporal = LM(lm, **kw) if c.bidirectional else None

    def output_lengths(self, lengths: Tensor) -> Tensor:
        """(b,) input frames -> (b,) output frames ⌈t / s⌉."""
        s = self.config.subsample
        return (lengths + s - 1) // s

    def check_input(self, x: Tensor, mask: Tensor | None) -> Tensor:
        m = self.config.n_mels
        if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != m or not x.is_floating_point():
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"expected features (b, t, n_mels={m}) as floats, got {got}")
        if x.size(1) == 0:
            raise ValueError("an utterance needs at least one frame")
        check_dtype("SpeechModel", x, self.frontend_weight(), what="x (the features)")
        if mask is None:
            return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if not isinstance(mask, Tensor) or mask.shape != x.shape[:2] or mask.dtype != torch.bool:
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"mask must be bool (b, t) = {tuple(x.shape[:2])}, got {got}")
        if not bool(mask[:, 0].all()):
            raise ValueError("every utterance needs at least one real frame (right padding: mask[:, 0] True)")
        check_padding_mask(mask, *x.shape[:2])  # right padding: a real frame after padding would be dropped
        return mask

    def frontend_weight(self) -> Tensor:
        """The front end's first weight (its dtype and device are the features' expected ones)."""
        f = self.frontend
        return f.conv1.weight if f.kind == "conv" else f.proj.weight

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (b, t, m) [, mask (b, t)] -> logits (b, K) ('classify') or (b, t', K) ('ctc')."""
        c = self.config
        mask = self.check_input(x, mask)
        u = self.frontend(x, mask)  # (b, t', f)
        sub = output_mask(mask, c.subsample)  # (b, t')
        z = self.temporal(u, mask=sub)  # (b, t', K)
        if self.backward_temporal is not None:
            lengths = sub.sum(1)
            z = z + reverse_padded(self.backward_temporal(reverse_padded(u, lengths), mask=sub), lengths)
        if c.head == "ctc":
            return z
        if c.pool == "last":
            last = sub.sum(1) - 1  # (b,)
            return z[torch.arange(z.size(0), device=z.device), last]  # (b, K)
        w = sub[..., None].to(z.dtype)  # (b, t', 1)
        return (z * w).sum(1) / w.sum(1)  # (b, K)


def _test(**fields) -> dict:
    return {"n_mels": 16, "d_model": 16, "n_layers": 1, "subsample": 2, "kernel_size": 3, **fields}


PRESETS: dict[str, dict[str, Any]] = {
    # 40 log-mel bands every 10 ms; the lab swaps the mixer at matched parameter counts
    "speech-lstm": {"mixer": "lstm", "d_model": 96},
    "speech-gru": {"mixer": "gru", "d_model": 96},
    "speech-attention": {"mixer": "attention", "d_model": 96},
    "speech-mamba": {"mixer": "mamba", "d_model": 96},
    "speech-bilstm": {"mixer": "lstm", "d_model": 64, "bidirectional": True},
    "test-speech": _test(head="classify", n_outputs=5),
    "test-speech-ctc": _test(head="ctc", n_outputs=8),
    "test-speech-linear": _test(head="ctc", n_outputs=8, frontend="linear", subsample=3),
}
