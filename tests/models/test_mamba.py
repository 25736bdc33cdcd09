"""SSM language models on the backbone: presets, the mixer laws at model level, generation."""

import pytest
import torch

from seqlab.models import count_parameters, create, list_models

PRESETS = ["test-mamba", "test-s4d"]


def _states_close(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    else:
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _states_close(u, v)


@pytest.mark.parametrize("name", PRESETS)
def test_step_equals_forward_and_chunked_equals_whole(name):
    torch.manual_seed(0)
    model = create(name, vocab_size=13).eval()
    x = torch.randint(0, 13, (2, 11))
    full, s_full = model(x, return_state=True)
    state, outs = model.init_state(2), []
    for t in range(11):
        y, state = model.step(x[:, t], state)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), full, atol=1e-5, rtol=1e-5)
    _states_close(state, s_full)
    a, s = model(x[:, :4], return_state=True)
    b, s = model(x[:, 4:], state=s, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", PRESETS)
def test_causal_every_parameter_learns_and_generates(name):
    torch.manual_seed(0)
    model = create(name, vocab_size=7)
    x = torch.randint(0, 7, (2, 9))
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 7
    model.eval()
    torch.testing.assert_close(model(x)[:, :5], model(x2)[:, :5])
    model.train()
    model(x).logsumexp(-1).mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname
    out = model.generate(x[:, :3], 5, temperature=0)
    assert out.shape == (2, 8) and torch.equal(out[:, :3], x[:, :3])


def test_presets_are_registered_with_sensible_sizes():
    assert {"mamba-tiny", "mamba-small", "s4d-tiny", "s4d-small", "test-mamba", "test-s4d"} <= set(
        list_models()
    )
    for name in ("mamba-tiny", "s4d-tiny"):
        assert 1e6 <= count_parameters(name) <= 2e6, name
    for name in ("mamba-small", "s4d-small"):
        assert 5e6 <= count_parameters(name) <= 10e6, name
    m = create("test-mamba")
    assert all(b.mlp is None for b in m.blocks)  # Mamba blocks have no channel mixer
    assert m.head.weight is m.embed.weight
