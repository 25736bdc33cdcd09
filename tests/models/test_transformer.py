"""The encoder–decoder Transformer: incremental decoding, masks, greedy and beam search, a tiny copy task."""

import dataclasses

import pytest
import torch

from seqlab.models import create
from seqlab.models.transformer import TransformerConfig


def _model(**kw):
    torch.manual_seed(0)
    return create("test-transformer", **kw).eval()


def test_incremental_decoding_equals_full_and_padding_is_ignored():
    model = _model()
    src = torch.randint(3, 64, (2, 7))
    src[1, 5:] = 0  # padding
    tgt = torch.randint(3, 64, (2, 6))
    full = model(src, tgt)
    assert full.shape == (2, 6, 64)
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(2, 6))
    mask = src != 0
    memory = model.encode(src, mask)
    state, outs = None, []
    for i in range(6):
        lp, state = model.decode(tgt[:, i : i + 1], memory, mask, state)
        outs.append(lp)
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    alone = model(src[1:, :5], tgt[1:])
    torch.testing.assert_close(alone, full[1:], atol=1e-5, rtol=1e-5)


def test_shared_embeddings_and_config():
    model = _model()
    assert model.src_embed is model.tgt_embed and model.generator.weight is model.src_embed.weight
    sep = create("test-transformer", share_embeddings=False, tgt_vocab_size=50)
    assert sep(torch.randint(3, 64, (1, 4)), torch.randint(3, 50, (1, 3))).shape == (1, 3, 50)
    with pytest.raises(ValueError, match="share_embeddings"):
        TransformerConfig(vocab_size=10, tgt_vocab_size=12)
    assert TransformerConfig(**dataclasses.asdict(model.config)) == model.config


@pytest.mark.parametrize(
    "ids",
    [
        {"eos_id": 100},  # past the vocabulary: generation could never stop
        {"pad_id": 2, "eos_id": 2},  # eos blocked as pad: never stops either
        {"tgt_vocab_size": 2, "share_embeddings": False},  # eos 2 outside a 2-token target vocabulary
    ],
)
def test_special_ids_outside_a_vocabulary_or_shared_are_refused(ids):
    with pytest.raises(
        ValueError, match=r"pad_id, bos_id and eos_id must be distinct ids of both vocabularies"
    ):
        TransformerConfig(vocab_size=64, **ids)


def _copy_batch(g, b=32, n=6):
    body = torch.randint(3, 16, (b, n), generator=g)
    eos = torch.full((b, 1), 2)
    bos = torch.full((b, 1), 1)
    return body, torch.cat([bos, body], 1), torch.cat([body, eos], 1)


def test_learns_to_copy_and_beam_agrees_with_greedy():
    torch.manual_seed(0)
    model = create("test-transformer", vocab_size=16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        src, tgt_in, tgt_out = _copy_batch(g)
        loss = -model(src, tgt_in).gather(-1, tgt_out[..., None]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, _, tgt_out = _copy_batch(g, b=16)
    greedy = model.greedy_decode(src, max_len=10)
    acc = (greedy[:, 1:8] == tgt_out).float().mean().item()
    assert acc > 0.9, acc
    beam1, _ = model.beam_search(src, max_len=10, beam_size=1, length_penalty=0.0)
    n = min(beam1.size(1), greedy.size(1))
    assert torch.equal(beam1[:, :n], greedy[:, :n])
    beam4, scores = model.beam_search(src, max_len=10, beam_size=4)
    assert scores.shape == (16,) and (beam4[:, 1:8] == tgt_out).float().mean() > 0.9


def test_token_ids_out_of_range_are_refused_by_name():
    model = create("test-transformer")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 64\)"):
        model(torch.tensor([[3, 99]]), torch.tensor([[1, 4]]))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 64\)"):
        model(torch.tensor([[3, 9]]), torch.tensor([[1, -4]]))


def test_left_padded_sources_are_refused():
    """Positions count from each row's first slot: a left-padded source would be encoded at shifted positions
    (its outputs differed by up to 1.2 from the sentence alone), so it is refused, as Seq2Seq refuses it."""
    model = _model()
    src = torch.tensor([[0, 0, 5, 6], [5, 6, 7, 0]])  # pad id 0 on the left of row 0
    with pytest.raises(ValueError, match=r"right-padded.*row 0"):
        model.generate(src, max_new_tokens=3)
    with pytest.raises(ValueError, match="right-padded"):
        model.encode(torch.tensor([[5, 6, 7]]), torch.tensor([[True, False, True]]))  # a hole in the middle


def test_generation_past_the_position_table_is_refused_before_decoding():
    """The longest generation that fits runs; one more token is refused up front (it used to fail only after
    max_seq_len steps, and only when no hypothesis had ended first)."""
    from seqlab.models import create

    model = create("test-transformer").eval()  # max_seq_len 64
    src = torch.randint(4, 20, (2, 5))
    assert model.generate(src, max_new_tokens=64).shape[1] <= 65
    for beam in (1, 3):
        with pytest.raises(ValueError, match="max_new_tokens=65 would need 65 target positions"):
            model.generate(src, max_new_tokens=65, beam_size=beam)
    captioner = create("test-vit-captioner").eval()  # max_len 32
    images = torch.rand(2, 3, 16, 16)
    assert captioner.generate(images, max_new_tokens=32).shape[1] <= 33
    with pytest.raises(
        ValueError, match="max_new_tokens=33 exceeds the transformer decoder's position table"
    ):
        captioner.generate(images, max_new_tokens=33)
