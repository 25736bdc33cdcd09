"""Orchestration reads like the models do (STYLE.md): no function past a screen, no file past a sitting.

A function or method counts from its ``def`` line (decorators excluded) to the last line of its body, the
docstring included; a file counts every line. All offenders are reported in one message.
"""

from __future__ import annotations

import ast
from pathlib import Path

import seqlab

MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
SRC = Path(seqlab.__file__).resolve().parent


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(SRC.parent).as_posix() if path.is_relative_to(SRC.parent) else path.name


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'file:line name (n lines)' for every function or method in ``path`` longer than ``limit`` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                found.append(f"{_name(path)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_is_longer_than_a_screen():
    offenders = [f for path in _sources() for f in long_functions(path)]
    assert not offenders, f"{len(offenders)} function(s) over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(
        offenders
    )


def test_no_file_is_longer_than_a_sitting():
    offenders = []
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            offenders.append(f"{_name(path)} ({n} lines)")
    assert not offenders, f"{len(offenders)} file(s) over {MAX_FILE_LINES} lines:\n" + "\n".join(offenders)


def test_the_counter_counts_from_def_to_the_end_of_the_body(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    src = tmp_path / "m.py"
    src.write_text(f'@decorator\ndef f():\n    """doc"""\n{body}\n', encoding="utf-8")  # 60 lines from def
    assert long_functions(src, 60) == [] and len(long_functions(src, 59)) == 1
