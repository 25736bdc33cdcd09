"""HF MambaForCausalLM -> seqlab LM through ``from_hf``: same logits, greedy generation and step logits.

Tiny random-init models (no downloads); HF runs its pure-PyTorch path on CPU.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from seqlab.interop import from_hf  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("quiet_transformers")]


def _hf_mamba(seed=0, **kw):
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        state_size=8,
        expand=2,
        conv_kernel=4,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=None,  # no end-of-sequence token: HF would stop or mask it, seqlab does neither
    )
    fields.update(kw)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(**fields)).eval()
    with torch.no_grad():  # spread Δ and let the mixers dominate the residual, so that greedy decoding
        for layer in model.backbone.layers:  # does not collapse to repeating one token
            layer.mixer.dt_proj.bias.add_(torch.randn_like(layer.mixer.dt_proj.bias))
            layer.mixer.out_proj.weight.mul_(5)
            layer.mixer.in_proj.weight.mul_(3)
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_same_logits_and_config(tie):
    hf = _hf_mamba(tie_word_embeddings=tie)
    ours = from_hf(hf).eval()
    assert ours.config.norm_eps == hf.config.layer_norm_epsilon and ours.config.d_ff == 0
    assert ours.config.mixer_config["dt_rank"] == hf.config.time_step_rank
    assert (ours.head.weight is ours.embed.weight) == tie
    ids = torch.randint(0, 61, (3, 45))
    with torch.no_grad():
        theirs = hf(ids).logits
        mine = ours(ids)
    torch.testing.assert_close(mine, theirs, atol=2e-6, rtol=0)  # 8.3e-7 measured (README: to 1e-6)


def test_same_greedy_generation_and_step_logits(same_decoding):
    hf = _hf_mamba(seed=1)
    same_decoding(hf, from_hf(hf), vocab_size=61)


def test_rejects_unsupported_configs_and_models():
    with pytest.raises(ValueError, match="use_bias"):
        from_hf(_hf_mamba(use_bias=True))
    with pytest.raises(ValueError, match="cannot convert"):
        from_hf(torch.nn.Linear(2, 2))
