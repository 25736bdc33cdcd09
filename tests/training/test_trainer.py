import copy
import dataclasses
import itertools
import json
import math
import os
import stat

import pytest
import torch

from seqlab.models import create
from seqlab.tasks.text import CharLMTask
from seqlab.training import TrainConfig, Trainer
from seqlab.training import checkpoint as ckpt
from seqlab.training.optim import lr_at, make_optimizer, param_groups

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def _run(text_file, out, steps, sampling="stream", resume=False, until=None, **train):
    torch.manual_seed(0)
    task = CharLMTask(source=str(text_file), seq_len=16, batch_size=4, sampling=sampling)
    model = create("test-lstm-lm", vocab_size=task.tokenizer.vocab_size, dropout=0.2)
    cfg = TrainConfig(
        steps=steps,
        lr=3e-3,
        warmup_steps=3,
        eval_every=5,
        eval_batches=2,
        log_every=1,
        save_every=5,
        progress=False,
        **train,
    )
    tr = Trainer(model, task, cfg, out)
    summary = tr.fit(resume=resume, until=until)
    return [r["loss"] for r in tr.history if r["split"] == "train"], summary, tr


@pytest.mark.parametrize("sampling", ["stream", "random"])
def test_resume_reproduces_the_uninterrupted_loss_sequence(text_file, tmp_path, sampling):
    # dropout (RNG state), truncated BPTT (carried state) and AdamW moments all have to survive the checkpoint
    full, _, _ = _run(text_file, tmp_path / "a", 16, sampling)
    first, _, _ = _run(text_file, tmp_path / "b", 16, sampling, until=7)
    rest, summary, _ = _run(text_file, tmp_path / "b", 16, sampling, resume=True)
    assert len(first) == 7 and len(rest) == 9
    assert first + rest == full  # exact, not approximate
    assert summary["step"] == 16
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)  # the resumed run continued the metrics file without duplicates


def test_training_reduces_loss_and_writes_checkpoints(text_file, tmp_path):
    losses, summary, tr = _run(text_file, tmp_path / "r", 40, grad_accum=2)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.4  # nats: it learned
    assert math.isfinite(summary["val_loss"])
    kept = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir())
    assert kept == ["manifest.json", "step-00000035", "step-00000040"]  # keep_checkpoints=2 prunes older ones
    loaded = ckpt.load_model(tmp_path / "r")
    for (k, v), (k2, v2) in zip(tr.model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    cfg = ckpt.load_config(tmp_path / "r")
    assert cfg["family"] == tr.model.family and cfg["step"] == 40
    assert cfg["model"] == json.loads(json.dumps(dataclasses.asdict(tr.model.config)))


def test_interrupted_save_leaves_previous_checkpoint_loadable(text_file, tmp_path, monkeypatch):
    _run(text_file, tmp_path / "r", 5)
    before = ckpt.resolve_checkpoint(tmp_path / "r")

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-save")

    from seqlab.training import state_tree

    monkeypatch.setattr(state_tree, "save_file", boom)
    with pytest.raises(KeyboardInterrupt):
        _run(text_file, tmp_path / "r", 10, resume=True)
    assert ckpt.resolve_checkpoint(tmp_path / "r") == before
    assert ckpt.load_trainer_state(before)["step"] == 5
    leftovers = [p.name for p in (tmp_path / "r" / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_checkpoint_holds_no_pickle(text_file, tmp_path):
    _run(text_file, tmp_path / "r", 5)
    files = sorted(p.name for p in ckpt.resolve_checkpoint(tmp_path / "r").iterdir())
    assert files == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "trainer_state.json",
        "trainer_state.safetensors",
    ]


def test_flatten_round_trip():
    obj = {"a": torch.arange(3), "b": [1, 2.5, None, "x"], "c": (torch.ones(2), {"d": torch.zeros(1)})}
    tensors = {}
    meta = json.loads(json.dumps(ckpt.flatten(obj, "s", tensors)))
    back = ckpt.unflatten(meta, tensors)
    assert isinstance(back["c"], tuple) and back["b"] == [1, 2.5, None, "x"]
    assert torch.equal(back["a"], obj["a"]) and torch.equal(back["c"][1]["d"], obj["c"][1]["d"])


def test_tied_weights_survive_a_checkpoint(tmp_path):
    model = create("test-lstm-lm", vocab_size=9, tie_weights=True)
    ckpt.save_checkpoint(tmp_path, 1, model, {"family": "rnn_lm", "model": vars(model.config)})
    loaded = ckpt.load_model(tmp_path)
    assert loaded.head.weight is loaded.embed.weight
    assert torch.equal(loaded.embed.weight, model.embed.weight)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_saved_files_follow_the_umask(tmp_path, mask):
    # written through 0600 temporary files and a 0700 temporary directory, they end up as open() would make them
    old = os.umask(mask)
    try:
        model = create("test-lstm-lm", vocab_size=7)
        d = ckpt.save_checkpoint(tmp_path, 1, model, {"family": "rnn_lm", "model": vars(model.config)})
        ckpt.write_text_atomic(tmp_path / "table.md", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "table.md").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "latest").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE(d.stat().st_mode) == 0o777 & ~mask


def test_resolve_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such"):
        ckpt.resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="neither a run directory"):
        ckpt.resolve_checkpoint(tmp_path)


def test_lr_schedule():
    kw = {"max_lr": 1.0, "total_steps": 110, "warmup_steps": 10, "min_lr": 0.1}
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)  # the peak, once: the next step is already below it
    assert lr_at(10, **kw) < 1.0
    assert lr_at(59, **kw) == pytest.approx(0.55)  # half way down the cosine
    assert lr_at(109, **kw) == pytest.approx(0.1)  # the last trained step reaches min_lr
    values = [lr_at(s, **kw) for s in range(9, 111)]
    assert all(a > b for a, b in itertools.pairwise(values[:-1]))


def test_weight_decay_groups_skip_vectors():
    model = create("test-lstm-lm", vocab_size=9)
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_train_config_validation():
    with pytest.raises(ValueError, match=r"train\.steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(grad_clip=-1.0)
    with pytest.raises(ValueError, match=r"train\.warmup_steps must be an integer >= 0, got -1"):
        TrainConfig(warmup_steps=-1)
    with pytest.raises(ValueError, match=r"train\.max_minutes must be a positive"):
        TrainConfig(max_minutes=0)
    # zero is meaningful for these: a cosine down to 0, every checkpoint kept, no periodic evaluation
    TrainConfig(min_lr=0.0, keep_checkpoints=0, eval_every=0, save_every=0, warmup_steps=0, grad_clip=None)


def test_detach_state_keeps_named_tuples():
    from seqlab.layers.attention import KVCache
    from seqlab.training.loop_state import detach_state

    k = torch.ones(1, 1, 2, 2, requires_grad=True) * 2
    cache = detach_state([KVCache(k, k, torch.tensor(2)), (k, k)])
    assert isinstance(cache[0], KVCache) and not cache[0].k.requires_grad
    assert isinstance(cache[1], tuple) and not cache[1][0].requires_grad


def test_param_groups_never_decay_ssm_state_matrices():
    from seqlab.layers.ssm import S4D, Mamba

    model = torch.nn.ModuleList([Mamba(16, 4), S4D(16, 4)])
    decay, no_decay = (set(map(id, g["params"])) for g in param_groups(model, 0.1))
    mamba, s4d = model
    for p in (mamba.A_log, mamba.D, s4d.A_log_re, s4d.A_im, s4d.log_dt):
        assert id(p) in no_decay and id(p) not in decay
    for p in (mamba.in_proj.weight, mamba.x_proj.weight, s4d.C, s4d.out_proj.weight):
        assert id(p) in decay
    model.double()  # the modules name them: dtype moves, deep copies (and FSDP's new Parameters) keep them
    assert id(mamba.A_log) in set(map(id, param_groups(model, 0.1)[1]["params"]))
    copied = copy.deepcopy(model)  # a copy loses any attribute set on a Parameter object
    kept = set(map(id, param_groups(copied, 0.1)[1]["params"]))
    assert {id(copied[0].A_log), id(copied[0].D), id(copied[1].A_log_re), id(copied[1].log_dt)} <= kept


def test_the_trainer_takes_torchs_fused_adamw_where_it_can():
    model = torch.nn.Linear(4, 3)
    assert make_optimizer(model, 1e-3, 0.1, (0.9, 0.99)).defaults["fused"] is True
    assert make_optimizer(model.to(torch.float16), 1e-3, 0.1, (0.9, 0.99)).defaults["fused"] is True


def test_min_lr_above_lr_is_refused():
    from seqlab.training import TrainConfig

    with pytest.raises(ValueError, match=r"train\.min_lr=0\.01 is above train\.lr=0\.001"):
        TrainConfig(lr=1e-3, min_lr=1e-2)
    assert TrainConfig(lr=1e-3, min_lr=1e-3).min_lr == 1e-3


def test_the_trainer_moves_the_model_to_its_device(text_file, monkeypatch):
    """Trainer puts the model on the run's device before anything else (seen on the CPU through a spy: a CUDA
    run trained a model left where it was built)."""
    task = CharLMTask(source=str(text_file), seq_len=16, batch_size=4)
    model = create("test-lstm-lm", vocab_size=task.tokenizer.vocab_size)
    moved = []
    real = model.to
    monkeypatch.setattr(model, "to", lambda *a, **k: moved.append(a or k) or real(*a, **k))
    Trainer(model, task, TrainConfig(steps=1, progress=False))
    assert moved and torch.device(moved[0][0]) == torch.device("cpu")


def test_an_evaluation_before_the_first_train_line_shows_in_the_progress_bar(train, tmp_path, capsys):
    """eval_every below log_every: the first evaluation comes before any train loss is logged, and the
    progress bar's postfix took the missing loss for a number (a TypeError at the first evaluation)."""
    trainer = train(tmp_path / "run", 4, eval_every=2, log_every=10, progress=True)
    vals = [r for r in trainer.history if r["split"] == "val"]
    assert [r["step"] for r in vals] == [2, 4]
    assert "val_loss=" in capsys.readouterr().err
