r"""Fast KV-cache decoding for attention LMs (:class:`seqlab.models.lm.LM` with the attention mixer: GPT-2,
Llama-style): the same model, stepped on the bare kernels.

``LM.step`` is the reference: one token goes through the modules (block, attention, norms, MLP), each
checking its input, building its state object and calling torch's kernels. At batch 1 a 4 x 256 model does
17 matrix-vector products per token and about a hundred small ops around them, so on a CPU the Python around
the kernels costs as much as the products. :class:`StaticCacheDecoder` does the same arithmetic with none
of it:

* one key and one value buffer per layer, allocated for the whole generation at the prompt: values
  (b·g, capacity, k) and keys transposed, (b·g, k, capacity), so that the scores are a plain product; each
  new token writes one slot of each in place (no growing cache, no state objects);
* one query against the cache needs no mask and no fused kernel: two batched products and a softmax,

      s = q Kᵀ · scale   (b·g, h/g, t)        o = softmax(s) V   (b·g, h/g, k)

  where the h/g query heads that share a key/value head are the rows of one product (grouped-query
  attention without repeating K and V);
* norms, MLPs and projections are called as functions on the module's own weights; RoPE reads its angles
  from a table computed once per generation.

The prompt itself is read by the model's ordinary forward (parallel, fused SDPA) and its caches are copied
into the buffers. ``LM.generate`` decodes through this class unless ``LM.why_not_fast_path()`` gives a reason
(``fast_path=False`` among them); the tests hold its logits to ``LM.step``'s. The decoder is for one linear generation: its state is the position it has
reached, and stepping from any other position is refused rather than silently reading overwritten slots.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.attention import MultiheadAttention, SelfAttention
from seqlab.layers.mlp import _ACTS, MLP, SwiGLU
from seqlab.layers.norms import LayerNorm, RMSNorm

__all__ = ["StaticCacheDecoder", "why_not_static_decode"]


def why_not_static_decode(model) -> str | None:
    """Why ``LM.generate`` would step through the modules instead of this decoder, or None if it can use it.

    The decoder computes what a pre-norm attention block computes, so it stands in only for that: another
    mixer, another layout, a hook on any module (which decoding would skip) or a swapped-in block part sends
    generation down the module path.
    """
    c = model.config
    if c.layout != "pre-norm" or c.d_input is not None:
        return f"the decoder reads tokens through pre-norm blocks; this model has layout={c.layout!r}" + (
            "" if c.d_input is None else " and feature inputs"
        )
    hooks = nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return "global forward hooks are registered"
    for name, m in model.named_modules():
        if m._forward_hooks or m._forward_pre_hooks:
            return f"module {name or 'model'} has forward hooks"
    norms = (nn.LayerNorm, LayerNorm, RMSNorm)
    for i, blk in enumerate(model.blocks):
        parts = (blk.norm1, blk.mixer, blk.norm2, blk.mlp)
        kinds = (norms, (MultiheadAttention, SelfAttention), norms, (MLP, SwiGLU))
        for part, kind in zip(parts, kinds, strict=True):
            if type(part) not in kind:
                return f"block {i} has a {type(part).__name__}, which the decoder does not know"
        if blk.mixer.window is not None:
            return f"block {i} attends through a sliding window"
        if not blk.mixer.causal:
            return f"block {i} attends without a causal mask"
    if type(model.norm) not in norms:
        return f"the final norm is a {type(model.norm).__name__}, which the decoder does not know"
    return None


def _norm_fn(norm):
    """The norm as a function of x (..., d): LayerNorm through torch.layer_norm, RMSNorm through its forward."""
    if isinstance(norm, RMSNorm):
        return norm.forward
    shape, w, b, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
    return lambda x: torch.layer_norm(x, shape, w, b, eps)  # F.layer_norm without its Python checks


def _proj(weight: Tensor, bias: Tensor | None, vector: bool):
    """F.linear(x, weight, bias) as one BLAS call: ``addmv`` for one row x (d,), ``addmm`` for rows x (b, d).

    A missing bias becomes zeros (adding 0 changes no value), so every projection is the same single call.
    """
    bias = weight.new_zeros(weight.size(0)) if bias is None else bias
    if vector:
        return lambda x: torch.addmv(bias, weight, x)  # bias + W x
    weight_t = weight.t()
    return lambda x: torch.addmm(bias, x, weight_t)  # bias + x Wᵀ


def _mlp_fn(mlp, vector: bool):
    """The channel mixer as a function of y on the module's weights (dropout is off in decoding)."""
    if isinstance(mlp, SwiGLU):
        gate, up, down = (_proj(p.weight, p.bias, vector) for p in (mlp.gate, mlp.up, mlp.down))
        return lambda y: down(F.silu(gate(y)) * up(y))
    act = _ACTS[mlp.activation]
    fc1, fc2 = _proj(mlp.fc1.weight, mlp.fc1.bias, vector), _proj(mlp.fc2.weight, mlp.fc2.bias, vector)
    return lambda y: fc2(act(fc1(y)))


class StaticCacheDecoder:
    """Greedy or sampled decoding of an attention LM with per-layer KV buffers of a fixed ``capacity`` (positions).

    Speaks what :func:`seqlab.models.generation.generate` needs of a model: ``decoder(ids, return_state=True)``
    reads a prompt (b, t) and returns ``(logits (b, t, v), pos)``; ``decoder.step(ids (b,), pos)`` returns
    ``(logits (b, v), pos + 1)``; ``context_limit``, ``training``, ``eval()`` and ``train()`` are the model's.
    With one sequence (b = 1) the residual stream is a vector (d,) and the projections matrix-vector products.
    """

    def __init__(self, model, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be a positive number of positions, got {capacity}")
        limit = model.context_limit
        self.model, self.capacity = model, capacity if limit is None else min(capacity, limit)
        attn = model.blocks[0].mixer
        self.h, self.g, self.kd = attn.n_heads, attn.n_kv_heads, attn.head_dim
        self.scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(self.kd)
        self.rope = attn.rope
        self.final_norm = _norm_fn(model.norm)
        self.layers, self.buffers, self.batch, self.pos = [], [], 0, 0

    def _build(self, batch: int) -> None:
        """Each layer as (norm1, qkv, split sizes, out, norm2, mlp), the projections for this batch size."""
        vector = batch == 1
        self.layers = [
            (
                _norm_fn(blk.norm1),
                _proj(blk.mixer.in_proj_weight, blk.mixer.in_proj_bias, vector),
                blk.mixer._split_sizes(),
                _proj(blk.mixer.out_proj.weight, blk.mixer.out_proj.bias, vector),
                _norm_fn(blk.norm2),
                _mlp_fn(blk.mlp, vector),
            )
            for blk in self.model.blocks
        ]
        self.head = _proj(self.model.head.weight, self.model.head.bias, vector)
        lead = () if vector else (batch,)
        self.o_shape = (*lead, self.h * self.kd)
        self.batch = batch

    # the model-like surface that generate() uses
    @property
    def context_limit(self) -> int | None:
        return self.model.context_limit

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def __call__(self, ids: Tensor, return_state: bool = True) -> tuple[Tensor, int]:
        """Read a prompt (b, t) with the model's parallel forward and load its caches into fresh buffers."""
        b, t = ids.shape
        if t > self.capacity:
            raise ValueError(f"a prompt of {t} positions does not fit the decoder's capacity {self.capacity}")
        logits, caches = self.model(ids, return_state=True)  # (b, t, v), KVCache (b, g, t, k) per layer
        if b != self.batch:
            self._build(b)
        self.buffers = []
        for cache in caches:
            k = cache.k.new_empty(b * self.g, self.kd, self.capacity)  # keys transposed: (b g, k, capacity)
            v = cache.v.new_empty(b * self.g, self.capacity, self.kd)  # (b g, capacity, k)
            k[..., :t], v[:, :t] = cache.k.flatten(0, 1).transpose(1, 2), cache.v.flatten(0, 1)
            self.buffers.append((k, v))
        if self.rope is not None:  # the rotation angles of every position this generation can reach
            self.cos, self.sin = self.rope.cos_sin(torch.arange(self.capacity, device=ids.device))
        self.pos = t
        return logits, t

    def step(self, ids: Tensor, state: int) -> tuple[Tensor, int]:
        """One token per row, ids (b,) -> logits (b, v), at the position the decoder has reached."""
        pos = self.pos
        if state != pos:
            raise ValueError(f"the decoder is at position {pos}; it cannot step from position {state}")
        if pos >= self.capacity:
            raise ValueError(f"the decoder's buffers are full ({self.capacity} positions)")
        if ids.shape != (self.batch,):
            raise ValueError(
                f"expected ids of shape ({self.batch},), the prompt's batch; got {tuple(ids.shape)}"
            )
        m, b = self.model, self.batch
        h, g, kd, t = self.h, self.g, self.kd, pos + 1
        unused = m.embed.weight.new_empty(())  # baddbmm's input, ignored at beta=0
        table = m.embed.weight
        x = table[int(ids[0])] if b == 1 else F.embedding(ids, table)  # (d,) (a row, never written) or (b, d)
        if m.pos_embed is not None:
            x = x + m.pos_embed.weight[pos]
        for (norm1, qkv, sizes, out, norm2, mlp), (kb, vb) in zip(self.layers, self.buffers, strict=True):
            q, k, v = qkv(norm1(x)).split_with_sizes(sizes, -1)  # (b, h k), (b, g k), (b, g k)
            if self.rope is not None:
                cos, sin = self.cos[pos : pos + 1], self.sin[pos : pos + 1]  # (1, k/2) each
                q = self.rope.rotate(q.view(b, h, 1, kd), cos, sin)
                k = self.rope.rotate(k.view(b, g, 1, kd), cos, sin)
            kb[:, :, pos] = k.reshape(b * g, kd)  # write this position's key and value in place
            vb[:, pos] = v.reshape(b * g, kd)
            q = q.reshape(b * g, h // g, kd)  # the query heads of one key/value head are rows of one product
            s = torch.baddbmm(unused, q, kb[..., :t], beta=0.0, alpha=self.scale)  # (b g, h/g, t)
            o = torch.bmm(torch.softmax(s, dim=-1), vb[:, :t])  # (b g, h/g, t) x (b g, t, k) -> (b g, h/g, k)
            x = out(o.view(self.o_shape)).add_(x)  # residual
            x = mlp(norm2(x)).add_(x)
        self.pos = t
        return self.head(self.final_norm(x)).view(b, -1), t  # (b, v)
