"""A run: model + task + training settings, from a YAML file and dotted overrides.

    model: {name: lstm-lm-small, dropout: 0.2}       # a preset and config fields to override
    task:  {name: shakespeare, seq_len: 128}          # a task and its arguments
    train: {steps: 3000, lr: 2.0e-3}                  # seqlab.training.TrainConfig fields
    out: runs/lstm-shakespeare

Overrides use the same paths: ``--model.n_layers=2 --train.steps=3000``. Every key is checked against the
config dataclass or the task's signature, so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

import torch
import yaml

SECTIONS = ("model", "task", "train")
DEFAULT_RUN: dict[str, Any] = {
    "model": {"name": "lstm-lm-small"},
    "task": {"name": "shakespeare"},
    "train": {},
    "out": None,
}


def parse_value(text: str) -> Any:
    """YAML scalar, with numbers like ``3e-4`` (which YAML 1.1 reads as strings) read as floats."""
    value = yaml.safe_load(text) if text != "" else ""
    if isinstance(value, str):
        for conv in (int, float):
            try:
                return conv(value)
            except ValueError:
                pass
    return value


def load_run_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run file not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a run file is a mapping with sections {SECTIONS} and 'out'")
    return data


def merge_run(base: dict[str, Any], *updates: dict[str, Any]) -> dict[str, Any]:
    run = copy.deepcopy(base)
    for upd in updates:
        for key, value in upd.items():
            if key not in (*SECTIONS, "out"):
                raise ValueError(f"unknown run section {key!r}; a run has {list(SECTIONS)} and 'out'")
            if key == "out":
                run["out"] = value
            else:
                if not isinstance(value, dict):
                    raise ValueError(f"run section {key!r} must be a mapping, got {value!r}")
                run.setdefault(key, {}).update(value)
    return run


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``['--model.n_layers=2', '--train.lr', '3e-3']`` -> ``{'model': {'n_layers': 2}, 'train': {'lr': 0.003}}``."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ValueError(f"unrecognised argument {arg!r}; overrides look like --model.n_layers=2")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise ValueError(f"override {arg!r} has no value")
            value, i = args[i + 1], i + 1
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field or "." in field:
            raise ValueError(
                f"override {arg!r} must name a field of one of {list(SECTIONS)}, e.g. --train.steps=100"
            )
        out.setdefault(section, {})[field] = parse_value(value)
        i += 1
    return out


def _coerce(value: Any, hint: Any) -> Any:
    """Numbers written as strings (YAML's '3e-4') become the number a field annotated int/float expects."""
    names = str(hint)
    if isinstance(value, str) and ("float" in names or "int" in names):
        try:
            return float(value) if "float" in names else int(value)
        except ValueError:
            return value
    if isinstance(value, int) and not isinstance(value, bool) and "float" in names and "int" not in names:
        return float(value)
    return value


def coerce_fields(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {k: _coerce(v, hints.get(k)) for k, v in fields.items()}


def build_run(run: dict[str, Any]):
    """(model, task, train_config) for a run dict. The task is built first: it fixes e.g. the vocabulary."""
    from seqlab.models import PRESETS, create, make_config
    from seqlab.tasks import create_task, list_tasks, task_signature
    from seqlab.training import TrainConfig

    model_fields = dict(run.get("model") or {})
    name = model_fields.pop("name", None)
    if name is None:
        raise ValueError("the run names no model: set model.name (see `seqlab list`)")
    task_fields = dict(run.get("task") or {})
    task_name = task_fields.pop("name", None)
    if task_name is None:
        raise ValueError(f"the run names no task: set task.name, one of {', '.join(list_tasks())}")
    sig = task_signature(task_name)
    task_fields = {
        k: _coerce(v, sig.parameters[k].annotation) if k in sig.parameters else v
        for k, v in task_fields.items()
    }
    train_fields = dict(run.get("train") or {})
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    if set(train_fields) - known:
        raise ValueError(
            f"unknown train field(s) {sorted(set(train_fields) - known)}; known: {sorted(known)}"
        )
    train = TrainConfig(**coerce_fields(TrainConfig, train_fields))
    task = create_task(task_name, **task_fields)
    if name not in PRESETS:
        create(name)  # raises the 'unknown model' error with the list of presets
    family = PRESETS[name][0]
    config_cls = type(make_config(family, PRESETS[name][1]))
    overrides = {**coerce_fields(config_cls, model_fields), **task.model_overrides()}
    torch.manual_seed(train.seed)  # the initial weights depend on the seed only
    model = create(name, **overrides)
    return model, task, train


def default_out(run: dict[str, Any]) -> Path:
    return Path("runs") / f"{run['model'].get('name', 'model')}-{run['task'].get('name', 'task')}"
