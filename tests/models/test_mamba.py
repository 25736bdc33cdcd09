"""SSM language models on the backbone: presets and their sizes."""

from seqlab.models import count_parameters, create, list_models

# The mixer laws at model level (step == forward, chunked == whole, causal, gradients, generation) run for
# test-mamba and test-s4d with every other mixer in tests/models/test_lm.py.


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
