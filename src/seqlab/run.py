"""A run: model + task + training settings, from a YAML file and dotted overrides.

    model: {name: lstm-lm-small, dropout: 0.2}       # a preset and config fields to override
    task:  {name: shakespeare, seq_len: 128}          # a task and its arguments
    train: {steps: 3000, lr: 2.0e-3}                  # seqlab.training.TrainConfig fields
    out: runs/lstm-shakespeare

Overrides use the same paths: ``--model.n_layers=2 --train.steps=3000``. Every key is checked against the
config dataclass or the task's signature, so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from seqlab.console import said_if_slow
from seqlab.outfiles import nearest_existing
from seqlab.run_overrides import is_text_hint, parse_overrides, parse_value  # noqa: F401 (seqlab.run's API)

SECTIONS = ("model", "task", "train")
DEFAULT_RUN: dict[str, Any] = {
    "model": {"name": "lstm-lm-small"},
    "task": {"name": "shakespeare"},
    "train": {},
    "out": None,
}


def load_run_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not valid YAML: {str(e).splitlines()[0]} ({_where(e)})") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a UTF-8 text file (byte {e.start})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a run file is a mapping with sections {SECTIONS} and 'out'")
    return data


def _where(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "see the file"


def check_out_dir(path: Path) -> Path:
    """A run directory that can be created or reused: not a file, not under a file, writable. Checked before
    any model is built, so a run that cannot save fails at once."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {str(path)!r} is a file; a run writes a directory there")
    parent = nearest_existing(path)
    if not parent.is_dir():
        raise ValueError(f"--out {str(path)!r} lies under {str(parent)!r}, which is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {str(path)!r}: {str(parent)!r} is not writable")
    return path


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


def _coerce(value: Any, hint: Any) -> Any:
    """Numbers written as strings (YAML's '3e-4') become the number a field annotated int/float expects, and a
    number the text a field annotated str expects (a run file's ``source: 1984``, a file of that name)."""
    if is_text_hint(hint) and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
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


def build_task(run: dict[str, Any], saved: bool = False, described: dict[str, Any] | None = None):
    """The task of a run dict, its fields coerced to its arguments' types (``saved``: a checkpoint's settings,
    with ``described`` its saved task description where the caller has it: ``source_settings.rebuilding_saved``)."""
    from seqlab.tasks import create_task, task_signature
    from seqlab.tasks.source_settings import rebuilding_saved

    task_name = _task_name(run)
    task_fields = {k: v for k, v in (run.get("task") or {}).items() if k != "name"}
    params = task_signature(task_name).parameters
    task_fields = {k: _coerce(v, params[k].annotation) if k in params else v for k, v in task_fields.items()}
    with said_if_slow(f"preparing the data of task {task_name!r}"), rebuilding_saved(saved, described):
        return create_task(task_name, **task_fields)


def train_config(run: dict[str, Any]):
    """The run's TrainConfig, its fields checked (an unknown one named with the known ones)."""
    from seqlab.training import TrainConfig

    train_fields = dict(run.get("train") or {})
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown := set(train_fields) - known:
        raise ValueError(f"unknown train field(s) {sorted(unknown)}; known: {sorted(known)}")
    return TrainConfig(**coerce_fields(TrainConfig, train_fields))


def _task_name(run: dict[str, Any]) -> str:
    from seqlab.tasks import list_tasks

    task_name = (run.get("task") or {}).get("name")
    if not task_name:
        raise ValueError(f"the run names no task: set task.name, one of {', '.join(list_tasks())}")
    return task_name


def run_names(run: dict[str, Any]) -> tuple[str, str]:
    """(model name, task name) of a run dict; a ValueError saying which to set when one is missing."""
    name = (run.get("model") or {}).get("name")
    if not name:
        raise ValueError("the run names no model: set model.name (see `seqlab list`)")
    return name, _task_name(run)


def check_names(run: dict[str, Any]) -> None:
    """What :func:`build_run` refuses in a run's names and fields, found without reading any data: the model
    and task names, a task argument or train field that does not exist, a model field its preset lacks."""
    import torch

    from seqlab.models import create
    from seqlab.tasks import check_task_arguments

    name, task_name = run_names(run)
    train_config(run)
    check_task_arguments(task_name, {k: v for k, v in (run.get("task") or {}).items() if k != "name"})
    fields = {k: v for k, v in (run.get("model") or {}).items() if k != "name"}
    create(name, device=torch.device("meta"), **coerce_fields(type(_preset_config(name)), fields))


def _preset_config(name: str):
    from seqlab.models import PRESETS, create, make_config

    if name not in PRESETS:
        create(name)  # raises the 'unknown model' error with the list of presets
    return make_config(*PRESETS[name])


def build_run(run: dict[str, Any], saved: bool = False, described: dict[str, Any] | None = None):
    """(model, task, train_config) of a run dict (``saved``, ``described``: as for :func:`build_task`); the task
    is built first."""
    import torch

    from seqlab.models import PRESETS, create
    from seqlab.tasks import task_families

    name, task_name = run_names(run)
    model_fields = {k: v for k, v in (run.get("model") or {}).items() if k != "name"}
    train = train_config(run)
    if train.threads:  # pinned: the data is prepared on that many threads too (the trainer keeps the count)
        torch.set_num_threads(train.threads)
    config_cls = type(_preset_config(name))
    family, families = PRESETS[name][0], task_families(task_name)  # checked before the data is built
    if family not in families:
        fit = [n for n, (f, _) in PRESETS.items() if f in families and not n.startswith("test-")][:6]
        raise ValueError(
            f"model {name!r} is of family {family!r}; the task {task_name!r} trains models of family "
            f"{' or '.join(map(repr, families))}, e.g. {', '.join(fit)} (`seqlab list` shows them all)"
        )
    from seqlab.commands_doctor import require, task_needs

    require(task_needs(task_name, run.get("task") or {}), f"the task {task_name!r}")  # before building data
    task = build_task(run, saved, described)
    fixed, mine = task.model_overrides(), coerce_fields(config_cls, model_fields)
    clash = {k: (v, fixed[k]) for k, v in mine.items() if k in fixed and v != fixed[k]}
    if clash:
        said = ", ".join(
            f"model.{k}={given!r} (the task needs {needed!r})" for k, (given, needed) in clash.items()
        )
        raise ValueError(f"the task {task_name!r} fixes these model fields: {said}; drop them from the run")
    overrides = {**mine, **fixed}
    torch.manual_seed(train.seed)  # the initial weights depend on the seed only
    model = create(name, **overrides)
    _check_carried_state(model, task)
    _check_positions(model, task)
    return model, task, train


def _check_positions(model, task) -> None:
    """A model with a table of learned positions reads windows of at most max_seq_len tokens: said before step 1
    with the two settings to change (it failed in the first step, naming neither)."""
    if hasattr(task, "check_model"):  # a task's own limits, e.g. translation's longest sentence
        task.check_model(model)
    cfg, seq_len = getattr(model, "config", None), getattr(task, "seq_len", None)
    if getattr(cfg, "position", "none") == "none" or not isinstance(seq_len, int):
        return
    if seq_len > cfg.max_seq_len:
        raise ValueError(
            f"task.seq_len={seq_len} is longer than the model's table of {cfg.max_seq_len} learned positions; "
            f"lower task.seq_len or raise model.max_seq_len"
        )


def _check_carried_state(model, task) -> None:
    """A stateful task (truncated BPTT) carries each layer's state from batch to batch: full attention's state
    is a KV cache that would grow every batch (and run past the positions the model has). Said before step 1."""
    cfg = getattr(model, "config", None)
    mixer_config = getattr(cfg, "mixer_config", None) or {}
    if not task.stateful or getattr(cfg, "mixer", None) != "attention":
        return
    if getattr(cfg, "position", "none") != "none":
        raise ValueError(
            f"task.sampling='stream' carries the model's state from batch to batch, and the positions of a "
            f"carried KV cache keep growing past the learned table's max_seq_len={cfg.max_seq_len}; use "
            f"task.sampling='random' (independent windows, as GPT is trained)"
        )
    if mixer_config.get("window") is None:
        raise ValueError(
            "task.sampling='stream' carries the model's state from batch to batch, and full attention's state "
            "is a KV cache that grows every batch; use task.sampling='random' (independent windows, as GPT "
            "is trained) or a sliding window (model.mixer_config={window: N})"
        )


def default_out(run: dict[str, Any]) -> Path:
    return Path("runs") / f"{run['model'].get('name', 'model')}-{run['task'].get('name', 'task')}"


_PATH_FIELDS = ("path", "data_dir", "captions")  # task fields that only ever name files or folders


def _absolute_data_paths(task: dict[str, Any]) -> None:
    """The task's data files and folders as absolute paths, in place, so that the run (and ``eval``,
    ``forecast``, ``viz`` on its checkpoints) reads the same data from any working directory: the path fields,
    and a ``source`` that names an existing file (a separator or a suffix: not a built-in name)."""
    for key, value in task.items():
        if not isinstance(value, str) or not value.strip():
            continue
        path = Path(value).expanduser()
        # the text task's source is always a file ("mycorpus" too); elsewhere a bare name may be a built-in
        file_source = key == "source" and (os.sep in value or path.suffix or task.get("name") == "text")
        if (key in _PATH_FIELDS or file_source) and path.exists():
            task[key] = str(path.resolve())


def resolve_run(run_file: str | None, overrides: list[str], out: str | None) -> tuple[dict[str, Any], Path]:
    """(run, its directory): the defaults, then the run file, then dotted overrides; the directory is
    ``out``, else the run's own 'out', else runs/MODEL-TASK (written into the run)."""
    file_run = load_run_file(run_file) if run_file else {}
    base = merge_run(DEFAULT_RUN, file_run)
    # the run file's task says which override fields are text, unless an override names the task itself
    run = merge_run(base, parse_overrides(overrides, (base.get("task") or {}).get("name")))
    given = out or run.get("out")
    if given is not None and not isinstance(given, str):
        raise ValueError(f"out must be a path (a string), got {given!r}")
    path = check_out_dir(Path(given or default_out(run)).expanduser())  # a run file's ~/runs/x is the home's
    _absolute_data_paths(run.get("task") or {})
    run["out"] = str(path)
    return run, path


# ---- values from the command line: one validator per kind of value, one message each ----------------------


def _number(kind: Callable[[str], float], text: str, ok: Callable[[float], bool], what: str):
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    return lambda text: _number(int, text, lambda v: v >= minimum, f"an integer >= {minimum}")


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 1, "a positive integer")


def seed(text: str) -> int:  # torch's generators take 64-bit seeds
    return _number(int, text, lambda v: 0 <= v < 2**63, "an integer from 0 to 2**63 - 1")


def non_negative_int(text: str) -> int:
    return int_at_least(0)(text)


def non_negative_float(text: str) -> float:
    return _number(float, text, lambda v: 0 <= v < math.inf, "a finite number >= 0")  # nan is not either


def positive_float(text: str) -> float:
    return _number(float, text, lambda v: 0 < v < math.inf, "a positive number")  # inf and nan are not


def probability(text: str) -> float:
    """A probability mass in (0, 1], as nucleus sampling's top_p."""
    return _number(float, text, lambda v: 0 < v <= 1, "a probability in (0, 1]")


def names(text: str) -> list[str]:
    """'lstm, gru' -> ['lstm', 'gru']: a comma-separated list, blanks dropped; one name at least, each once."""
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"must name one or more, comma-separated, got {text!r}")
    if len(set(out)) != len(out):
        twice = sorted({x for x in out if out.count(x) > 1})
        raise argparse.ArgumentTypeError(f"names {', '.join(twice)} more than once, in {text!r}")
    return out


def indices(text: str) -> list[int]:
    """'0,3' -> [0, 3]: comma-separated integers >= 0."""
    return [non_negative_int(x) for x in names(text)]


def one_of(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """A comma-separated list whose items are all among ``choices``."""

    def parse(text: str) -> list[str]:
        items = names(text)
        unknown = [x for x in items if x not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"takes {', '.join(choices)}; got {text!r}")
        return items

    return parse


def config_fields(cls: type) -> list[str]:
    """'name=default' for each field of a config dataclass, with the choices of a Literal field."""
    from seqlab.tasks.base import literal_choices

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        choices = literal_choices(hints[f.name])
        out.append(
            f"{f.name}={default!r}" + (f" (one of {', '.join(map(repr, choices))})" if choices else "")
        )
    return out


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate dotted overrides (``--train.lr=3e-3`` or ``--train.lr 3e-3``) from ordinary arguments."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "." in arg.split("=", 1)[0]:
            overrides.append(arg)
            # the next word is its value unless it is an option itself (`--train.steps --out x` has no value:
            # parse_overrides says so, instead of --out becoming the steps and x the run file)
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                overrides.append(argv[i + 1])
                i += 1
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def settings_diff(saved: dict[str, Any], given: dict[str, Any], prefix: str = "") -> list[str]:
    """``section.field: saved -> given`` for each setting given that differs from the saved one (nested)."""
    out = []
    for key in sorted(given, key=str):
        a, b = saved.get(key, "(unset)"), given[key]
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += settings_diff(a, b, f"{name}.")
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out
