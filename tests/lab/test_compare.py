import json

import pytest
import torch

from seqlab.cli import main
from seqlab.lab import compare
from seqlab.lab.budget import count, match_width
from seqlab.lab.decode import decode_profile, state_bytes
from seqlab.lab.suite import SUITES, Entry, Suite, _adding
from seqlab.models import create

TINY = Suite(
    "tiny",
    8_000,
    1,
    (
        _adding(12, 6),
        _adding(16, 6),
        Entry("copy", "T=5", {"seq_len": 5, "batch_size": 4}, 4, "val_accuracy"),
    ),
    decode_contexts=(8, 64),
    throughput_lengths=(32,),
    gradient_length=8,
    timing_cap_s=1.0,
)


def test_compare_writes_the_report_and_reuses_finished_runs(tmp_path, capsys):
    paths = compare(tmp_path, TINY, mixers=["gru", "attention"], progress=True)
    rows = json.loads(paths["results"].read_text())
    assert {r["mixer"] for r in rows} == {"gru", "attention"}
    for r in rows:
        assert set(r) == {
            "mixer",
            "task",
            "setting",
            "metric",
            "value",
            "params",
            "train_tokens_per_s",
            "seconds",
        }
    trained = [r for r in rows if r["task"] in ("adding", "copy")]
    assert len(trained) == 2 * 3 and all(r["value"] == r["value"] for r in trained)  # no NaN
    table = paths["table"].read_text()
    assert "| gru (RNN) | attention (Transformer) |" in table and "decode ms/token at context 64" in table
    assert "| | RNN | Transformer |" in table  # the textbook table: one column per family
    family_rows = [line for line in table.splitlines() if line.startswith("| adding T=12")]
    assert (
        len(family_rows) == 2 and family_rows[0].count("gru ") == 1
    )  # member-labelled cells, then per mixer
    assert all(p.is_file() and p.stat().st_size > 1000 for p in paths["plots"])
    # attention's KV cache grows with the context, the GRU's state does not
    state = {(r["mixer"], r["setting"]): r["value"] for r in rows if r["metric"] == "state_bytes"}
    assert state[("gru", "context=64")] == state[("gru", "context=8")]
    assert state[("attention", "context=64")] > 4 * state[("attention", "context=8")]
    capsys.readouterr()
    compare(tmp_path, TINY, mixers=["gru", "attention"], progress=True, gradients=False)
    out = capsys.readouterr().out
    assert out.count("(reused") == 6 and "(done" not in out


def test_matched_budgets_are_close():
    base = {"n_layers": 2, "vocab_size": 64}
    for mixer in ("rnn", "lstm", "attention", "mamba"):
        d, n = match_width(mixer, 200_000, base)
        assert abs(n - 200_000) / 200_000 < 0.1, (mixer, d, n)
        assert n == count(mixer, d, base)


def test_decode_profile_counts_state():
    model = create("test-lm-lstm", vocab_size=11)
    rows = decode_profile(model, 11, contexts=(4, 32), n_steps=3)
    assert [r["context"] for r in rows] == [4, 32]
    assert rows[0]["state_bytes"] == rows[1]["state_bytes"] == state_bytes(model.init_state(1)) > 0


def test_cli_rejects_unknown_mixers_and_suites(tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path), "--mixers", "lstm,transformer-xl"]) == 2
    assert "unknown mixer" in capsys.readouterr().err
    assert main(["compare", "--out", str(tmp_path), "--suite", "huge"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert main(["compare", "--out", str(tmp_path / "t"), "--suite", "translation", "--minutes", "1e9"]) == 2
    assert "--minutes is each model's training time: more than 0 and at most 1440" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()  # refused before anything ran


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suites_name_registered_tasks(name):
    from seqlab.tasks import list_tasks

    assert {e.task for e in SUITES[name].entries} <= set(list_tasks())


def test_throughput_times_every_model_in_alternating_rounds():
    from seqlab.lab.systems import throughput

    calls = []

    class Probe(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name, self.embed = name, torch.nn.Embedding(11, 11)  # logits over the 11 tokens

        def forward(self, x):
            calls.append(self.name)
            return self.embed(x)

    models = {"a": Probe("a"), "b": Probe("b")}
    steps = throughput(models, vocab_size=11, seq_len=5, batch_size=2, rounds=4, max_rounds=4)
    assert set(steps) == {"a", "b"} and all(len(s.samples) == 4 and s.median > 0 for s in steps.values())
    assert calls == ["a", "b"] + ["a", "b", "b", "a"] * 2  # warm-up, then the order reverses every round


def test_parallel_jobs_train_every_run_once_and_match_the_serial_results(tmp_path, capsys):
    serial = compare(tmp_path / "serial", TINY, mixers=["gru", "lstm"], progress=False, gradients=False)
    paths = compare(tmp_path / "jobs", TINY, mixers=["gru", "lstm"], progress=True, gradients=False, jobs=2)
    out = capsys.readouterr().out
    assert out.count("(done") == 2 * 3 and "[6/6]" in out
    assert out.startswith(
        "[compare] tiny: 6 runs (2 mixers x 3 tasks), 0 reused, 6 to train (2 at once); about "
    )
    rows = {
        (r["mixer"], r["setting"]): r["value"]
        for r in json.loads(paths["results"].read_text())
        if r["task"] in ("adding", "copy")
    }
    ref = {
        (r["mixer"], r["setting"]): r["value"]
        for r in json.loads(serial["results"].read_text())
        if r["task"] in ("adding", "copy")
    }
    assert rows.keys() == ref.keys()
    for k, v in rows.items():  # same seeds, same data: only the thread count differs
        assert v == pytest.approx(ref[k], rel=1e-3, abs=1e-5), k
    with pytest.raises(ValueError, match="jobs"):
        compare(tmp_path / "bad", TINY, mixers=["gru"], jobs=0)


def test_mamba_keeps_its_own_block_layout_in_the_lab():
    from seqlab.lab.budget import build_lab_model

    mamba, _, _ = build_lab_model("mamba", TINY, {"vocab_size": 11}, 0)
    lstm, _, _ = build_lab_model("lstm", TINY, {"vocab_size": 11}, 0)
    assert all(b.mlp is None for b in mamba.blocks) and all(b.mlp is not None for b in lstm.blocks)


def test_activation_memory_is_remeasured_when_the_throughput_lengths_change(tmp_path):
    import dataclasses

    def memory(suite):
        paths = compare(tmp_path, suite, mixers=["gru"], progress=False, gradients=False)
        rows = json.loads(paths["results"].read_text())
        return next(r["value"] for r in rows if r["metric"] == "activation_bytes")

    short = memory(TINY)  # measured at t = max(throughput_lengths) = 32
    assert memory(dataclasses.replace(TINY, throughput_lengths=(64,))) > short


def test_a_run_trained_in_this_process_leaves_the_trainer_log_as_it_was():
    """A suite quiets the trainer's evaluation lines while it trains a run; the level comes back after (it stayed
    at WARNING, hiding a later trainer's INFO lines in the same process)."""
    import logging

    from seqlab.lab.runner import train_run

    train_log = logging.getLogger("seqlab.train")
    before = train_log.level
    train_log.setLevel(logging.INFO)
    try:
        record = train_run(TINY, "gru", TINY.entries[0], seed=0)
        assert record["summary"]["step"] > 0
        assert train_log.level == logging.INFO
    finally:
        train_log.setLevel(before)
