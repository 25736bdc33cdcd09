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
into the buffers. A float32 model on the CPU then steps through ``seqlab.kernels.decode`` (``decode.cpp``):
the same step as one C++ call, the whole token in one parallel region with no operator between the products
(the kernel's cache layout is (b, g, capacity, k)); float64, other devices, or a machine where the kernel
cannot be built take the torch-op step below, which is also the kernel's reference in the tests.

``LM.generate`` decodes through this class unless ``LM.why_not_fast_path()`` gives a reason
(``fast_path=False`` among them); the tests hold its logits to ``LM.step``'s. The decoder is for one linear generation: its state is the position it has
reached, and stepping from any other position is refused rather than silently reading overwritten slots.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlab.layers.attention import MultiheadAttention, SelfAttention
from seqlab.layers.fastpath import hook_reason
from seqlab.layers.mlp import ACTIVATIONS, MLP, SwiGLU
from seqlab.layers.norms import LayerNorm, RMSNorm
from seqlab.models.generation import check_token_ids, is_greedy

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
    hooked = hook_reason(model.named_modules())
    if hooked is not None:
        return hooked
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


_KERNEL_ACTS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}  # decode.cpp's activation codes


def _kernel_norm(norm) -> tuple[Tensor | None, Tensor | None, float]:
    bias = getattr(norm, "bias", None)
    return norm.weight, bias, norm.eps


def _contiguous(t: Tensor | None) -> Tensor | None:
    """A tensor as the kernel reads it: detached and contiguous (None stays None)."""
    return None if t is None else t.detach().contiguous()


def _kernel_layer(blk, k: Tensor, v: Tensor) -> list[Tensor | None]:
    """One block's tensors in decode.cpp's order: norm1 w, b; qkv w, b; out w, b; norm2 w, b; fc1 (or SwiGLU's
    gate) w, b; SwiGLU's up w, b; fc2 (or down) w, b; the key and value caches."""
    (n1w, n1b, _), (n2w, n2b, _) = _kernel_norm(blk.norm1), _kernel_norm(blk.norm2)
    attn, mlp = blk.mixer, blk.mlp
    fc1, up, fc2 = (mlp.gate, mlp.up, mlp.down) if isinstance(mlp, SwiGLU) else (mlp.fc1, None, mlp.fc2)
    ups = (None, None) if up is None else (up.weight, up.bias)
    tensors = [n1w, n1b, attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight, attn.out_proj.bias]
    tensors += [n2w, n2b, fc1.weight, fc1.bias, *ups]
    return [*(_contiguous(t) for t in [*tensors, fc2.weight, fc2.bias]), k, v]


def _decode_kernel(model):
    """decode.cpp's module when it applies to this model (float32 on the CPU, one kind of norm throughout) and
    builds; None otherwise, and the decoder takes the torch-op step."""
    w = model.head.weight
    if w.dtype != torch.float32 or w.device.type != "cpu":
        return None
    norms = [n for blk in model.blocks for n in (blk.norm1, blk.norm2)] + [model.norm]
    if len({isinstance(n, RMSNorm) for n in norms}) > 1:
        return None
    from seqlab.kernels.decode import load_decode_kernel

    return load_decode_kernel()


def _native_decoder(kernel, model, batch: int, capacity: int, buffers, cos, sin, rope):
    """``kernel.Decoder`` (see :func:`_decode_kernel`) over the model's weights and the (b, g, capacity, k) key
    and value caches in ``buffers``."""
    w, rms = model.head.weight, isinstance(model.norm, RMSNorm)
    layers = [_kernel_layer(blk, k, v) for blk, (k, v) in zip(model.blocks, buffers, strict=True)]
    fw, fb, feps = _kernel_norm(model.norm)
    pos_table = None if model.pos_embed is None else model.pos_embed.weight
    globals_ = [model.embed.weight, pos_table, cos, sin, fw, fb, w, model.head.bias]
    blk = model.blocks[0]  # every block has the same shapes, activation and norm eps (the config's)
    attn, mlp, swiglu = blk.mixer, blk.mlp, isinstance(blk.mlp, SwiGLU)
    f = (mlp.gate if swiglu else mlp.fc1).weight.size(0)
    act = _KERNEL_ACTS["silu" if swiglu else mlp.activation]
    rotary, interleaved = (0, 0) if rope is None else (rope.rotary_dim, int(rope.interleaved))
    h, g, kd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    sizes = [
        batch,
        w.size(1),
        h,
        g,
        kd,
        f,
        w.size(0),
        capacity,
        act,
        int(swiglu),
        int(rms),
        rotary,
        interleaved,
    ]
    scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(kd)
    consts = [blk.norm1.eps, blk.norm2.eps, feps, scale]
    globals_ = [_contiguous(t) for t in globals_]
    return kernel.Decoder(layers, globals_, [*sizes, torch.get_num_threads()], consts)


def _mlp_fn(mlp, vector: bool):
    """The channel mixer as a function of y on the module's weights (dropout is off in decoding)."""
    if isinstance(mlp, SwiGLU):
        gate, up, down = (_proj(p.weight, p.bias, vector) for p in (mlp.gate, mlp.up, mlp.down))
        return lambda y: down(F.silu(gate(y)) * up(y))
    act = ACTIVATIONS[mlp.activation]
    fc1, fc2 = _proj(mlp.fc1.weight, mlp.fc1.bias, vector), _proj(mlp.fc2.weight, mlp.fc2.bias, vector)
    return lambda y: fc2(act(fc1(y)))


class StaticCacheDecoder:
    """Greedy or sampled decoding of an attention LM with per-layer KV buffers of a fixed ``capacity`` (positions).

    Speaks what :func:`seqlab.models.generation.generate` needs of a model: ``decoder(ids, return_state=True)``
    reads a prompt (b, t) and returns ``(logits (b, t, v), pos)``; ``decoder.step(ids (b,), pos)`` returns
    ``(logits (b, v), pos + 1)``; ``context_limit``, ``training``, ``eval()`` and ``train()`` are the model's.
    With one sequence (b = 1) the residual stream is a vector (d,) and the projections matrix-vector products.
    ``use_kernel=False`` keeps a float32 model on the torch-op step instead of ``seqlab.kernels.decode``.
    """

    def __init__(self, model, capacity: int, use_kernel: bool = True):
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
        self.use_kernel, self.native = use_kernel, None

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
        if self.rope is not None:  # the rotation angles of every position this generation can reach
            self.cos, self.sin = self.rope.cos_sin(torch.arange(self.capacity, device=ids.device))
        kernel = _decode_kernel(self.model) if self.use_kernel else None
        self.native, self.buffers = None, []
        if kernel is not None:  # decode.cpp's layout: (b, g, capacity, k) for keys and values alike
            shape = (b, self.g, self.capacity, self.kd)
            self.buffers = [(c.k.new_empty(shape), c.v.new_empty(shape)) for c in caches]
            for (k, v), cache in zip(self.buffers, caches, strict=True):
                k[:, :, :t], v[:, :, :t] = cache.k, cache.v
            cos, sin = (self.cos, self.sin) if self.rope is not None else (None, None)
            self.native = _native_decoder(
                kernel, self.model, b, self.capacity, self.buffers, cos, sin, self.rope
            )
        else:
            for cache in caches:
                # keys transposed, (b g, k, capacity), so that the scores are a plain product; values (b g, capacity, k)
                k = cache.k.new_empty(b * self.g, self.kd, self.capacity)
                v = cache.v.new_empty(b * self.g, self.capacity, self.kd)
                k[..., :t], v[:, :t] = cache.k.flatten(0, 1).transpose(1, 2), cache.v.flatten(0, 1)
                self.buffers.append((k, v))
        self.pos = t
        return logits, t

    def loops(self, state: int, n: int) -> bool:
        """Whether ``greedy`` and ``sample`` would run n steps from ``state`` in one kernel call."""
        return self.native is not None and state == self.pos and self.pos + n <= self.capacity

    def greedy(self, ids: Tensor, state: int, n: int) -> Tensor | None:
        """Feed ids (b,) at the decoder's position, then n greedy steps in one kernel call -> tokens (b, n).

        None when the decoder is not on the kernel (the caller then steps token by token) or the buffers cannot
        hold the n positions; the tokens are those of n ``step`` calls each followed by ``argmax``.
        """
        if not self.loops(state, n):
            return None
        tokens = self.native.greedy(ids, self.pos, n)
        self.pos += n
        return tokens

    def sample(
        self,
        ids: Tensor,
        state: int,
        n: int,
        temperature: float,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor | None:
        """Feed ids (b,) at the decoder's position, then n sampled steps in one kernel call -> tokens (b, n).

        None when the decoder is not on the kernel or the buffers cannot hold the n positions. The tokens are
        those of n ``step`` calls each followed by :func:`seqlab.models.generation.sample_next` with the same
        arguments and generator state: the same law (temperature, top-k, top-p) and the same draws (those of
        ``torch.multinomial``), so only a near tie that float rounding of the probabilities breaks another way
        can tell them apart.
        """
        if is_greedy(temperature):  # 0, or so small that the kernel's float32 would divide 0 by 0
            return self.greedy(ids, state, n)
        if not self.loops(state, n):
            return None
        k = 0 if top_k is None else top_k
        p = 1.0 if top_p is None else top_p
        tokens = self.native.sample(ids, self.pos, n, float(temperature), k, float(p), generator)
        self.pos += n
        return tokens

    def step(self, ids: Tensor, state: int) -> tuple[Tensor, int]:
        """One token per row, ids (b,) -> logits (b, v), at the position the decoder has reached."""
        pos = self.pos
        if state != pos:
            raise ValueError(f"the decoder is at position {pos}; it cannot step from position {state}")
        if pos >= self.capacity:
            raise ValueError(f"the decoder's buffers are full ({self.capacity} positions)")
        if not isinstance(ids, Tensor) or ids.shape != (self.batch,):
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"expected ids of shape ({self.batch},), the prompt's batch; got {got}")
        check_token_ids(ids, self.model.embed.weight.size(0))  # both paths: -1 would wrap on the torch one
        if self.native is not None:
            self.pos = pos + 1
            return self.native.step(ids.long(), pos), pos + 1  # (b, v)
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
