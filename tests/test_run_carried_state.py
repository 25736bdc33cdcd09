"""A stateful task with full attention is refused before training: its KV cache would grow every batch."""

import pytest

from seqlab.run import build_run

TEXT = "to be or not to be, that is the question.\n" * 40


def _run(tmp_path, model: dict, sampling: str) -> dict:
    src = tmp_path / "t.txt"
    src.write_text(TEXT, encoding="utf-8")
    task = {"name": "text", "source": str(src), "seq_len": 16, "batch_size": 2, "sampling": sampling}
    return {"model": model, "task": task, "train": {"progress": False}}


def test_full_attention_on_streams_is_refused(tmp_path):
    with pytest.raises(ValueError, match="KV cache that grows every batch"):
        build_run(_run(tmp_path, {"name": "test-gpt-llama"}, "stream"))
    with pytest.raises(ValueError, match="keep growing past the learned table's max_seq_len"):
        build_run(_run(tmp_path, {"name": "test-gpt", "mixer_config": {"window": 8}}, "stream"))


@pytest.mark.parametrize(
    ("model", "sampling"),
    [
        ({"name": "test-gpt"}, "random"),  # independent windows: nothing carried
        ({"name": "test-lstm-lm"}, "stream"),  # a constant-size state
        ({"name": "test-gpt-llama", "mixer_config": {"window": 8}}, "stream"),  # a bounded cache, RoPE
    ],
)
def test_carried_state_that_stays_bounded_is_accepted(tmp_path, model, sampling):
    built, task, _ = build_run(_run(tmp_path, model, sampling))
    assert task.stateful == (sampling == "stream")
    assert built.config.mixer == ("lstm" if model["name"] == "test-lstm-lm" else "attention")
