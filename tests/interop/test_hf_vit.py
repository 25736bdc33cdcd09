"""ViT parity: tiny random-init transformers ViTModel / ViTForImageClassification through the production
converter, in float64: hidden states, pooler, logits and every parameter's gradient to 1e-10."""

import logging

import pytest
import torch
import torch.nn.functional as F

from seqlab.interop.hf_vit import convert_vit, map_vit_state

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

TOL = {"atol": 1e-10, "rtol": 1e-10}
EAGER_TOL = {"atol": 1e-5, "rtol": 1e-5}
"""HF's eager attention takes its softmax in float32 whatever the dtype (``softmax(..., dtype=torch.float32)``),
so against it float64 parity stops at float32 rounding; its SDPA path stays in float64."""


def _config(channels=3, impl="sdpa", **kw):
    fields = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_channels=channels,
        num_labels=5,
        attn_implementation=impl,
    )
    return transformers.ViTConfig(**(fields | kw))


def _tiny(cls="ViTModel", channels=3, impl="sdpa", dtype=torch.float64, **kw):
    torch.manual_seed(0)
    return getattr(transformers, cls)(_config(channels, impl, **kw)).to(dtype).eval()


def _images(channels=3, size=16, n=3, dtype=torch.float64):
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(1), dtype=dtype)


def _mapped_grads(hf, ours) -> dict[str, torch.Tensor]:
    """HF's gradients carried to seqlab's names by the converter's own (linear) map."""
    grads = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    return map_vit_state(grads, ours.config.n_layers)


def _assert_same_grads(hf, ours, skip=(), tol=TOL):
    theirs = _mapped_grads(hf, ours)
    checked = 0
    for name, p in ours.named_parameters():
        if name in skip:
            continue
        assert p.grad is not None and name in theirs, name
        torch.testing.assert_close(p.grad, theirs[name], **tol, msg=name)
        checked += 1
    assert checked >= 20  # 2 layers x 9 tensors + embeddings and norm at least


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("channels", [3, 1])
def test_vit_model_hidden_states_pooler_and_gradients(channels, impl):
    from seqlab.interop import from_hf

    hf = _tiny("ViTModel", channels, impl)
    ours = from_hf(hf)
    assert not ours.training and ours.config.n_classes == 0 and ours.pooler is not None
    tol = TOL if impl == "sdpa" else EAGER_TOL
    x = _images(channels)
    ref = hf(x)
    hidden = ours.features(x)
    pooled = ours.pool(hidden)
    torch.testing.assert_close(hidden, ref.last_hidden_state, **tol)
    torch.testing.assert_close(pooled, ref.pooler_output, **tol)
    torch.testing.assert_close(ours(x), ref.pooler_output, **tol)  # a backbone returns the pooled features

    g = torch.Generator().manual_seed(2)
    w_h, w_p = torch.randn(hidden.shape, generator=g, dtype=x.dtype), torch.randn(pooled.shape, generator=g)
    ((ref.last_hidden_state * w_h).sum() + (ref.pooler_output * w_p).sum()).backward()
    ((hidden * w_h).sum() + (pooled * w_p).sum()).backward()
    _assert_same_grads(hf, ours, tol=tol)


@pytest.mark.parametrize("channels", [3, 1])
def test_classifier_logits_and_gradients(channels):
    from seqlab.interop import from_hf

    hf = _tiny("ViTForImageClassification", channels)
    ours = from_hf(hf)
    assert ours.config.n_classes == 5 and ours.pooler is None and ours.config.pool == "cls"
    x, labels = _images(channels), torch.tensor([0, 3, 4])
    ref = hf(x, labels=labels)
    logits = ours(x)
    torch.testing.assert_close(logits, ref.logits, **TOL)
    ref.loss.backward()
    F.cross_entropy(logits, labels).backward()
    _assert_same_grads(hf, ours)


def test_no_labels_and_no_pooler_give_backbones():
    x = _images()
    hf = _tiny("ViTForImageClassification", num_labels=0)  # an Identity classifier: the class token's state
    ours = convert_vit(hf)
    assert ours.head is None and ours.pooler is None
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, **TOL)
    torch.manual_seed(0)
    bare = transformers.ViTModel(_config(), add_pooling_layer=False).double().eval()
    ours = convert_vit(bare)
    assert ours.pooler is None
    with torch.no_grad():
        torch.testing.assert_close(ours.features(x), bare(x).last_hidden_state, **TOL)


def test_qkv_bias_false_is_zero_biases_that_would_train(caplog):
    hf = _tiny("ViTForImageClassification", qkv_bias=False)
    with caplog.at_level(logging.WARNING, logger="seqlab.interop.hf_vit"):
        ours = convert_vit(hf)
    assert "qkv_bias=False" in caplog.text
    for layer in ours.layers:
        assert torch.count_nonzero(layer.self_attn.in_proj_bias) == 0
    x, labels = _images(), torch.tensor([1, 2, 0])
    ref = hf(x, labels=labels)
    logits = ours(x)
    torch.testing.assert_close(logits, ref.logits, **TOL)  # the same function
    ref.loss.backward()
    F.cross_entropy(logits, labels).backward()
    in_proj_bias = {f"layers.{i}.self_attn.in_proj_bias" for i in range(2)}
    _assert_same_grads(hf, ours, skip=in_proj_bias)
    # what the warning is about: seqlab's zero biases get gradients that HF's model has no parameter for
    assert all(ours.get_parameter(n).grad.abs().max() > 0 for n in in_proj_bias)


@pytest.mark.parametrize("size", [(24, 24), (20, 28)])
def test_other_image_sizes_match_hf_interpolate_pos_encoding_in_float32(size):
    """seqlab resizes positions whenever the grid changes; HF only with ``interpolate_pos_encoding=True``.

    Both resample the (4, 4) table bicubically to the new grid (``size=``, ``align_corners=False``: no
    DINO-style +0.1 or scale factors in this transformers); seqlab computes it in float32, so float32 models
    agree to float32 rounding (the next test pins down the float64 case).
    """
    hf = _tiny("ViTForImageClassification", dtype=torch.float32)
    ours = convert_vit(hf)
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(x, interpolate_pos_encoding=True).logits
        got = ours(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="doesn't match"):  # what seqlab does unasked, HF refuses
        hf(x)


def test_interpolated_positions_equal_hf_in_float64_and_in_float32(monkeypatch):
    """seqlab's resized table is HF's, bit for bit, in the table's own precision: float64 interpolated in
    float64 (as HF does), float32 in float32."""
    hf = _tiny("ViTModel")
    ours = convert_vit(hf)
    emb = hf.embeddings
    dummy = torch.zeros(1, 1 + 6 * 5, 32, dtype=torch.float64)  # only its length is read
    with torch.no_grad():
        hf_64 = emb.interpolate_pos_encoding(dummy, 24, 20)[0]  # (T, d)
        got_64 = ours.positions((6, 5))
        monkeypatch.setattr(emb, "position_embeddings", torch.nn.Parameter(emb.position_embeddings.float()))
        hf_32 = emb.interpolate_pos_encoding(dummy.float(), 24, 20)[0]
        got_32 = ours.float().positions((6, 5))
    torch.testing.assert_close(got_64, hf_64, atol=0, rtol=0)
    torch.testing.assert_close(got_32, hf_32, atol=0, rtol=0)


def test_transformers4_names_map_like_transformers5_names():
    sd = _tiny("ViTForImageClassification").state_dict()
    legacy = {}
    for name, t in sd.items():
        old = name.replace("vit.layers.", "vit.encoder.layer.")
        old = old.replace("attention.q_proj", "attention.attention.query")
        old = old.replace("attention.k_proj", "attention.attention.key")
        old = old.replace("attention.v_proj", "attention.attention.value")
        old = old.replace("attention.o_proj", "attention.output.dense")
        old = old.replace("mlp.fc1", "intermediate.dense").replace("mlp.fc2", "output.dense")
        legacy[old] = t
    assert "vit.encoder.layer.1.attention.attention.query.weight" in legacy
    new, old = map_vit_state(sd, 2), map_vit_state(legacy, 2)
    assert new.keys() == old.keys()
    assert all(torch.equal(new[k], old[k]) for k in new)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new'"),
        ({"image_size": [16, 32]}, "square"),
        ({"attention_probs_dropout_prob": 0.1}, "one rate"),
        ({"pooler_act": "relu"}, "pooler_act='relu'"),
        ({"pooler_output_size": 16}, "pooler_output_size=16"),
    ],
)
def test_unsupported_configs_are_refused_with_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        convert_vit(_tiny("ViTModel", **fields))


def test_other_models_are_refused():
    with pytest.raises(ValueError, match="ViTModel or ViTForImageClassification"):
        convert_vit(torch.nn.Linear(2, 2))
