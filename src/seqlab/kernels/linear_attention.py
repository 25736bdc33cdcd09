r"""Causal linear attention on the CPU as its recurrence, one C++ pass forward and two back
(``linear_attention.cpp``).

From the features q = φ(q), k = φ(k) (b, h, t, k), the values v (b, h, t, e) and a carried state (S, z) or None:

    S_i = S_{i-1} + k_i v_iᵀ,   z_i = z_{i-1} + k_i,   y_i = S_iᵀ q_i / (q_iᵀ z_i + eps)

:func:`linear_attention_recurrent` returns y (b, h, t, e) and the state after the last position, with the
kernel's own backward (gradients for q, k, v and the carried state; only y is saved, the state is rebuilt). It is
:class:`seqlab.layers.LinearAttention`'s causal fast path on the CPU: per position O(k e) work on a state of
O(k e), where the chunked parallel form (the path for parallel hardware) runs a few small batched products per
chunk. y comes out laid out as (b, t, h, e), what the output projection reads. A backward with
``create_graph=True`` differentiates the recurrent reference instead, so second derivatives are exact too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqlab.kernels.extension import CppExtension, cpu_float_reason

__all__ = [
    "EXTENSION",
    "check_causal_args",
    "linear_attention_recurrent",
    "linear_attention_recurrent_ref",
    "why_not_kernel",
]

EXTENSION = CppExtension(
    "linear_attention",
    "linear attention kernel",
    "causal linear attention runs its chunked form in PyTorch instead",
    headers=("vec_math.h",),
    openmp=True,
    label="linear attention",
)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__


def check_causal_args(owner: str, q, k, v, state) -> None:
    """A ValueError naming ``owner``, the expected and the given unless q, k are (b, h, t, k) and v (b, h, t, e),
    floating, and the state a pair (S (b, h, k, e), z (b, h, k)) or None. Shapes and dtypes only."""
    if not isinstance(q, Tensor) or q.dim() != 4:
        raise ValueError(f"{owner} expects q of shape (b, h, t, k), got {_shape(q)}")
    b, h, t, kd = q.shape
    if not isinstance(k, Tensor) or k.shape != q.shape:
        raise ValueError(f"{owner} expects k of q's shape (b, h, t, k) = {tuple(q.shape)}, got {_shape(k)}")
    if not isinstance(v, Tensor) or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{owner} expects v of shape (b, h, t, e) = ({b}, {h}, {t}, e), got {_shape(v)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_floating_point():
            raise ValueError(f"{owner} expects floating q, k and v, got {name} of {x.dtype}")
    if state is None:
        return
    e = v.size(-1)
    if not (isinstance(state, tuple | list) and len(state) == 2):
        raise ValueError(f"{owner}: state must be a pair (S, z) or None, got {type(state).__name__}")
    for name, x, want in (("S", state[0], (b, h, kd, e)), ("z", state[1], (b, h, kd))):
        if not isinstance(x, Tensor) or tuple(x.shape) != want:
            layout = "(b, h, k, e)" if name == "S" else "(b, h, k)"
            raise ValueError(f"{owner}: state {name} must be {layout} = {want}, got {_shape(x)}")


def linear_attention_recurrent_ref(
    q: Tensor, k: Tensor, v: Tensor, state: tuple[Tensor, Tensor] | None = None, eps: float = 1e-6
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The recurrence one position at a time in torch ops: q, k (b, h, t, k), v (b, h, t, e), state (S, z) or
    None -> y (b, h, t, e), (S, z) after the last position."""
    b, h, t, kd = q.shape
    S = q.new_zeros(b, h, kd, v.size(-1)) if state is None else state[0]
    z = q.new_zeros(b, h, kd) if state is None else state[1]
    outs = []
    for i in range(t):
        k_i, v_i = k[:, :, i].unsqueeze(-1), v[:, :, i].unsqueeze(-2)  # (b, h, k, 1), (b, h, 1, e)
        S = S + k_i * v_i  # (b, h, k, e)
        z = z + k[:, :, i]  # (b, h, k)
        num = (q[:, :, i].unsqueeze(-2) @ S).squeeze(-2)  # (b, h, 1, k) x (b, h, k, e) -> (b, h, e)
        den = (q[:, :, i] * z).sum(-1, keepdim=True)  # (b, h, 1)
        outs.append(num / (den + eps))
    return torch.stack(outs, dim=2), (S, z)


class _LinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, S0, z0, eps):
        y, S, z = EXTENSION.load().forward(q, k, v, S0, z0, eps)
        y = y.permute(0, 2, 1, 3)  # (b, t, h, e) -> (b, h, t, e)
        ctx.save_for_backward(q, k, v, S0, z0, y)
        ctx.eps = eps
        ctx.set_materialize_grads(False)  # an unused state's gradient stays None
        return y, S, z

    @staticmethod
    def backward(ctx, gy, gS, gz):
        q, k, v, S0, z0, y = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recurrent reference
            inputs = (q, k, v, S0, z0)
            wanted = [t for t, need in zip(inputs, ctx.needs_input_grad, strict=False) if need]
            with torch.enable_grad():
                state = None if S0 is None else (S0, z0)
                y_ref, (S, z) = linear_attention_recurrent_ref(q, k, v, state, ctx.eps)
                pairs = [(o, g) for o, g in ((y_ref, gy), (S, gS), (z, gz)) if g is not None]
                got = iter(
                    torch.autograd.grad(
                        [o for o, _ in pairs],
                        wanted,
                        [g for _, g in pairs],
                        create_graph=True,
                        allow_unused=True,
                    )
                )
            return (*(next(got) if need else None for need in ctx.needs_input_grad[:5]), None)
        if gy is None:
            gy = torch.zeros_like(y)
        elif gy.stride(-1) != 1:  # an expanded gradient (of a sum) has stride 0: the kernel reads whole rows
            gy = gy.contiguous()
        if (gS is None) != (gz is None):  # the kernel takes both or neither
            b, h, _, kd = q.shape
            gS = q.new_zeros(b, h, kd, v.size(-1)) if gS is None else gS
            gz = q.new_zeros(b, h, kd) if gz is None else gz
        dq, dk, dv, dS0, dz0 = EXTENSION.load(even_if_disabled=True).backward(
            gy, q, k, v, y, S0, z0, gS, gz, ctx.eps
        )
        states = (dS0, dz0) if S0 is not None else (None, None)
        return dq.permute(0, 2, 1, 3), dk.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3), *states, None


def why_not_kernel(q: Tensor) -> str | None:
    """None when :func:`linear_attention_recurrent` would run the kernel for the features q, else why not."""
    if (reason := cpu_float_reason(q)) is not None:
        return reason
    if q.dim() == 4 and (q.size(2) == 0 or q.numel() == 0):
        return "empty sizes go to torch"
    if torch.compiler.is_compiling():  # the chunked form is torch ops, which torch.compile traces
        return "torch.compile is tracing"
    return EXTENSION.unbuilt_reason()


def linear_attention_recurrent(
    q: Tensor, k: Tensor, v: Tensor, state: tuple[Tensor, Tensor] | None = None, eps: float = 1e-6
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """y (b, h, t, e) and (S, z) after the last position, through the kernel (the module docstring). The
    arguments are :func:`seqlab.layers.linear_attention.linear_attention_causal`'s, all of q's dtype and device
    (a ValueError naming the expected and the given otherwise), on the CPU, where :func:`why_not_kernel` says
    the kernel runs."""
    owner = "linear_attention_recurrent"
    check_causal_args(owner, q, k, v, state)
    for name, x in (("k", k), ("v", v), *(() if state is None else (("S", state[0]), ("z", state[1])))):
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(
                f"{owner}: {name} must have q's dtype and device ({q.dtype}, {q.device}), "
                f"got {x.dtype} on {x.device}"
            )
    S0, z0 = (None, None) if state is None else state
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    y, S, z = _LinearAttention.apply(q, k, v, S0, z0, float(eps))
    return y, (S, z)
