"""GPT-2 parity: a tiny random-init transformers GPT2LMHeadModel through the production converter."""

import pytest
import torch

from seqlab.interop.hf_gpt2 import convert_gpt2

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def _tiny_gpt2(**kw):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, attn_implementation="eager", **kw
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("tied", [True, False])
def test_logits_match(tied):
    hf = _tiny_gpt2(tie_word_embeddings=tied)
    ours = convert_gpt2(hf)
    assert not ours.training and (ours.head.weight is ours.embed.weight) == tied
    ids = torch.randint(0, 97, (3, 17))
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_greedy_generation_matches_and_from_hf_dispatches():
    from seqlab.interop import from_hf

    hf = _tiny_gpt2()
    ours = from_hf(hf)
    prompt = torch.randint(0, 97, (2, 5))
    ref = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=20,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    got = ours.generate(prompt, 20, temperature=0)
    assert torch.equal(got, ref)


def test_unsupported_config_is_rejected():
    hf = _tiny_gpt2(scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        convert_gpt2(hf)
