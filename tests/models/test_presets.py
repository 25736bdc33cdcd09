"""Literature presets against their published parameter counts (built on the meta device), the FLOP
accounting, and conformance of the Transformer families' tiny presets."""

import dataclasses

import pytest
import torch

from seqlab.models import PRESETS, build, count_parameters, create
from seqlab.models.flops import report

# (preset, published count, source)
PUBLISHED = [
    ("gpt2", 124e6, "GPT-2 small as released (the paper's table 2 says 117M)"),
    ("gpt2-xl", 1542e6, "Radford et al. 2019, table 2 (1.5B)"),
    ("gpt3-175b", 175e9, "Brown et al. 2020, table 2.1"),
    ("bert-base", 110e6, "Devlin et al. 2018, section 3"),
    ("bert-large", 340e6, "Devlin et al. 2018, section 3"),
    ("minilm-l6", 22.7e6, "all-MiniLM-L6-v2 model card"),
    ("transformer-big", 213e6, "Vaswani et al. 2017, table 3"),
]


@pytest.mark.parametrize(("name", "published", "source"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_count_within_two_percent(name, published, source):
    n = count_parameters(name)
    assert abs(n - published) / published < 0.02, f"{name}: {n:,} vs {published:,.0f} ({source})"


def test_transformer_base_count_and_why_it_is_not_65m():
    # 63.1M with the paper's stated 37,000-token shared vocabulary (-2.95%). The published totals, 65M (base) and
    # 213M (big), imply vocabularies about 4,900 tokens apart, neither of them 37,000: they are not the counts of
    # one vocabulary. The preset keeps the stated hyperparameters; a V between 38.3k and 39.9k would bring both
    # within 2%, but only by fitting two rounded totals (see the note above PRESETS in transformer.py).
    n, big = count_parameters("transformer-base"), count_parameters("transformer-big")
    assert n == 63_082_496 and abs(n - 65e6) / 65e6 < 0.03
    layers_base, layers_big = n - 37000 * 512, big - 37000 * 1024
    v_base, v_big = (65e6 - layers_base) / 512, (213e6 - layers_big) / 1024
    assert 40_000 < v_base < 41_000 and 35_000 < v_big < 36_000


def test_report_components_and_flops():
    r = report("gpt2")
    assert r.total == count_parameters("gpt2") == sum(r.by_component.values())
    assert r.by_component["embeddings"] == 50257 * 768 + 1024 * 768 and r.by_component["head"] == 0
    assert r.by_component["attention"] == 12 * (4 * 768 * 768 + 4 * 768)
    assert r.by_component["mlp"] == 12 * (8 * 768 * 768 + 5 * 768)
    assert r.matmul_params == 12 * 12 * 768 * 768 + 50257 * 768  # blocks + the tied head's matmul
    assert r.flops_per_token == 2 * r.matmul_params + 4 * 12 * 1024 * 768
    assert ("head.weight", (256, 32)) in report("test-gpt-llama").shapes["head"]


TINY = sorted(
    n for n, (fam, _) in PRESETS.items() if fam in ("gpt", "encoder", "transformer") and n.startswith("test-")
)


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_conform(name):
    torch.manual_seed(0)
    model = create(name)
    family = PRESETS[name][0]
    ids = torch.randint(3, 32, (2, 6))
    out = model(ids, ids) if family == "transformer" else model(ids)
    out.float().square().mean().backward()
    for n, p in model.named_parameters():
        if n.startswith("pooler"):
            continue  # the encoder's pooler only serves the CLS classification head
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    again = build(family, dataclasses.asdict(model.config))
    again.load_state_dict(model.state_dict())
    model.eval(), again.eval()
    with torch.no_grad():
        a = model(ids, ids) if family == "transformer" else model(ids)
        b = again(ids, ids) if family == "transformer" else again(ids)
    torch.testing.assert_close(a, b)


def test_params_command(capsys):
    from seqlab.cli import main

    assert main(["params", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808 parameters" in out and "FLOPs per token at context 1024" in out
    assert main(["params", "test-gpt", "--model.n_layers=1", "--shapes"]) == 0
    out = capsys.readouterr().out
    assert "blocks.0.mixer.in_proj_weight" in out and "blocks.1." not in out
    assert main(["params", "test-gpt", "--train.steps=3"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["test-gpt", "--model.name=gpt2"], "the preset is the command's argument (seqlab params test-gpt)"),
        (["test-gpt", "--model.max_seq_len=16", "--context", "1000"], "longer than the model's 16 learned"),
        (["test-video", "--context", "3"], "--context: a 'video' model's FLOPs are not given per token"),
        (["vit-base-16", "--context", "100"], "a ViT reads 197 tokens per image"),
    ],
)
def test_params_refuses_what_it_cannot_count(argv, message, capsys):
    """A traceback (--model.name), FLOPs at a context the model cannot read, or --context ignored."""
    from seqlab.cli import main

    assert main(["params", *argv]) == 2
    assert message in capsys.readouterr().err


def test_params_names_the_components_and_the_context_it_counts(capsys):
    """Mamba's mixers were 97.6% 'other'; a model without multi-head attention reported 'context 0'."""
    from seqlab.cli import main

    assert main(["params", "mamba-tiny"]) == 0
    out = capsys.readouterr().out
    assert "other" not in out and "ssm" in out and "the same at any context length" in out
    assert main(["params", "test-seq2seq"]) == 0
    out = capsys.readouterr().out
    assert "context 0" not in out and "attention over the source" in out
    assert main(["params", "vit-base-16"]) == 0
    assert "at context 197" in capsys.readouterr().out


def test_a_model_larger_than_memory_is_refused_before_allocation(monkeypatch):
    import seqlab.models as models

    monkeypatch.setattr(models, "_available_bytes", lambda: 10_000)  # test-gpt's weights need more than 10 kB
    with pytest.raises(ValueError, match=r"needs .* GiB for its weights alone.*Nothing was allocated"):
        create("test-gpt")
    assert count_parameters("gpt3-175b") > 0  # counting builds on the meta device: always allowed
    create("test-gpt", device=torch.device("meta"))
