"""Conversions that loaded and gave other numbers, or refused what seqlab itself exports: other families in a BERT
folder, BERT decoders, exports without a pooler, Llama's two bias switches, custom nn.Transformer stacks,
dropout rates, float64 decoding and the MLM head's activation (random-init models built in memory)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")

from seqlab.interop import from_hf, from_torch  # noqa: E402
from seqlab.interop.hf_bert import bert_config, load_bert_folder  # noqa: E402
from seqlab.interop.hf_export import save_hf, to_hf  # noqa: E402
from seqlab.models.encoder import EncoderConfig, EncoderForMaskedLM  # noqa: E402
from seqlab.models.lm import LM, LMConfig  # noqa: E402
from seqlab.models.transformer import Transformer, TransformerConfig  # noqa: E402
from seqlab.models.vit import ViT, ViTConfig  # noqa: E402

BERT = {"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 48, "max_position_embeddings": 24}  # fmt: skip


def test_a_roberta_folder_is_not_read_as_bert(tmp_path):
    hf = transformers.RobertaModel(transformers.RobertaConfig(**BERT, type_vocab_size=1))
    hf.save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"expected a BERT config \(model_type 'bert'\), got model_type='roberta'"
    ):
        load_bert_folder(tmp_path)


def test_a_bert_decoder_is_refused():
    hf = transformers.BertModel(transformers.BertConfig(**BERT, is_decoder=True))
    with pytest.raises(ValueError, match=r"is_decoder=True \(a decoder\)"):
        from_hf(hf)
    config = {**transformers.BertConfig(**BERT).to_dict(), "add_cross_attention": True}
    with pytest.raises(ValueError, match=r"add_cross_attention=True \(a decoder\)"):
        bert_config(config)


def test_a_vit_backbone_without_a_pooler_comes_back_from_its_folder_as_it_was(tmp_path):
    torch.manual_seed(0)
    m = ViT(ViTConfig(image_size=16, patch_size=4, d_model=32, n_layers=2, n_heads=2, n_classes=0)).eval()
    written = save_hf(m, tmp_path / "vit")
    assert "add_pooling_layer=False" in written.load_snippet()
    hf = transformers.AutoModel.from_pretrained(tmp_path / "vit", add_pooling_layer=False).eval()
    back = from_hf(hf).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(back(x), m(x))
    assert back.config.pooler == m.config.pooler


def test_llamas_attention_and_mlp_biases_convert_apart():
    torch.manual_seed(0)
    cfg = LMConfig(mixer="attention", mixer_config={"n_heads": 4, "rope": True, "bias": True}, vocab_size=50,
                   d_model=32, n_layers=2, d_ff=48, mlp="swiglu", norm="rmsnorm", bias=False, tie_weights=False)  # fmt: skip
    m = LM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # biases not zero
    hf = to_hf(m).eval()
    back = from_hf(hf).eval()
    assert back.config.mixer_config["bias"] and not back.config.bias
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), m(ids))


def test_a_custom_transformer_stack_with_other_layer_settings_is_refused():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True), 2,
                                norm=nn.LayerNorm(16), enable_nested_tensor=False)  # fmt: skip
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 4, 24, dropout=0.0, batch_first=True, norm_first=True),
                                2, norm=nn.LayerNorm(16))  # fmt: skip
    model = nn.Transformer(16, 4, custom_encoder=enc, custom_decoder=dec, batch_first=True)
    with pytest.raises(
        ValueError, match=r"decoder.layers.0 has norm_first=True but encoder.layers.0 has False"
    ):
        from_torch(model)
    model.decoder.layers[0].norm_first = model.decoder.layers[1].norm_first = False
    model.decoder.norm.eps = 0.1
    with pytest.raises(ValueError, match=r"decoder.norm is eps=0.1"):
        from_torch(model)


def test_gpt2_dropout_carries_over():
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=50,
            n_positions=16,
            n_embd=32,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.2,
            embd_pdrop=0.2,
            attn_pdrop=0.2,
        )
    )
    assert from_hf(hf).config.dropout == 0.2


def test_a_float64_transformer_decodes_in_float64():
    cfg = TransformerConfig(vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32,
                            dropout=0.0, max_seq_len=20)  # fmt: skip
    m = Transformer(cfg, dtype=torch.float64).eval()
    src, tgt = torch.randint(3, 30, (2, 6)), torch.randint(3, 30, (2, 5))
    with torch.no_grad():
        assert m(src, tgt).dtype == torch.float64


def test_the_mlm_head_uses_the_encoders_activation():
    torch.manual_seed(0)
    cfg = EncoderConfig(
        vocab_size=40, max_seq_len=16, n_layers=1, n_heads=2, d_model=16, d_ff=32, activation="relu"
    )
    m = EncoderForMaskedLM(cfg).eval()
    head = m.head if hasattr(m, "head") else m.mlm_head
    h = torch.randn(2, 5, 16)
    want = head.decoder(head.norm(F.relu(head.dense(h))))
    torch.testing.assert_close(head(h), want)
