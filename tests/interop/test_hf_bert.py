"""BERT parity: a tiny random-init transformers BertModel through the production converter, with padding."""

import pytest
import torch

from seqlab.interop.hf_bert import convert_bert, load_bert_folder

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def _tiny_bert(impl="eager", **kw):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        attn_implementation=impl,
        **kw,
    )
    return transformers.BertModel(cfg).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0  # right padding of different lengths
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return ids, mask, types


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hidden_states_and_pooler_match_with_padding(impl):
    from seqlab.interop import from_hf

    hf = _tiny_bert(impl)
    ours = from_hf(hf)
    assert not ours.training
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()
    torch.testing.assert_close(got[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.pool(got, mask, "cls"), ref.pooler_output, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_real_positions():
    ours = convert_bert(_tiny_bert())
    ids, mask, _ = _batch()
    with torch.no_grad():
        padded = ours(ids, attention_mask=mask)
        alone = ours(ids[2:3, :3])
    torch.testing.assert_close(padded[2:3, :3], alone, atol=1e-5, rtol=1e-5)


def test_checkpoint_folder_round_trip(tmp_path):
    hf = _tiny_bert(hidden_act="gelu_new")
    hf.save_pretrained(tmp_path)  # config.json + model.safetensors
    ours = load_bert_folder(tmp_path)
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    assert ours.config.activation == "gelu_tanh"
    torch.testing.assert_close(got[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=1e-5)
