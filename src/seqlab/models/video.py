r"""Frame sequences: one model for the three shapes of video problems, with any token mixer over time.

Notation: ``b`` batch, ``t`` frames, ``c`` channels, ``S`` frame side, ``f`` the frame vector's width
(d_frame), ``d`` d_model, ``K`` classes (actions or frame events), ``n`` caption positions, ``v`` vocabulary.

    per frame       x_i = Enc(frame_i)                      (b, t, c, S, S) -> (b, t, f), the frames as a batch
    over time       z = Temporal(x)                         (b, t, f) -> (b, t, d)
    head 'action'   one label per clip (many to one):       logits = W z_t (the last frame: 'last') or W mean_i z_i
    head 'frames'   one label per frame (many to many):     logits_i = W z_i
    head 'caption'  a sentence (many to many, seq2seq):     an attentive decoder reads z_1..z_t as its memory

Frame encoders (``frame_encoder``), each ending in a frame vector that keeps *where* things are (the direction
of a motion needs it; a pooled grid would not):
* 'patch' — ViT's patch embedding, a GELU, and the g × g patch grid flattened through one linear map and a GELU:
  x = GELU(W vec(GELU(E patches))), a two-layer network that costs a few matrix products per frame (the lab's);
* 'cnn' — the VGG-style stages of :class:`seqlab.layers.conv.ConvGridEncoder`, the grid flattened the same way;
* 'vit' — a Vision Transformer per frame whose class token is the frame vector (:class:`seqlab.models.vit.ViT`),
  with fixed 2-D sinusoidal positions (a learned table at N(0, 0.02) leaves where a small object is barely
  legible at the start). On the generated clips its class tokens vary little from frame to frame (about 3% of
  their norm at initialization), and ViViT sat at chance on the actions for 300-400 steps at learning rates
  3e-4 to 3e-3, where the 'patch' encoder under the same temporal Transformer reached 0.82 in 300 steps.

Temporal models (``temporal``):
* 'mixer' — the LM stack (:class:`seqlab.models.lm.LM`) over frame vectors instead of token embeddings:
  W_in x_i, then ``n_layers`` pre-norm blocks of any registered token mixer (``mixer``: 'rnn', 'lstm', 'gru',
  'attention', 'mamba', ...), a norm and the head. Every registered mixer is causal, so z_i sees frames
  1..i only, and ``step_frame`` classifies a stream online, one frame at a time, in O(1) per frame for the
  recurrent and state-space mixers (O(i) for attention's cache); it equals the full forward.
* 'transformer' — ViViT's factorised encoder (Arnab et al. 2021, arXiv 2103.15691, model 2): with the 'vit'
  frame encoder the spatial Transformer runs per frame and its class tokens go to a temporal Transformer
  encoder (bidirectional, pre-norm, a temporal class token first, learned positions N(0, 0.02)); 'action'
  reads the temporal class token, 'frames' the frame tokens. Offline only: every z_i sees the whole clip.

The caption decoder is the captioners' (``seqlab.models.captioner_decode``): an LSTM with soft additive
attention over the frames (temporal attention, Yao et al. 2015, arXiv 1502.08029: Show, Attend and Tell's
decoder with frames for regions), or a Transformer decoder cross-attending to them, or with
``attention='none'`` the bottleneck, the whole clip as one vector W_I vec(z) read once before the first word.
Beam search is the one every encoder–decoder shares (``seqlab.models.beam``).

Interface: ``model(clips (b, t, c, S, S))`` -> logits (b, K) ('action') or (b, t, K) ('frames');
``model(clips, tgt_in (b, n), return_attention=False)`` -> logits (b, n, v) [, α (b, n, t)] ('caption');
``generate(clips, ...)``; ``init_state(b)`` and ``step_frame(frame (b, c, S, S), state) -> (logits (b, K),
state)`` for causal temporal models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.conv import ConvGridEncoder
from seqlab.layers.linear import Linear
from seqlab.layers.mixer import make_mixer_config, mixer_spec
from seqlab.layers.norms import LayerNorm
from seqlab.layers.patch import PatchEmbedding
from seqlab.layers.transformer_blocks import TransformerEncoderLayer
from seqlab.models.captioner_decode import CaptionDecodeMixin, CaptionState
from seqlab.models.lm import LM, LMConfig
from seqlab.models.vit import ViT, ViTConfig
from seqlab.validation import (
    check_choices,
    check_divisible,
    check_dropout,
    check_nonnegative,
    check_positive_ints,
    check_special_ids,
)

__all__ = ["PRESETS", "VideoConfig", "VideoModel"]


@dataclass
class VideoConfig:
    head: Literal["action", "frames", "caption"] = "action"
    n_classes: int = 8
    """Actions ('action') or frame event classes ('frames'); unused by 'caption'."""
    n_frames: int = 16
    """The longest clip: the temporal Transformer's positions cover it; the bottleneck decoder needs exactly it."""
    frame_size: int = 32
    in_channels: int = 1
    frame_encoder: Literal["patch", "cnn", "vit"] = "patch"
    channels: list[int] = field(default_factory=lambda: [16, 32])
    """'cnn': channels of each stage (each halves the side); the grid side is frame_size / 2^stages."""
    d_frame: int | None = None
    """'patch' and 'cnn': width of the frame vector; None: d_model. ('vit': the spatial width d_spatial.)"""
    d_patch: int = 16
    """'patch': width of each patch's embedding."""
    patch_size: int = 4
    """'patch' and 'vit': the patch side."""
    d_spatial: int = 64
    n_spatial_layers: int = 2
    n_spatial_heads: int = 4
    temporal: Literal["mixer", "transformer"] = "mixer"
    mixer: str = "lstm"
    """'mixer': a registered token mixer (``seqlab.layers.list_mixers()``)."""
    mixer_config: dict[str, Any] | None = None
    d_model: int = 64
    """The temporal model's width, and the caption decoder's."""
    n_layers: int = 1
    d_ff: int | None = None
    """Channel MLP width of the temporal blocks; None: the LM stack's default (4 d_model, none for Mamba)."""
    n_heads: int = 4
    """Heads of the temporal Transformer and of the Transformer caption decoder."""
    pool: Literal["last", "mean"] = "last"
    """'action' with a mixer: the last frame's state (what an online model knows at the end) or the mean."""
    dropout: float = 0.0
    vocab_size: int = 48
    decoder: Literal["lstm", "transformer"] = "lstm"
    attention: Literal["none", "soft"] = "soft"
    d_embed: int | None = None
    d_attn: int | None = None
    n_decoder_layers: int = 1
    max_len: int = 24
    gate: bool = True
    attention_penalty: float = 0.0
    """λ of the doubly stochastic regularization over frames (soft LSTM attention; 0: none)."""
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        check_choices(self)
        ints = ("n_classes", "n_frames", "frame_size", "in_channels", "d_patch", "patch_size", "d_spatial")
        ints += ("n_spatial_layers", "n_spatial_heads", "d_model", "n_layers", "n_heads", "vocab_size")
        check_positive_ints(self, (*ints, "n_decoder_layers", "max_len"))
        check_positive_ints(self, ("d_frame", "d_embed", "d_attn"), allow_none=True)
        check_nonnegative(self, ("d_ff",), hint=" (0: no channel MLP) or None")
        check_nonnegative(self, ("attention_penalty",), numbers=True)
        check_dropout(self)
        self.channels = list(self.channels)
        if self.frame_encoder == "cnn" and self.frame_size % (1 << len(self.channels)):
            raise ValueError(
                f"frame_size={self.frame_size} must be divisible by 2^{len(self.channels)} "
                f"(one halving per CNN stage of channels={self.channels})"
            )
        if self.frame_encoder in ("patch", "vit") and self.frame_size % self.patch_size:
            raise ValueError(
                f"frame_size={self.frame_size} must be a multiple of patch_size={self.patch_size}"
            )
        if self.temporal == "transformer":
            check_divisible(self.d_model, self.n_heads)
        if self.temporal == "mixer":
            self.mixer_config = asdict(make_mixer_config(mixer_spec(self.mixer).name, self.mixer_config))
        if self.head == "caption":
            if self.decoder == "transformer":
                if self.attention != "soft":
                    raise ValueError(
                        "the Transformer decoder reads the frames through cross-attention: attention='soft'"
                    )
                check_divisible(self.d_model, self.n_heads)
            check_special_ids(self, self.vocab_size)

    @property
    def frame_width(self) -> int:
        return self.d_spatial if self.frame_encoder == "vit" else self.d_frame or self.d_model

    @property
    def n_outputs(self) -> int:
        """Width of the temporal model's head: classes, or the memory width the caption decoder reads."""
        return self.d_model if self.head == "caption" else self.n_classes

    @property
    def causal(self) -> bool:
        return self.temporal == "mixer"


class FrameEncoder(nn.Module):
    """frames (B, c, S, S) -> frame vectors (B, f): a patch or CNN grid through W and a GELU, or a ViT's class
    token."""

    def __init__(self, c: VideoConfig, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        if c.frame_encoder == "vit":
            vit = ViTConfig(
                image_size=c.frame_size,
                patch_size=c.patch_size,
                in_channels=c.in_channels,
                n_classes=0,  # a backbone: the pooled class token
                d_model=c.d_spatial,
                n_layers=c.n_spatial_layers,
                n_heads=c.n_spatial_heads,
                pool="cls",
                position="sincos",  # where the object is must be legible from the start (see the docstring)
                dropout=c.dropout,
            )
            self.vit = ViT(vit, **kw)
            return
        self.vit = None
        if c.frame_encoder == "cnn":
            self.grid = ConvGridEncoder(c.in_channels, c.channels, **kw)
            cells, width = (c.frame_size >> len(c.channels)) ** 2, c.channels[-1]
        else:
            self.grid = PatchEmbedding(c.patch_size, c.in_channels, c.d_patch, **kw)
            cells, width = (c.frame_size // c.patch_size) ** 2, c.d_patch
        self.proj = Linear(cells * width, c.frame_width, **kw)  # W vec(grid)

    def forward(self, frames: Tensor) -> Tensor:
        if self.vit is not None:
            return self.vit(frames)  # (B, d_spatial)
        g = self.grid(frames)  # (B, g², C)
        if isinstance(self.grid, PatchEmbedding):
            g = F.gelu(g)
        return F.gelu(self.proj(g.flatten(1)))  # (B, g² C) -> (B, f)


class TemporalTransformer(nn.Module):
    """ViViT's temporal encoder: (b, t, f) -> (b, 1 + t, K), the temporal class token first."""

    def __init__(self, c: VideoConfig, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        d = c.d_model
        self.embed = Linear(c.frame_width, d, **kw)
        self.cls = nn.Parameter(torch.zeros(1, 1, d, **kw))
        self.pos = nn.Parameter(torch.randn(c.n_frames + 1, d, **kw) * 0.02)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(
                d, c.n_heads, c.d_ff or 4 * d, dropout=c.dropout, activation="gelu", norm_first=True, **kw
            )
            for _ in range(c.n_layers)
        )
        self.norm = LayerNorm(d, **kw)
        self.head = Linear(d, c.n_outputs, **kw)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        h = torch.cat([self.cls.expand(b, 1, -1), self.embed(x)], 1)  # (b, 1 + t, d)
        h = self.drop(h + self.pos[: t + 1])
        for layer in self.layers:
            h = layer(h)  # bidirectional: no mask
        return self.head(self.norm(h))  # (b, 1 + t, K)


class VideoModel(CaptionDecodeMixin, nn.Module):
    """A clip model; see the module docstring.

    Examples::

        >>> model = VideoModel(VideoConfig(n_classes=5, frame_size=16, d_model=16))
        >>> model(torch.rand(2, 6, 1, 16, 16)).shape
        torch.Size([2, 5])
    """

    family = "video"

    def __init__(self, config: VideoConfig, device=None, dtype=None):
        super().__init__()
        self.config = c = config
        kw = {"device": device, "dtype": dtype}
        self.frames = FrameEncoder(c, **kw)
        if c.temporal == "transformer":
            self.temporal = TemporalTransformer(c, **kw)
        else:
            lm = LMConfig(
                mixer=c.mixer,
                mixer_config=c.mixer_config,
                d_model=c.d_model,
                n_layers=c.n_layers,
                d_ff=c.d_ff,
                dropout=c.dropout,
                d_input=c.frame_width,
                d_output=c.n_outputs,
                head_bias=True,
            )
            self.temporal = LM(lm, **kw)
        if c.head == "caption":
            self._build_decoder(c.d_model, c.n_frames, **kw)

    # ---- reading a clip ---------------------------------------------------------------------------------

    def check_clips(self, clips: Tensor) -> Tensor:
        c = self.config
        want = (c.in_channels, c.frame_size, c.frame_size)
        if not isinstance(clips, Tensor) or clips.dim() != 5 or tuple(clips.shape[2:]) != want:
            got = f"{clips.dtype} {tuple(clips.shape)}" if isinstance(clips, Tensor) else type(clips).__name__
            raise ValueError(f"expected clips (b, t, {', '.join(map(str, want))}) as floats, got {got}")
        if not clips.is_floating_point():
            raise ValueError(f"clips must be floats (standardized pixels), got {clips.dtype}")
        t = clips.size(1)
        if t < 1 or clips.size(0) < 1:
            raise ValueError(
                f"expected at least one clip of at least one frame, got clips {tuple(clips.shape)}"
            )
        if c.temporal == "transformer" and t > c.n_frames:
            raise ValueError(f"a clip of {t} frames is longer than the model's n_frames={c.n_frames}")
        if c.head == "caption" and c.attention == "none" and t != c.n_frames:
            raise ValueError(
                f"the bottleneck decoder (attention='none') reads exactly n_frames={c.n_frames} frames, got {t}"
            )
        return clips

    def encode(self, clips: Tensor) -> Tensor:
        """(b, t, c, S, S) -> the temporal model's outputs: (b, t, K), or (b, 1 + t, K) for the Transformer."""
        b, t = self.check_clips(clips).shape[:2]
        x = self.frames(clips.flatten(0, 1)).view(b, t, -1)  # (b t, c, S, S) -> (b, t, f)
        return self.temporal(x)

    def forward(self, clips: Tensor, tgt_in: Tensor | None = None, return_attention: bool = False):
        c = self.config
        if c.head == "caption":
            if tgt_in is None:
                raise ValueError("a caption model needs the caption so far: model(clips, tgt_in)")
            return self.decode(self.start(clips), tgt_in, return_attention)
        if tgt_in is not None or return_attention:
            raise ValueError(f"head={c.head!r} takes clips only: model(clips)")
        z = self.encode(clips)
        if c.temporal == "transformer":
            return z[:, 0] if c.head == "action" else z[:, 1:]  # the temporal class token, or the frames
        if c.head == "frames":
            return z  # (b, t, K)
        return z[:, -1] if c.pool == "last" else z.mean(1)  # (b, K)

    # ---- online, one frame at a time ----------------------------------------------------------------------

    def _check_online(self) -> None:
        c = self.config
        if not c.causal or c.head == "caption":
            raise ValueError(
                "online classification needs a causal temporal model ('mixer') and head 'action' or 'frames'; "
                f"this one is temporal={c.temporal!r}, head={c.head!r}"
            )
        if c.head == "action" and c.pool != "last":
            raise ValueError("online action labels read the last frame's state: pool='last'")

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> list:
        self._check_online()
        return self.temporal.init_state(batch_size, device=device, dtype=dtype)

    def step_frame(self, frame: Tensor, state: list | None = None) -> tuple[Tensor, list]:
        """One frame (b, c, S, S) -> the logits after it (b, K) and the new state (what ``forward`` gives at
        this frame for 'frames', or for 'action' on the clip so far)."""
        self._check_online()
        x = self.frames(self.check_clips(frame.unsqueeze(1))[:, 0])  # (b, f)
        return self.temporal.step(x, state)

    # ---- captions ---------------------------------------------------------------------------------------------

    def start(self, clips: Tensor) -> CaptionState:
        """The caption decoder's state before the first word: the frames' memory (b, t, d) read."""
        z = self.encode(clips)
        return self.start_decoder(z[:, 1:] if self.config.temporal == "transformer" else z)

    @torch.no_grad()
    def generate(
        self,
        clips: Tensor,
        max_new_tokens: int = 24,
        beam_size: int = 1,
        length_penalty: float = 0.0,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """clips (b, t, c, S, S) -> caption ids (b, 1 + n) [and α (b, n, t) over the frames]; see
        :meth:`seqlab.models.captioner_decode.CaptionDecodeMixin.generate`."""
        if self.config.head != "caption":
            raise ValueError(f"generate needs head='caption'; this model's head is {self.config.head!r}")
        return super().generate(clips, max_new_tokens, beam_size, length_penalty, return_attention)


def _test(**fields) -> dict:
    return {"frame_size": 16, "d_patch": 8, "d_model": 16, "dropout": 0.0, **fields}


PRESETS: dict[str, dict[str, Any]] = {
    # 32×32 grey clips of the generated moving objects (seqlab.tasks.clips); the lab swaps the mixer
    "video-lstm": {"mixer": "lstm", "d_model": 64},
    "video-attention": {"mixer": "attention", "d_model": 64},
    "video-mamba": {"mixer": "mamba", "d_model": 64},
    "vivit": {
        "frame_encoder": "vit",
        "temporal": "transformer",
        "patch_size": 8,
        "d_spatial": 64,
        "n_spatial_layers": 2,
        "d_model": 64,
        "n_layers": 2,
    },
    "video-captioner": {"head": "caption", "mixer": "gru", "d_model": 64},
    "test-video": _test(),
    "test-video-frames": _test(head="frames", n_classes=5),
    "test-video-cnn": _test(frame_encoder="cnn", channels=[8, 8]),
    "test-video-caption": _test(head="caption", vocab_size=24, max_len=12),
    "test-vivit": _test(
        frame_encoder="vit",
        temporal="transformer",
        patch_size=8,
        d_spatial=16,
        n_spatial_layers=1,
        n_spatial_heads=2,
        n_heads=2,
        n_layers=1,
    ),
}
