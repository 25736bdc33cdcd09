"""Every model family trains on a CUDA GPU through `seqlab train`, in fp32 and under bf16 autocast (what
train.precision: auto runs there), the first loss of the two within 2%. Marked gpu: skipped without CUDA."""

import json

import pytest
import torch
from test_cpu_bf16 import VIDEO  # the same folder (pytest puts it on sys.path)

from seqlab.cli import main

SHAKESPEARE = ["--task.name=shakespeare", "--task.seq_len=32", "--task.batch_size=4"]
BIBLE = ["--task.name=translation", "--task.vocab_size=300", "--task.batch_size=8", "--task.max_len=48"]
CAPTIONS = ["--task.name=captioning", "--task.image_size=32", "--task.n_train=64", "--task.n_eval=8"]
CASES = {
    "test-gpt": [*SHAKESPEARE, "--task.sampling=random"],
    "test-mamba": SHAKESPEARE,
    "test-s4d": SHAKESPEARE,
    "test-lm-lstm": SHAKESPEARE,
    "test-lm-gru": SHAKESPEARE,
    "test-lm-rnn": SHAKESPEARE,
    "test-lm-linear-attention": SHAKESPEARE,
    "test-seq2seq-luong": BIBLE,
    "test-transformer": BIBLE,
    "test-vit": ["--task.name=image_classification", "--task.source=digits"],
    "test-video": [*VIDEO, "--task.batch_size=8"],
    "test-video-frames": [*VIDEO, "--task.batch_size=8"],
    "test-show-attend-tell": [*CAPTIONS, "--task.batch_size=8"],
    "test-vit-captioner": [*CAPTIONS, "--task.batch_size=8"],
}


def first_loss(out, name: str, device: str, precision: str, *argv: str) -> float:
    common = ["--train.steps=2", "--train.log_every=1", "--train.eval_every=0", "--train.eval_batches=1"]
    common += ["--train.progress=false", "--train.warmup_steps=1", f"--train.precision={precision}"]
    run = out / f"{name}-{precision}"
    assert main(["train", f"--model.name={name}", *argv, *common, "--device", device, "--out", str(run)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return next(r["loss"] for r in records if r.get("split") == "train")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_family_trains_on_cuda_in_fp32_and_bf16(tmp_path, name):
    fp32 = first_loss(tmp_path, name, "cuda", "fp32", *CASES[name])
    bf16 = first_loss(tmp_path, name, "cuda", "bf16", *CASES[name])
    assert abs(bf16 - fp32) < 0.02 * fp32, (fp32, bf16)
