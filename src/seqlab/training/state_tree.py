"""Nested trainer state (optimizer moments, RNG states, carried recurrent states) as safetensors + JSON.

``flatten`` replaces every tensor in a nested dict/list/tuple by a reference into a flat tensor dict (saved as
safetensors by ``save_tensors``) and leaves a JSON-able structure; ``unflatten`` rebuilds it. Nothing is pickled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import Tensor

__all__ = ["flatten", "save_tensors", "unflatten"]


def save_tensors(tensors: dict[str, Tensor], path: Path) -> None:
    """safetensors' save_file; its failure to write (a full disk) as an OSError naming the file, not a bug."""
    try:
        save_file(tensors, str(path))
    except SafetensorError as e:
        raise OSError(f"could not write {path}: {e}") from None


def flatten(obj: Any, prefix: str, tensors: dict[str, Tensor]) -> Any:
    """Replace every tensor in a nested dict/list/tuple by a reference ``{"__tensor__": key}``."""
    if isinstance(obj, Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().contiguous().cpu()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[k, flatten(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, list | tuple):
        items = [flatten(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in trainer state")


def unflatten(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(unflatten(v, tensors) for v in obj["__tuple__"])
        return {k: unflatten(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    return obj
