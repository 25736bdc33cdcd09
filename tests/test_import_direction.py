"""Imports flow one way: kernels -> layers -> models -> training -> lab/cli; tasks never import models."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "seqlab"
_ABOVE_KERNELS = (
    "layers",
    "models",
    "tasks",
    "training",
    "lab",
    "cli",
    "run",
    "commands",
    "interop",
    "viz",
    "validation",
)
FORBIDDEN = {
    "kernels": tuple(f"seqlab.{name}" for name in _ABOVE_KERNELS),  # the lowest layer: torch only
    "layers": ("seqlab.models", "seqlab.training", "seqlab.tasks", "seqlab.lab", "seqlab.cli", "seqlab.run"),
    "models": ("seqlab.training", "seqlab.lab", "seqlab.cli", "seqlab.run", "seqlab.tasks"),
    "tasks": ("seqlab.models", "seqlab.training", "seqlab.lab", "seqlab.cli", "seqlab.run"),
    "training": ("seqlab.lab", "seqlab.cli", "seqlab.run"),
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package):
    files = sorted((SRC / package).rglob("*.py"))
    assert files
    bad = [(f.name, m) for f in files for m in _imports(f) if m.startswith(FORBIDDEN[package])]
    assert bad == []
