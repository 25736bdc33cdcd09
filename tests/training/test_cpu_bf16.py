"""bf16 autocast on the CPU (``train.precision: bf16``): refused where the CPU has no bf16 matmul units, and on
any CPU every kind of model trains under it, its first loss within bf16's rounding of the fp32 run's."""

from __future__ import annotations

import json

import pytest
import torch

from seqlab.cli import main
from seqlab.layers import create_mixer, list_mixers
from seqlab.layers.attention import MultiheadAttention
from seqlab.training import config as train_config
from seqlab.training.config import TrainConfig


def test_bf16_is_refused_on_a_cpu_without_bf16_matmuls(monkeypatch):
    monkeypatch.setattr(train_config, "cpu_has_bf16_matmul", lambda: False)
    with pytest.raises(ValueError, match="neither AMX nor AVX512-BF16"):
        TrainConfig(precision="bf16", device="cpu")
    assert TrainConfig(device="cpu").autocast_dtype() is None


def test_bf16_is_autocast_on_a_cpu_with_them_and_auto_stays_fp32(monkeypatch):
    monkeypatch.setattr(train_config, "cpu_has_bf16_matmul", lambda: True)
    assert TrainConfig(precision="bf16", device="cpu").autocast_dtype() == torch.bfloat16
    assert (
        TrainConfig(precision="auto", device="cpu").autocast_dtype() is None
    )  # numbers never change silently
    assert TrainConfig(precision="fp32", device="cpu").autocast_dtype() is None


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_under_cpu_autocast_runs_the_kernel(causal, graph_names):
    """A float32 input under autocast: the packed projection comes out in bf16 and the kernel takes it as it is
    (computing in float32 inside; once, the layer checked its input's dtype and handed the kernel bf16 it then
    refused); the output close to the float32 layer's."""
    torch.manual_seed(0)
    mha = MultiheadAttention(64, 4, causal=causal)
    x = torch.randn(2, 40, 64, requires_grad=True)  # past the kernel's 32-query minimum
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = mha(x)
    assert any("PackedAttention" in n for n in graph_names(y))
    y.float().square().sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    torch.testing.assert_close(y.float(), mha(x)[0], rtol=0.05, atol=0.03)


@pytest.mark.parametrize("name", list_mixers())
def test_every_mixer_under_cpu_autocast_is_close_to_float32(name):
    """A float32 input under CPU autocast (what a model's norm hands its mixer): the output and the input's
    gradient within bf16's rounding of the float32 layer's, gradients of the parameters in float32."""
    torch.manual_seed(0)
    mixer = create_mixer(name, 64)
    x = torch.randn(2, 40, 64, requires_grad=True)
    y32, _ = mixer(x)
    (g32,) = torch.autograd.grad(y32.square().sum(), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16, _ = mixer(x)
    y16.float().square().sum().backward()
    scale = y32.abs().max().item()
    assert (y16.float() - y32).abs().max().item() < 0.05 * scale
    assert (x.grad - g32).abs().max().item() < 0.05 * g32.abs().max().item()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in mixer.parameters())


def _first_loss(tmp_path, name, precision, *argv) -> float:
    out = tmp_path / f"{name}-{precision}"
    common = ["--train.steps=2", "--train.log_every=1", "--train.eval_every=0", "--train.eval_batches=1"]
    common += ["--train.progress=false", "--train.warmup_steps=1", f"--train.precision={precision}"]
    assert main(["train", f"--model.name={name}", *argv, *common, "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return next(r["loss"] for r in records if r.get("split") == "train")


VIDEO = [
    "--task.name=video",
    "--task.n_frames=8",
    "--task.frame_size=16",
    "--task.n_train=32",
    "--task.n_eval=8",
]
CASES = {
    "test-gpt": [
        "--task.name=shakespeare",
        "--task.seq_len=32",
        "--task.batch_size=4",
        "--task.sampling=random",
    ],
    "test-mamba": ["--task.name=shakespeare", "--task.seq_len=32", "--task.batch_size=4"],
    "test-vit": ["--task.name=image_classification", "--task.source=digits"],
    "test-video-frames": [*VIDEO, "--task.batch_size=8"],  # frame features into an LM: the input check
    "test-show-attend-tell": [  # an LSTM decoder with additive attention over an image grid
        "--task.name=captioning",
        "--task.image_size=32",
        "--task.n_train=64",
        "--task.n_eval=8",
        "--task.batch_size=8",
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kind_of_model_trains_in_bf16_on_the_cpu(tmp_path, monkeypatch, name):
    monkeypatch.setattr(
        train_config, "cpu_has_bf16_matmul", lambda: True
    )  # emulated where the CPU lacks them
    fp32 = _first_loss(tmp_path, name, "fp32", *CASES[name])
    bf16 = _first_loss(tmp_path, name, "bf16", *CASES[name])
    assert abs(bf16 - fp32) < 0.02 * fp32, (fp32, bf16)
