"""HF Mamba2ForCausalLM -> seqlab LM through ``from_hf``, and the Mamba-2 block against HF's ``Mamba2Mixer``: same
outputs (padded batches too), greedy generation and the logits of every O(1) decoding step.

Tiny random-init models (no downloads); HF runs its pure-PyTorch path (``torch_forward``: the chunked SSD) on
CPU, seqlab its selective-scan kernel, so the two forms of SSD are compared as well as the weights' map.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from seqlab.interop import from_hf  # noqa: E402
from seqlab.layers import Mamba2  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("quiet_transformers")]


def _config(**kw):
    fields = dict(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        state_size=8,
        expand=2,
        head_dim=16,
        num_heads=4,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=None,  # no end-of-sequence token: HF would stop or mask it, seqlab does neither
        tie_word_embeddings=True,
    )
    fields.update(kw)
    return transformers.Mamba2Config(**fields)


def _hf_mamba2(seed=0, **kw):
    torch.manual_seed(seed)
    model = transformers.Mamba2ForCausalLM(_config(**kw)).eval()
    with torch.no_grad():  # spread Δ, let the mixers dominate the residual (varied greedy tokens), and give
        for layer in model.backbone.layers:  # the gated norm weights other than ones
            mixer = layer.mixer
            mixer.dt_bias.add_(torch.randn_like(mixer.dt_bias))
            mixer.out_proj.weight.mul_(5)
            mixer.in_proj.weight.mul_(3)
            mixer.norm.weight.uniform_(0.5, 1.5)
            mixer.D.uniform_(-1.0, 1.0)
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_same_logits_and_config(tie):
    hf = _hf_mamba2(tie_word_embeddings=tie)
    ours = from_hf(hf).eval()
    c = ours.config
    assert c.mixer == "mamba2" and c.d_ff == 0 and c.norm_eps == hf.config.layer_norm_epsilon
    assert c.mixer_config == {
        "d_state": 8,
        "d_conv": 4,
        "expand": 2,
        "headdim": 16,
        "n_groups": 2,
        "norm_eps": 1e-5,
    }
    assert (ours.head.weight is ours.embed.weight) == tie
    ids = torch.randint(0, 61, (3, 45))  # 45: not a multiple of HF's chunk of 16
    with torch.no_grad():
        theirs = hf(ids).logits
        mine = ours(ids)
    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=0)


def test_same_greedy_generation_and_step_logits(same_decoding):
    hf = _hf_mamba2(seed=1)
    same_decoding(hf, from_hf(hf), vocab_size=61)


@pytest.mark.parametrize("fast", [True, False])
def test_block_against_hf_mixer_with_padding(fast):
    """The block alone, float64: seqlab's scan kernel (or its recurrence) against HF's chunked SSD, on a right-padded
    batch whose padding holds garbage (HF zeroes it; seqlab holds the state there)."""
    torch.manual_seed(2)
    theirs = transformers.models.mamba2.modeling_mamba2.Mamba2Mixer(_config(), layer_idx=0).double().eval()
    with torch.no_grad():
        theirs.dt_bias.add_(torch.randn_like(theirs.dt_bias))
        theirs.norm.weight.uniform_(0.5, 1.5)
    ours = Mamba2(32, d_state=8, headdim=16, n_groups=2, fast_path=fast).double()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 21, 32, dtype=torch.float64)
    mask = torch.arange(21)[None] < torch.tensor([21, 13, 1])[:, None]
    x = x.masked_fill(~mask[..., None], 1e6)
    with torch.no_grad():
        want = theirs(x.masked_fill(~mask[..., None], 0.0), attention_mask=mask.long())
        got, _ = ours(x, mask=mask)
    # HF's chunked scan casts to float32 whatever the input's dtype (1.6e-7 measured); seqlab's two paths agree
    # to float64's rounding (tests/layers/test_mamba2.py)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-6, rtol=0)


def test_rejects_unsupported_configs():
    with pytest.raises(ValueError, match="use_bias"):
        from_hf(_hf_mamba2(use_bias=True))
    with pytest.raises(ValueError, match="time_step_limit"):
        from_hf(_hf_mamba2(time_step_limit=(0.0, 0.1)))
    hf = _hf_mamba2()
    hf.config.__dict__["num_heads"] = 2  # transformers refuses it on construction; an edited config.json
    with pytest.raises(ValueError, match="num_heads"):
        from_hf(hf)
