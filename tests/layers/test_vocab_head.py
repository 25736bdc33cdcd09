"""The vocabulary head: the padded product (taken on CUDA for an unaligned vocabulary) gives the unpadded
product's logits and gradients; the parameter keeps its shape."""

import pytest
import torch
import torch.nn.functional as F

from seqlab.layers.vocab_head import VocabHead, padded_rows, vocab_logits
from seqlab.models import create


def test_padded_rows():
    assert [padded_rows(v) for v in (1, 64, 65, 50257)] == [64, 64, 128, 50304]


@pytest.mark.parametrize("bias", [True, False])
def test_the_padded_product_equals_the_plain_one(bias):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 5, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(50, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    padded, plain = vocab_logits(h, w, b, pad=True), F.linear(h, w, b)
    assert padded.shape == plain.shape == (3, 5, 50)
    torch.testing.assert_close(padded, plain, rtol=0, atol=1e-12)
    grad = torch.randn(plain.shape, generator=g, dtype=torch.float64)
    inputs = (h, w) if b is None else (h, w, b)
    for a, r in zip(
        torch.autograd.grad(padded, inputs, grad), torch.autograd.grad(plain, inputs, grad), strict=True
    ):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: vocab_logits(*t, pad=True), inputs)


def test_a_language_model_trains_through_the_padded_view():
    """The logits are a strided view under padding: flattening them for the loss still works, and the loss and
    the head's gradient are those of the plain product."""
    model = create("test-gpt", vocab_size=100, dtype=torch.float64)
    assert isinstance(model.head, VocabHead) and model.head.weight.shape == (100, model.config.d_model)
    x = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    losses, grads = [], []
    for pad in (True, False):
        model.head.forward = lambda h, pad=pad: vocab_logits(h, model.head.weight, model.head.bias, pad=pad)
        logits = model(x)
        assert logits.is_contiguous() != pad
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        (grad,) = torch.autograd.grad(loss, model.head.weight)
        losses.append(loss.item()), grads.append(grad)
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_an_unaligned_vocabulary_is_padded():
    head = VocabHead(32, 50257, device="cuda")
    h = torch.randn(4, 32, device="cuda")
    out = head(h)
    assert out.shape == (4, 50257) and out.stride(0) == 50304  # the aligned product, viewed
    torch.testing.assert_close(out, F.linear(h, head.weight, head.bias))


@pytest.mark.parametrize("pad", [True, False])
def test_a_wrong_input_width_is_refused_by_name(pad):
    with pytest.raises(ValueError, match=r"expected inputs of width 8 \(\.\., d\), got \(2, 7\)"):
        vocab_logits(torch.randn(2, 7), torch.randn(50, 8), pad=pad)
