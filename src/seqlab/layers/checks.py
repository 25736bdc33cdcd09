"""Input and state checks at the token mixers' boundary: one message style for every layer.

Every check here compares attributes only (``dim``, ``shape``, ``dtype``, ``device``), never tensor values, so
it costs nothing next to the layer and may run on every ``step``. A mistake reads the same in every layer:

    "<Layer> expects x of shape (b, t, 16) with t >= 1, got (2, 0, 16)"
    "<Layer> state h must have shape (2, 32) (see init_state), got torch.float32 of shape (3, 32)"
    "<Layer> state h is torch.float64 on cpu, expected torch.float32 on cpu (as init_state makes it for x)..."

Under ``torch.autocast`` the layers compute in a lower precision than their parameters on purpose, so the
dtype comparisons are skipped there (shapes and devices are still checked).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from seqlab.layers.kv_cache import KVCache

__all__ = [
    "check_attention_call",
    "check_batch_size",
    "check_causal_step",
    "check_dtype",
    "check_input",
    "check_last_axis",
    "check_state",
    "dtype_checked",
]


def _got(v) -> str:
    return f"{v.dtype} of shape {tuple(v.shape)}" if isinstance(v, Tensor) else type(v).__name__


def dtype_checked(x: Tensor) -> bool:
    """Whether x's dtype must equal the parameters' (False inside ``torch.autocast`` for x's device)."""
    return not torch.is_autocast_enabled(x.device.type)


def check_batch_size(owner: str, batch_size) -> None:
    """``init_state``'s batch_size is an integer >= 0 (not a bool), before it reaches ``torch.zeros``.

    ``owner`` is the layer's name; the message reads "<owner>.init_state: batch_size must be an integer >= 0,
    got 1.5", worded as ``LM.init_state``'s. A size that torch.compile traces (a ``torch.SymInt``, from
    ``x.size(0)``) comes from a tensor's shape and passes unchecked.
    """
    if isinstance(batch_size, torch.SymInt):
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"{owner}.init_state: batch_size must be an integer >= 0, got {batch_size!r}")


def check_input(owner: str, x, d: int, param: Tensor, *, step: bool = False, what: str = "x") -> None:
    """x is a floating tensor (b, t, d) with t >= 1 (``step``: x_t (b, d)) on the parameters' device and dtype.

    torch.nn refuses a float64 input into a float32 layer too; seqlab says so before the first matmul.
    """
    shape = f"(b, {d})" if step else f"(b, t, {d}) with t >= 1"
    ok = isinstance(x, Tensor) and x.dim() == (2 if step else 3) and x.size(-1) == d
    if not ok or (not step and x.size(1) == 0):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{owner} expects {what} of shape {shape}, got {got}")
    check_dtype(owner, x, param, what)


def check_last_axis(owner: str, x, param: Tensor, d: int, expects: str | None = None) -> None:
    """x (..., d) of any rank >= 1 (a position-wise layer), floating, on the parameters' device and dtype;
    ``expects`` words the shape in the message (default "expects x of shape (..., d)")."""
    if not isinstance(x, Tensor) or x.dim() == 0 or x.size(-1) != d:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{owner} {expects or f'expects x of shape (..., {d})'}, got {got}")
    check_dtype(owner, x, param)


def check_dtype(owner: str, x: Tensor, param: Tensor, what: str = "x") -> None:
    """x is a floating tensor on the parameters' device, of their dtype (outside ``torch.autocast``)."""
    if not (x.is_floating_point() and x.device == param.device):
        raise ValueError(
            f"{owner} expects {what} to be a floating tensor on {param.device}, got {x.dtype} on {x.device}"
        )
    if x.dtype != param.dtype and dtype_checked(x):
        raise ValueError(
            f"{owner} has {param.dtype} parameters but {what} is {x.dtype}; convert one of them "
            f"(x.to({param.dtype}) or layer.to({x.dtype}))"
        )


def check_state(
    owner: str,
    state,
    expected: dict[str, Sequence[int | None]],
    x: Tensor,
    dtypes: torch.dtype | tuple[torch.dtype, ...],
    layout: str = "",
) -> None:
    """``state`` matches what ``init_state`` makes for x: one tensor (one entry in ``expected``) or a tuple of
    them in ``expected``'s order, each of the given shape (None: any size), dtype (one of ``dtypes``) and x's
    device. ``layout`` names the dimensions in the message: "(b, expand * d_model)"."""
    names = list(expected)
    parts = (state,) if len(names) == 1 else state
    if len(names) > 1 and not (isinstance(state, tuple | list) and len(state) == len(names)):
        raise ValueError(
            f"{owner} state must be a tuple ({', '.join(names)}) (see init_state), got {type(state).__name__}"
        )
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    for name, s, shape in zip(names, parts, expected.values(), strict=True):
        label = f"state {name}" if name else "state"
        if not (
            isinstance(s, Tensor)
            and s.dim() == len(shape)
            and all(e is None or e == n for e, n in zip(shape, s.shape, strict=True))
        ):
            want = (
                "("
                + ", ".join("*" if e is None else str(e) for e in shape)
                + ("," if len(shape) == 1 else "")
                + ")"
            )
            want = f"{layout} = {want}" if layout else want
            raise ValueError(f"{owner} {label} must have shape {want} (see init_state), got {_got(s)}")
        if s.device != x.device or (s.dtype not in dtypes and dtype_checked(x)):
            raise ValueError(
                f"{owner} {label} is {s.dtype} on {s.device}, expected {dtypes[0]} on {x.device} "
                "(as init_state makes it for x); move the state with .to()"
            )


def check_attention_call(layer, query, key, value, mask, state) -> None:
    """A MultiheadAttention call's arguments: shapes, dtypes and devices, a mask of at most 4 dims, and a
    KV cache as ``layer.init_state`` makes it (attributes only: no value is read)."""
    name, weight = type(layer).__name__, layer.out_proj.weight
    check_input(name, query, layer.d_model, weight, what="query")
    if key is None and not layer._qkv_same_embed_dim:
        raise ValueError(
            f"{name} has kdim={layer.kdim}, vdim={layer.vdim} (d_model={layer.d_model}): it attends to a memory of "
            "those widths, so it needs key and value (cross-attention), not self-attention"
        )
    if key is not None and value is None and layer.vdim != layer.kdim:
        raise ValueError(
            f"{name}: value defaults to key, but vdim={layer.vdim} differs from kdim={layer.kdim}"
        )
    for what, m, width in (("key", key, layer.kdim), ("value", value, layer.vdim)):
        if m is not None:
            check_input(name, m, width, weight, what=what)
            if m.size(0) != query.size(0):
                raise ValueError(f"{name}: {what} has batch {m.size(0)} but query has {query.size(0)}")
    if key is not None and value is not None and key.size(1) != value.size(1):
        raise ValueError(
            f"{name}: key and value must hold the same positions, got {key.size(1)} and {value.size(1)}"
        )
    if mask is not None and (not isinstance(mask, Tensor) or mask.dim() > 4):
        got = f"shape {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name} mask must be a boolean tensor broadcastable to (b, h, t_q, t_k), got {got}")
    if state is not None:
        if not isinstance(state, KVCache):
            raise ValueError(f"{name} state must be a KVCache (see init_state), got {type(state).__name__}")
        shape = (query.size(0), layer.n_kv_heads, None, layer.head_dim)
        check_state(name, (state.k, state.v), {"k": shape, "v": shape}, query, query.dtype)
        if state.v.size(2) != state.k.size(2) or not isinstance(state.pos, Tensor):
            raise ValueError(f"{name} state: k and v must hold the same positions and pos must be a tensor")
        if state.padded and key is None:
            raise ValueError(
                f"{name} state is the KV cache of a right-padded batch (a forward with a padding mask): continuing "
                "it would let the next tokens attend to the padded keys, at the wrong positions for the shorter "
                "rows; continue from a cache built without padding (each row alone, or rows of one length)"
            )


def check_causal_step(layer) -> None:
    """``step`` decodes position by position; a bidirectional layer's outputs read later positions, so its steps
    could not equal its forward (the mixers' first law): a clear error instead of other numbers."""
    if not layer.causal:
        raise ValueError(
            f"{type(layer).__name__}.step decodes one position at a time, which only a causal layer can do; this "
            "one has causal=False (each output reads every position): run forward over the whole sequence"
        )


def check_user_mask(mask: Tensor | None, shape: tuple[int, int, int, int], cached: int) -> None:
    """The caller's boolean mask broadcasts to shape = (b, h, t_q, t_k), checked before the causal structure is
    combined with it (where a mismatch would surface as torch's broadcast error); with a KV cache, t_k counts
    the ``cached`` keys before this call's."""
    if mask is None or not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        return  # no mask, or one that combine_masks refuses with its own message
    try:
        torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        hint = f"; t_k counts the {cached} cached keys before this call's {shape[2]}" if cached else ""
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (b, h, t_q, t_k) = {shape}{hint}"
        ) from None


def check_proj_size(name: str, mode: str, proj_size, hidden_size: int) -> int:
    """A recurrent layer's ``proj_size`` by torch.nn's rules: an integer, 0 (none) or in [1, hidden_size), and
    only for the LSTM."""
    if isinstance(proj_size, bool) or not isinstance(proj_size, int) or not 0 <= proj_size < hidden_size:
        raise ValueError(
            f"{name}: proj_size must be an integer in [0, hidden_size={hidden_size}), got {proj_size!r}"
        )
    if proj_size and mode != "LSTM":
        raise ValueError(f"{name}: proj_size is only supported for LSTM, got proj_size={proj_size}")
    return proj_size
