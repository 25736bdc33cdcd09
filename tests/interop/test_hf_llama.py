"""Llama parity: a tiny random-init transformers LlamaForCausalLM (GQA, RoPE, RMSNorm, SwiGLU)."""

import pytest
import torch

from seqlab.interop.hf_llama import convert_llama

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def _tiny_llama(**kw):
    torch.manual_seed(0)
    args = {
        "vocab_size": 101,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "attn_implementation": "sdpa",
    }
    args.update(kw)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**args)).eval()


@pytest.mark.parametrize(
    "kw",
    [{}, {"tie_word_embeddings": True}, {"attention_bias": True, "mlp_bias": True}, {"head_dim": 16}],
    ids=["gqa", "tied", "bias", "head_dim"],
)
def test_logits_match(kw):
    hf = _tiny_llama(**kw)
    ours = convert_llama(hf)
    assert ours.config.mixer_config["n_kv_heads"] == 2 and ours.config.mixer_config["rope"]
    ids = torch.randint(0, 101, (2, 19))
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_greedy_generation_matches():
    hf = _tiny_llama()
    ours = convert_llama(hf)
    prompt = torch.randint(0, 101, (2, 6))
    ref = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=24,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(ours.generate(prompt, 24, temperature=0), ref)


def test_rope_scaling_is_rejected():
    hf = _tiny_llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="rope_type"):
        convert_llama(hf)
