"""seqlab -> Hugging Face export: tiny random seqlab models through ``to_hf`` give the same outputs in
transformers (float64), ``from_hf(to_hf(m))`` gives m's tensors back, ``save_hf`` folders load through the
Auto classes with their tokenizers, and ``seqlab export`` works end to end on a checkpoint trained for 2 steps."""

import dataclasses
import json
import logging

import pytest
import torch

from seqlab.cli import main
from seqlab.interop import from_hf
from seqlab.interop.hf_export import save_hf, to_hf
from seqlab.models import create

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

TOL = {"atol": 1e-6, "rtol": 1e-6}
"""float64 on both sides; the gap left is HF's float32 rotary angles and Mamba's float32 logits (about 1e-8)."""

_LLAMA_MIXER = {"bias": True, "n_kv_heads": 1, "head_dim": 16, "rope_base": 5e5}
CASES = [
    ("test-gpt", {}, "GPT2LMHeadModel"),
    ("test-gpt", {"tie_weights": False, "mlp": "gelu", "d_ff": 48}, "GPT2LMHeadModel"),
    ("test-gpt-llama", {}, "LlamaForCausalLM"),
    ("test-gpt-llama", {"bias": True, "tie_weights": True, "mixer_config": _LLAMA_MIXER}, "LlamaForCausalLM"),
    ("test-mamba", {}, "MambaForCausalLM"),
    ("test-mamba", {"tie_weights": False, "norm_eps": 1e-5}, "MambaForCausalLM"),
    ("test-mamba2", {}, "Mamba2ForCausalLM"),
    ("test-mamba2", {"tie_weights": False, "n_groups": 2, "d_state": 6}, "Mamba2ForCausalLM"),
    ("test-bert", {}, "BertModel"),
    ("test-bert", {"pooler": False, "activation": "gelu_tanh"}, "BertModel"),
    ("test-vit", {}, "ViTForImageClassification"),
    ("test-vit", {"n_classes": 0, "pooler": True}, "ViTModel"),
]


def _tiny(name, **overrides):
    torch.manual_seed(0)
    model = create(name, **overrides).double().eval()
    with torch.no_grad():  # move every parameter off its initial value (zero biases, unit norms)
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def _inputs(model):
    g = torch.Generator().manual_seed(1)
    if model.family == "vit":
        return torch.rand(2, 3, 16, 16, generator=g, dtype=torch.float64)
    return torch.randint(0, model.config.vocab_size, (2, 11), generator=g)


def _outputs(model, hf, x):
    """Comparable outputs: logits (LMs, classifier), hidden states (BERT), pooled features (ViTModel)."""
    with torch.no_grad():
        out = hf(x)
        if model.family == "encoder":
            return model(x), out.last_hidden_state
        if type(hf).__name__ == "ViTModel":
            return model(x), out.pooler_output
        return model(x), out.logits.to(torch.float64)  # MambaForCausalLM returns float32 logits


@pytest.mark.parametrize(("name", "overrides", "hf_class"), CASES)
def test_same_outputs_and_round_trip(name, overrides, hf_class):
    model = _tiny(name, **overrides)
    hf = to_hf(model)
    assert type(hf).__name__ == hf_class and hf.dtype == torch.float64 and not hf.training
    ours, theirs = _outputs(model, hf, _inputs(model))
    torch.testing.assert_close(ours, theirs, **TOL)
    back = from_hf(hf).state_dict()
    mine = model.state_dict()
    assert back.keys() == mine.keys()
    for k, t in mine.items():
        assert torch.equal(back[k], t), k


@pytest.mark.parametrize("name", ["test-gpt", "test-gpt-llama", "test-mamba", "test-mamba2"])
def test_greedy_generation_matches(name):
    model = _tiny(name).float()
    hf = to_hf(model)
    prompt = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(2))
    ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(prompt, 12, temperature=0), ref)


def test_mode_dtype_and_tying_follow_the_model():
    model = create("test-gpt").train()
    hf = to_hf(model)
    assert hf.training and hf.dtype == torch.float32
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
    hf.lm_head.weight.data.zero_()  # a copy: the seqlab model is untouched
    assert model.head.weight.abs().sum() > 0


def test_llama_with_attention_bias_but_no_mlp_bias():
    """HF Llama has one switch for each (the importer wants them equal, so no round trip here)."""
    model = _tiny("test-gpt-llama", mixer_config={"bias": True})
    hf = to_hf(model)
    assert hf.config.attention_bias and not hf.config.mlp_bias
    torch.testing.assert_close(*_outputs(model, hf, _inputs(model)), **TOL)


def test_bert_without_segments_gets_a_zero_token_type_row():
    model = _tiny("test-bert", type_vocab_size=0)
    hf = to_hf(model)
    assert torch.equal(hf.embeddings.token_type_embeddings.weight, torch.zeros(1, 32, dtype=torch.float64))
    ids = _inputs(model)
    torch.testing.assert_close(*_outputs(model, hf, ids), **TOL)


@pytest.mark.parametrize(
    ("name", "auto"),
    [
        ("test-gpt", "AutoModelForCausalLM"),
        ("test-gpt-llama", "AutoModelForCausalLM"),
        ("test-mamba", "AutoModelForCausalLM"),
        ("test-mamba2", "AutoModelForCausalLM"),
        ("test-bert", "AutoModel"),
        ("test-vit", "AutoModelForImageClassification"),
    ],
)
def test_saved_folder_loads_through_the_auto_class(tmp_path, name, auto):
    model = _tiny(name)
    result = save_hf(model, tmp_path / "out")
    assert {"config.json", "model.safetensors"} <= set(result.files) and not result.has_tokenizer
    assert result.auto_class == auto and auto in result.load_snippet()
    loaded = getattr(transformers, auto).from_pretrained(tmp_path / "out", dtype=torch.float64).eval()
    assert type(loaded).__name__ == result.hf_class
    torch.testing.assert_close(*_outputs(model, loaded, _inputs(model)), **TOL)


# ---- tokenizers -----------------------------------------------------------------------------------------------

SAMPLE = "KING:\n  the quick brown fox, my lord!\tÉté.\n"


def _tokenizers():
    from seqlab.tasks.text import CharTokenizer
    from seqlab.tasks.tokenizers import BPETokenizer, WordPieceTokenizer

    corpus = [SAMPLE * 3, "the lord of the quick foxes and the brown kings"] * 20
    return {
        "char": CharTokenizer.from_text(SAMPLE),
        "bpe": BPETokenizer.train(corpus, vocab_size=300),
        "wordpiece": WordPieceTokenizer.train(corpus, vocab_size=120),
    }


@pytest.fixture(scope="module")
def tokenizers():
    return _tokenizers()


@pytest.mark.parametrize("kind", ["char", "bpe", "wordpiece"])
def test_tokenizer_loads_with_autotokenizer_and_encodes_the_same(tmp_path, tokenizers, kind):
    tok = tokenizers[kind]
    model = create("test-bert" if kind == "wordpiece" else "test-gpt", vocab_size=max(tok.vocab_size, 8))
    result = save_hf(model, tmp_path / "out", tokenizer=tok)
    assert result.has_tokenizer and result.tokenizer_note is None
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = hf_tok(SAMPLE)["input_ids"]
    assert ids == tok.encode(SAMPLE).tolist()
    if kind != "wordpiece":  # WordPiece decoding is lossy in seqlab too (module docstring there)
        assert hf_tok.decode(ids) == SAMPLE == tok.decode(ids)
    if kind == "bpe":
        assert hf_tok.eos_token == "<|endoftext|>"


def test_tokenizer_that_cannot_be_exported_is_said_and_the_model_written(tmp_path, tokenizers, caplog):
    from seqlab.tasks.tokenizers import TranslationTokenizer

    bpe = tokenizers["bpe"]
    tok = TranslationTokenizer(bpe, bpe, shared=False)
    with caplog.at_level(logging.WARNING):
        result = save_hf(create("test-gpt"), tmp_path / "out", tokenizer=tok)
    assert not result.has_tokenizer and "source and a target" in result.tokenizer_note
    assert "no tokenizer was written" in caplog.text
    assert (tmp_path / "out" / "model.safetensors").is_file()


# ---- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("test-lstm-lm", {}, "'lstm' mixer"),
        ("test-s4d", {}, "'s4d' mixer"),
        ("test-seq2seq", {}, "'seq2seq' model"),
        ("test-show-tell", {}, "'captioner' model"),
        ("test-gpt", {"norm": "rmsnorm"}, "norm='rmsnorm'"),
        ("test-gpt", {"n_kv_heads": 2}, "n_kv_heads=2"),
        ("test-gpt", {"window": 8}, "window=8"),
        ("test-gpt", {"head_bias": True}, "head_bias=True"),
        ("test-gpt", {"position": "none"}, "no positions at all"),
        ("test-gpt-llama", {"position": "learned"}, "position='learned'"),
        ("test-lm-attention", {}, "norm='layernorm' (needs 'rmsnorm')|mlp='gelu' (needs 'swiglu')"),
        ("test-mamba", {"d_ff": 16}, "d_ff=16"),
        ("test-mamba2", {"d_ff": 16, "norm_eps": 1e-6}, "d_ff=16|the gated norm's eps 1e-05"),
        ("test-vit-mean", {}, "pool='mean'|position='sincos'"),
        ("test-vit", {"pooler": True}, "pooler=True with a classification head"),
    ],
)
def test_what_hf_cannot_represent_is_refused_by_name(name, overrides, message):
    with pytest.raises(ValueError, match="cannot export") as err:
        to_hf(create(name, **overrides))
    for part in message.split("|"):  # every misfit is named at once
        assert part in str(err.value)


def test_unsupported_family_lists_the_exportable_ones(tmp_path):
    with pytest.raises(ValueError, match="Exportable seqlab families: 'lm'") as err:
        save_hf(create("test-transformer"), tmp_path / "out")
    assert "'encoder' (BertModel)" in str(err.value) and not (tmp_path / "out").exists()


def test_non_empty_out_dir_is_refused_and_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(FileExistsError, match="already holds files"):
        save_hf(create("test-gpt"), out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(FileExistsError, match="not a directory"):
        save_hf(create("test-gpt"), tmp_path / "file")
    (out / "notes.txt").unlink()  # an empty directory is fine
    assert save_hf(create("test-gpt"), out).hf_class == "GPT2LMHeadModel"


# ---- the command ----------------------------------------------------------------------------------------------

TEXT = "".join(f"KING:\nline {i}, my lord, the quick brown fox.\n\n" for i in range(200))


def _train(tmp_path):
    (tmp_path / "play.txt").write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--model.name=test-gpt",
            "--task.name=text",
            "--task.sampling=random",
            f"--task.source={tmp_path / 'play.txt'}",
            "--task.seq_len=16",
            "--task.batch_size=4",
            "--train.steps=2",
            "--train.eval_every=2",
            "--train.eval_batches=1",
            "--train.progress=false",
            "--out",
            str(run),
        ]
    )
    assert rc == 0
    return run


def test_export_command_end_to_end(tmp_path, capsys):
    from seqlab.training.checkpoint import load_model, load_tokenizer

    run, out = _train(tmp_path), tmp_path / "hf"
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(run), "--format", "hf", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote GPT2LMHeadModel to {out}" in printed and "tokenizer: written" in printed
    assert f"AutoModelForCausalLM.from_pretrained({str(out)!r})" in printed
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["GPT2LMHeadModel"]

    ours, tok = load_model(run).eval(), load_tokenizer(run, "test")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = hf_tok("KING:\nline 3, my lord", return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == tok.encode("KING:\nline 3, my lord").tolist()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), atol=1e-5, rtol=1e-5)

    before = sorted(p.name for p in out.iterdir())
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before


def test_export_command_errors(tmp_path, capsys):
    assert main(["export", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(tmp_path), "--format", "onnx", "--out", str(tmp_path / "o")])
    assert "invalid choice: 'onnx'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_export_refuses_before_loading(tmp_path, capsys, monkeypatch):
    """A path under a file, '.', or a family transformers has no class for: said before the model is loaded."""
    from seqlab.cli import main
    from seqlab.training import checkpoint

    model = create("test-lstm-lm", vocab_size=7)
    checkpoint.save_checkpoint(
        tmp_path / "run", 1, model, {"family": "lm", "model": dataclasses.asdict(model.config)}
    )

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(checkpoint, "load_model", never)
    afile = tmp_path / "afile"
    afile.write_text("mine", encoding="utf-8")
    for out, message in [
        (str(afile / "x"), "afile is a file, not a folder"),
        (".", "names no directory of its own"),
    ]:
        assert main(["export", "--checkpoint", str(tmp_path / "run"), "--format", "hf", "--out", out]) == 2
        assert message in capsys.readouterr().err
    # the mixer, and a config the target class cannot represent: refused from config.json alone
    assert main(["export", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "o1")]) == 2
    assert "cannot export an LM with the 'lstm' mixer" in capsys.readouterr().err
    gpt = create("test-gpt", vocab_size=7, norm="rmsnorm")
    checkpoint.save_checkpoint(
        tmp_path / "gpt", 1, gpt, {"family": "lm", "model": dataclasses.asdict(gpt.config)}
    )
    assert main(["export", "--checkpoint", str(tmp_path / "gpt"), "--out", str(tmp_path / "o2")]) == 2
    assert "norm='rmsnorm' (needs 'layernorm')" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
