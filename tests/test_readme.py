"""Every Python block of the README runs as written (each in a fresh namespace), so a reader can paste it."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index):
    names: dict = {}
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), names)  # raises where it breaks
    assert set(names) - {"__builtins__"}, "the block defined nothing"
