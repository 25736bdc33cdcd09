"""Every model family trains on a CUDA GPU through `seqlab train`, in fp32 and under bf16 autocast (what
train.precision: auto runs there), the first loss of the two within 2%. Marked gpu: skipped without CUDA."""

import json
import shutil

import pytest
import torch
from test_cpu_bf16 import VIDEO  # the same folder (pytest puts it on sys.path)

from seqlab.cli import main

SHAKESPEARE = ["--task.name=shakespeare", "--task.seq_len=32", "--task.batch_size=4"]
BIBLE = ["--task.name=translation", "--task.vocab_size=300", "--task.batch_size=8", "--task.max_len=48"]
CAPTIONS = ["--task.name=captioning", "--task.image_size=32", "--task.n_train=64", "--task.n_eval=8"]
# the generated speech corpus, small, cached in the test's folder
SPEECH = ["--task.n_train=12", "--task.n_eval=4", "--task.batch_size=4"]
CASES = {  # test id: (model, its task's arguments)
    "test-gpt": ("test-gpt", [*SHAKESPEARE, "--task.sampling=random"]),
    "test-gpt-llama": ("test-gpt-llama", [*SHAKESPEARE, "--task.sampling=random"]),
    "test-lm-attention": ("test-lm-attention", [*SHAKESPEARE, "--task.sampling=random"]),
    "test-mamba": ("test-mamba", SHAKESPEARE),
    "test-s4d": ("test-s4d", SHAKESPEARE),
    "test-lm-lstm": ("test-lm-lstm", SHAKESPEARE),
    "test-lm-gru": ("test-lm-gru", SHAKESPEARE),
    "test-lm-rnn": ("test-lm-rnn", SHAKESPEARE),
    "test-lm-linear-attention": ("test-lm-linear-attention", SHAKESPEARE),
    "test-seq2seq": ("test-seq2seq", BIBLE),
    "test-seq2seq-luong": ("test-seq2seq-luong", BIBLE),
    "test-transformer": ("test-transformer", BIBLE),
    "test-vit": ("test-vit", ["--task.name=image_classification", "--task.source=digits"]),
    "test-vit-mean": ("test-vit-mean", ["--task.name=image_classification", "--task.source=digits"]),
    "test-video": ("test-video", [*VIDEO, "--task.batch_size=8"]),
    "test-video-frames": ("test-video-frames", [*VIDEO, "--task.batch_size=8"]),
    "test-video-cnn": ("test-video-cnn", [*VIDEO, "--task.batch_size=8"]),
    "test-vivit": ("test-vivit", [*VIDEO, "--task.batch_size=8"]),
    "test-video-caption": ("test-video-caption", [*VIDEO, "--task.label=caption", "--task.batch_size=8"]),
    "test-show-attend-tell": ("test-show-attend-tell", [*CAPTIONS, "--task.batch_size=8"]),
    "test-vit-captioner": ("test-vit-captioner", [*CAPTIONS, "--task.batch_size=8"]),
    "test-speech-ctc": ("test-speech-ctc", ["--task.name=speech_ctc", *SPEECH]),
    "test-speech-linear": ("test-speech-linear", ["--task.name=speech_ctc", *SPEECH]),
    "test-speech-keywords": ("test-speech", ["--task.name=keywords", *SPEECH]),
    "forecast-lstm": ("test-lm-lstm", ["--task.name=forecast", "--task.batch_size=8"]),
    "series-classification-mamba": (
        "test-mamba",
        ["--task.name=series_classification", "--task.batch_size=8"],
    ),
}


def first_loss(out, name: str, device: str, precision: str, *argv: str) -> float:
    common = ["--train.steps=2", "--train.log_every=1", "--train.eval_every=0", "--train.eval_batches=1"]
    common += ["--train.progress=false", "--train.warmup_steps=1", f"--train.precision={precision}"]
    run = out / f"{name}-{precision}"
    assert main(["train", f"--model.name={name}", *argv, *common, "--device", device, "--out", str(run)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return next(r["loss"] for r in records if r.get("split") == "train")


NEEDS_ESPEAK = pytest.mark.skipif(  # the generated speech corpus is spoken by espeak-ng
    shutil.which("espeak-ng") is None, reason="needs espeak-ng: apt-get install -y espeak-ng"
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=NEEDS_ESPEAK) if "speech" in c else c for c in sorted(CASES)]
)
def test_every_family_trains_on_cuda_in_fp32_and_bf16(tmp_path, case):
    name, argv = CASES[case]
    if "speech" in case:
        argv = [*argv, f"--task.cache_dir={tmp_path / 'speech'}"]
    fp32 = first_loss(tmp_path, name, "cuda", "fp32", *argv)
    bf16 = first_loss(tmp_path, name, "cuda", "bf16", *argv)
    assert abs(bf16 - fp32) < 0.02 * fp32, (fp32, bf16)
