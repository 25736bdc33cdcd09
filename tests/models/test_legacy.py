"""Checkpoints and presets of seqlab 0.1 (separate GPT, RNNLM and flat-config LM families) under the one stack.

The fixtures in tests/fixtures/legacy-0.1 were written by seqlab 0.1 itself (make_legacy.py there, run
against that release): each holds a checkpoint directory and the logits it gave on fixed ids.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seqlab.models import count_parameters, list_models
from seqlab.training.checkpoint import load_model

FIXTURES = Path(__file__).parent.parent / "fixtures" / "legacy-0.1"
CHECKPOINTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_a_checkpoint_written_by_0_1_loads_and_gives_the_same_logits(name):
    old = json.loads((FIXTURES / name / "config.json").read_text())
    model = load_model(FIXTURES / name).eval()
    assert model.family == "lm" and old["family"] in ("gpt", "rnn_lm", "lm")
    expected = load_file(str(FIXTURES / name / "expected.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(model(expected["ids"]), expected["logits"], rtol=0, atol=1e-6)
    if old["family"] == "rnn_lm":
        assert model.config.layout == "stacked" and model.config.mixer == old["model"]["cell"]


def test_every_preset_keeps_its_0_1_parameter_count():
    counts = json.loads((FIXTURES / "preset_parameters.json").read_text())
    assert set(counts) <= set(list_models())
    for name, n in counts.items():
        assert count_parameters(name) == n, name


def test_old_flat_lm_fields_are_sorted_into_the_mixer_config():
    cfg = json.loads((FIXTURES / "test-lm-attention" / "config.json").read_text())["model"]
    model = load_model(FIXTURES / "test-lm-attention")
    assert model.config.mixer_config["n_kv_heads"] == cfg["n_kv_heads"] == 2
    assert model.config.d_ff == 4 * cfg["d_model"]  # 0.1's None meant 4 d_model for every mixer
