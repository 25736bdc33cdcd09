"""GPT presets of the LM stack: model protocol, the DESIGN laws at model level, configuration and initialization."""

import dataclasses
import json
import math

import pytest
import torch

from seqlab.models import build, create
from seqlab.models.lm import LMConfig

PRESETS = ["test-gpt", "test-gpt-llama"]


@pytest.mark.parametrize("name", PRESETS)
def test_step_equals_forward_and_chunked_equals_whole(name):
    torch.manual_seed(0)
    model = create(name, vocab_size=13).eval()
    x = torch.randint(0, 13, (2, 11))
    full = model(x)
    state, outs = model.init_state(2), []
    for t in range(11):
        y, state = model.step(x[:, t], state)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), full, atol=1e-5, rtol=1e-5)
    a, s = model(x[:, :4], return_state=True)
    b, s = model(x[:, 4:], state=s, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=1e-5)
    assert int(s[0].pos) == 11 and s[0].k.shape[2] == 11


@pytest.mark.parametrize("name", PRESETS)
def test_causal_batch_independent_and_every_parameter_learns(name):
    torch.manual_seed(0)
    model = create(name, vocab_size=7, dropout=0.1)
    x = torch.randint(0, 7, (3, 9))
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 7
    model.eval()
    torch.testing.assert_close(model(x)[:, :5], model(x2)[:, :5])
    torch.testing.assert_close(model(x[1:2]), model(x)[1:2], atol=1e-5, rtol=1e-5)
    model.train()
    model(x).logsumexp(-1).mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_gpt2_initialization_and_tying():
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=65)
    assert model.head.weight is model.embed.weight
    c = model.config
    resid = torch.cat([p.weight.flatten() for b in model.blocks for p in b.residual_projections()])
    assert abs(resid.std().item() - 0.02 / math.sqrt(2 * c.n_layers)) < 2e-4
    assert abs(model.blocks[0].mixer.in_proj_weight.std().item() - 0.02) < 1e-3
    assert all(b.mixer.in_proj_bias.abs().sum() == 0 for b in model.blocks)
    llama = create("test-gpt-llama")
    assert llama.head.weight is not llama.embed.weight and llama.blocks[0].mixer.in_proj_bias is None
    assert llama.pos_embed is None and llama.blocks[0].mixer.rope is not None
    assert all(b.mlp.gate.bias is None and b.norm1.weight.shape == (32,) for b in llama.blocks)


def test_config_round_trip_and_validation():
    cfg = create("test-gpt-llama").config
    again = LMConfig(**json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert again == cfg
    model = build("lm", dataclasses.asdict(cfg))
    assert model.family == "lm" and model.config == cfg
    assert create("test-gpt", n_heads=2).config.mixer_config["n_heads"] == 2  # a mixer field given flat
    assert create("test-gpt", n_heads=2).config.mixer_config["bias"] is True  # the preset's others stay
    with pytest.raises(ValueError, match="norm must be one of"):
        LMConfig(norm="batchnorm")
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        create("test-gpt", n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="divisible"):
        create("test-gpt", d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="unknown field"):
        create("test-lm-lstm", n_heads=4)  # an LSTM has no heads


def test_generate_and_attention_maps():
    torch.manual_seed(0)
    model = create("test-gpt", vocab_size=11)
    prompt = torch.randint(0, 11, (5,))
    out = model.generate(prompt, 7, temperature=0)
    assert out.shape == (12,) and torch.equal(out[:5], prompt)
    g = torch.Generator().manual_seed(1)
    sampled = model.generate(prompt[None], 7, top_k=3, generator=g)
    assert sampled.shape == (1, 12)
    # past max_seq_len=64 the context slides: greedy tokens equal a rollout that crops the input the same way
    long = model.generate(prompt, 100, temperature=0)
    ids, held = prompt[None], 5
    for _ in range(100):
        if held > 64:
            held = 32
        ids = torch.cat([ids, model(ids[:, -held:])[:, -1].argmax(-1, keepdim=True)], 1)
        held += 1
    assert long.shape == (105,) and torch.equal(long, ids[0])
    maps = model.attention_maps(prompt[None], layers=[1])
    w = maps[1]
    assert list(maps) == [1] and w.shape == (1, 4, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 5))
    assert torch.all(w.triu(1) == 0)  # causal: no weight on future keys
    with pytest.raises(ValueError, match="out of range"):
        model.attention_maps(prompt[None], layers=[2])
