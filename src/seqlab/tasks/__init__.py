"""Tasks: data, loss and metric for one problem each. ``create_task(name, **kwargs)`` builds one."""

from __future__ import annotations

import inspect
from typing import Any

from seqlab.tasks.base import Task


def _registry() -> dict[str, Any]:
    from seqlab.tasks import captioning, images, probes, speech, synthetic, text, translation, video, vision
    from seqlab.tasks.timeseries import TASKS as SERIES_TASKS

    return {
        "shakespeare": lambda **kw: text.CharLMTask(source="shakespeare", **kw),
        "text": text.CharLMTask,  # needs source=PATH
        "adding": synthetic.AddingTask,
        "copy": synthetic.CopyTask,
        "selective_copy": probes.SelectiveCopyTask,
        "associative_recall": probes.AssociativeRecallTask,
        "induction": probes.InductionHeadsTask,
        "seq_image": images.SequentialImageTask,
        "translation": translation.TranslationTask,
        "image_classification": vision.ImageClassificationTask,
        "captioning": captioning.CaptioningTask,
        **SERIES_TASKS,  # "forecast", "series_classification"
        "video": video.VideoTask,
        "keywords": speech.KeywordTask,
        "speech_ctc": speech.SpeechCTCTask,
    }


def task_signature(name: str) -> inspect.Signature:
    from seqlab.tasks import text

    reg = _registry()
    if name not in reg:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(reg))}")
    if name == "shakespeare":
        sig = inspect.signature(text.CharLMTask)
        return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "source"])
    return inspect.signature(reg[name])


def task_class(name: str) -> type[Task]:
    """The class of the task ``name`` (what it can do, known before building it); an unknown name is refused."""
    from seqlab.tasks import text

    task_signature(name)  # the 'unknown task' error
    return text.CharLMTask if name == "shakespeare" else _registry()[name]


def task_families(name: str) -> tuple[str, ...]:
    """The model families a task trains (its class's ``model_families``), known before building the task."""
    return task_class(name).model_families


def list_tasks() -> list[str]:
    return sorted(_registry())


def check_task_arguments(name: str, kwargs) -> None:
    """Refuse arguments the task ``name`` does not take, naming those it does."""
    sig = task_signature(name)
    if unknown := sorted(set(kwargs) - set(sig.parameters)):
        raise ValueError(
            f"unknown argument(s) {unknown} for task {name!r}; it accepts {list(sig.parameters)}"
        )


def create_task(name: str, **kwargs) -> Task:
    """Build a task by name, rejecting unknown arguments with the list of accepted ones."""
    check_task_arguments(name, kwargs)
    if name == "text" and "source" not in kwargs:
        raise ValueError("task 'text' needs a file: set task.source=PATH (e.g. --task.source=my.txt)")
    return _registry()[name](**kwargs)


__all__ = [
    "Task",
    "check_task_arguments",
    "create_task",
    "list_tasks",
    "task_class",
    "task_families",
    "task_signature",
]
