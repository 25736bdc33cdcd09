"""The BERT-style encoder: padding invariance, bidirectionality, heads, configs and presets."""

import dataclasses
import json

import pytest
import torch

from seqlab.models import build, create
from seqlab.models.encoder import (
    EncoderConfig,
    EncoderForMaskedLM,
    EncoderForSequenceClassification,
)


def _tiny():
    torch.manual_seed(0)
    return create("test-bert").eval()


def test_padding_invariance_and_bidirectional():
    model = _tiny()
    ids = torch.randint(1, 101, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 5:] = False
    with torch.no_grad():
        h = model(ids, attention_mask=mask)
        noisy = ids.clone()
        noisy[0, 5:] = (noisy[0, 5:] + 7) % 101  # change only padded tokens
        h2 = model(noisy, attention_mask=mask)
        alone = model(ids[:1, :5])
        changed = ids.clone()
        changed[1, -1] = (changed[1, -1] + 1) % 101
        h3 = model(changed, attention_mask=mask)
    assert h.shape == (2, 9, 32)
    torch.testing.assert_close(h[0, :5], h2[0, :5])
    torch.testing.assert_close(h[:1, :5], alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(h[1, 0], h3[1, 0])  # not causal: the first position sees the last


def test_pooling():
    model = _tiny()
    h = torch.randn(2, 4, 32)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    torch.testing.assert_close(model.pool(h, mask, "mean")[0], h[0, :2].mean(0))
    assert model.pool(h, mask, "cls").abs().max() <= 1  # tanh pooler
    with pytest.raises(ValueError, match="pooling"):
        model.pool(h, mask, "max")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_heads_learn(pooling):
    torch.manual_seed(0)
    cfg = create("test-bert").config
    mlm = EncoderForMaskedLM(cfg)
    assert mlm.head.decoder.weight is mlm.encoder.tok_embed.weight
    ids = torch.randint(1, 101, (2, 7))
    assert mlm(ids).shape == (2, 7, 101)
    clf = EncoderForSequenceClassification(cfg, n_classes=3, pooling=pooling)
    mask = torch.ones(2, 7, dtype=torch.long)
    logits = clf(ids, mask)
    assert logits.shape == (2, 3)
    logits.logsumexp(-1).sum().backward()
    skip = {"encoder.pooler.weight", "encoder.pooler.bias"} if pooling == "mean" else set()
    for n, p in clf.named_parameters():
        if n not in skip:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_config_round_trip_and_errors():
    model = _tiny()
    cfg = EncoderConfig(**json.loads(json.dumps(dataclasses.asdict(model.config))))
    assert cfg == model.config and build("encoder", dataclasses.asdict(cfg)).family == "encoder"
    with pytest.raises(ValueError, match="activation"):
        EncoderConfig(activation="swish")
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 4))


def test_token_ids_segments_and_sizes_are_checked_by_name():
    model = _tiny()
    v = model.config.vocab_size
    ids = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"token ids must be in \[0, {v}\)"):
        model(torch.full((2, 3), v))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 2\)"):
        model(ids, token_type_ids=torch.full((2, 3), 2))
    with pytest.raises(ValueError, match=r"token_type_ids must match input_ids \(2, 3\), got \(2, 2\)"):
        model(ids, token_type_ids=torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids as an int64 \(or int32\) tensor, got torch\.bool"):
        model(ids.bool())
    with pytest.raises(
        ValueError, match=r"attention_mask must be a tensor of hidden's \(b, t\) shape \(2, 3\), got \(2, 4\)"
    ):
        model.pool(model(ids), torch.ones(2, 4), how="mean")
    base = dataclasses.asdict(model.config)
    for field, bad in (("type_vocab_size", -1), ("pad_token_id", v), ("pad_token_id", -1)):
        with pytest.raises(ValueError, match=field):
            EncoderConfig(**{**base, field: bad})
    with pytest.raises(ValueError, match="n_classes must be a positive integer"):
        EncoderForSequenceClassification(model.config, n_classes=-1)
    segmentless = EncoderConfig(**{**base, "type_vocab_size": 0})
    with pytest.raises(ValueError, match="no segment embeddings"):
        build("encoder", dataclasses.asdict(segmentless))(ids, token_type_ids=torch.zeros_like(ids))
