"""StaticCacheDecoder against LM.step (the module-by-module reference) for every attention-LM option."""

import pytest
import torch

from seqlab.models import make_config
from seqlab.models.gpt import gpt_fields
from seqlab.models.gpt_decode import StaticCacheDecoder, why_not_static_decode
from seqlab.models.lm import LM

CONFIGS = {
    "gpt2": {},
    "llama": {
        "mixer_config": {"n_kv_heads": 2, "rope": True, "bias": False},
        "position": "none",
        "norm": "rmsnorm",
        "norm_eps": 1e-6,
        "mlp": "swiglu",
        "d_ff": 40,
        "bias": False,
        "tie_weights": False,
    },
    "mqa-relu-nopos": {"mixer_config": {"n_kv_heads": 1, "head_dim": 6}, "mlp": "relu", "position": "none"},
    "gelu-untied-headbias": {
        "mlp": "gelu",
        "tie_weights": False,
        "mixer_config": {"n_heads": 2},
        "head_bias": True,
    },
}


def make(name: str, dtype=torch.float64) -> LM:
    torch.manual_seed(0)
    fields = gpt_fields(16, 2, 4, 32, vocab_size=50, **CONFIGS[name])
    model = LM(make_config("lm", fields)).to(dtype).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a dropped term would show
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def reference(model: LM) -> LM:
    """The same weights in a model built with ``fast_path=False``: generation steps through the modules."""
    ref = LM(model.config, fast_path=False).to(model.head.weight.dtype).eval()
    ref.load_state_dict(model.state_dict())
    return ref


@pytest.mark.parametrize("batch", [1, 3])  # one sequence runs on matrix-vector products, several on matrices
@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.inference_mode()
def test_step_logits_equal_the_module_path(name, batch):
    model = make(name)
    ids = torch.randint(0, 50, (batch, 20))
    dec = StaticCacheDecoder(model, capacity=20)
    logits, pos = dec(ids[:, :5])
    ref_logits, state = model(ids[:, :5], return_state=True)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
    for t in range(5, 20):
        got, pos = dec.step(ids[:, t], pos)
        want, state = model.step(ids[:, t], state)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert pos == 20


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_generate_equals_reference_generate(name):
    model = make(name, torch.float32)
    prompt = torch.randint(0, 50, (2, 6))
    fast = model.generate(prompt, 20, temperature=0)
    assert torch.equal(fast, reference(model).generate(prompt, 20, temperature=0))
    # sampling draws the same tokens from the same generator state
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = model.generate(prompt, 20, temperature=0.8, top_k=10, generator=g1)
    b = reference(model).generate(prompt, 20, temperature=0.8, top_k=10, generator=g2)
    assert torch.equal(a, b)


def test_generation_slides_past_the_position_table_like_the_reference():
    model = make("gpt2", torch.float32)  # 32 learned positions
    prompt = torch.randint(0, 50, (1, 10))
    fast = model.generate(prompt, 60, temperature=0)
    assert fast.shape == (1, 70)
    assert torch.equal(fast, reference(model).generate(prompt, 60, temperature=0))
    long_prompt = torch.randint(0, 50, (40,))  # longer than the table: the last 32 positions are read
    assert torch.equal(
        model.generate(long_prompt, 5, temperature=0), reference(model).generate(long_prompt, 5, 0)
    )


@torch.inference_mode()
def test_decoder_refuses_what_it_cannot_do():
    model = make("gpt2")
    dec = StaticCacheDecoder(model, capacity=8)
    with pytest.raises(ValueError, match="capacity 8"):
        dec(torch.zeros(1, 9, dtype=torch.long))
    _, pos = dec(torch.zeros(1, 7, dtype=torch.long))
    _, pos2 = dec.step(torch.zeros(1, dtype=torch.long), pos)
    with pytest.raises(ValueError, match="position 8; it cannot step from position 7"):
        dec.step(torch.zeros(1, dtype=torch.long), pos)  # an old state: its slots may have been overwritten
    with pytest.raises(ValueError, match="full"):
        dec.step(torch.zeros(1, dtype=torch.long), pos2)
    dec(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(1,\), the prompt's batch"):
        dec.step(torch.zeros(2, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="positive"):
        StaticCacheDecoder(model, capacity=0)
    assert StaticCacheDecoder(model, capacity=1000).capacity == 32  # never past the position table


def test_hooks_and_foreign_parts_send_generation_down_the_module_path():
    model = make("gpt2", torch.float32)
    prompt = torch.randint(0, 50, (1, 5))
    assert model.why_not_fast_path() is None
    seen = []
    handle = model.blocks[1].mlp.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    assert model.why_not_fast_path() == "module blocks.1.mlp has forward hooks"
    model.generate(prompt, 4, temperature=0)
    assert len(seen) == 1 + 3  # the prompt's forward, then one step per further token: the hook saw them all
    handle.remove()

    class Scaled(torch.nn.Module):  # a user's own channel mixer
        def __init__(self, mlp):
            super().__init__()
            self.mlp, self.calls = mlp, 0

        def forward(self, x):
            self.calls += 1
            return 0.5 * self.mlp(x)

    model.blocks[0].mlp = scaled = Scaled(model.blocks[0].mlp)
    assert "block 0 has a Scaled" in model.why_not_fast_path()
    out = model.generate(prompt, 6, temperature=0)
    assert scaled.calls == 1 + 5  # the user's module ran for the prompt and every further token
    model.fast_path = False
    assert model.why_not_fast_path() == "fast_path=False was set on this model"
    assert torch.equal(out, model.generate(prompt, 6, temperature=0))


def test_only_attention_stacks_take_the_static_decoder():
    from seqlab.models import create

    assert why_not_static_decode(create("test-gpt")) is None
    assert "LSTM" in why_not_static_decode(create("test-lm-lstm"))
    assert "layout='stacked'" in why_not_static_decode(create("test-lstm-lm"))
    assert "sliding window" in why_not_static_decode(create("test-lm-attention", window=4))
    assert "NoneType" in why_not_static_decode(create("test-gpt", d_ff=0))
