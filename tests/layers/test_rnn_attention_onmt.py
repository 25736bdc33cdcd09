"""Parity of seqlab's RNN attention with OpenNMT-py's ``GlobalAttention`` (onmt/modules/global_attention.py),
weight for weight in float64: Luong's dot and general scores and Bahdanau's additive ("mlp") score.

OpenNMT-py is installed with ``--no-deps`` (``make test`` does): its package ``__init__`` imports its tokenizer,
so the test loads global_attention.py from its file with its two small onmt imports provided.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from seqlab.layers.rnn_attention import AttentionalHidden


def _onmt_global_attention(monkeypatch):
    spec = importlib.util.find_spec("onmt")
    if spec is None:
        pytest.skip("needs opennmt-py: pip install --no-deps opennmt-py==3.5.1")
    root = Path(spec.submodule_search_locations[0])

    def load(name: str, path: Path):
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module

    sparse = types.ModuleType("onmt.modules.sparse_activations")
    sparse.sparsemax = None  # only the softmax path is compared
    monkeypatch.setitem(sys.modules, "onmt.modules.sparse_activations", sparse)
    monkeypatch.setitem(sys.modules, "onmt.utils.misc", load("onmt.utils.misc", root / "utils" / "misc.py"))
    return load("onmt_global_attention", root / "modules" / "global_attention.py").GlobalAttention


def _copy_weights(ours: AttentionalHidden, theirs) -> None:
    with torch.no_grad():
        ours.out_proj.weight.copy_(theirs.linear_out.weight)
        if ours.out_proj.bias is not None:
            ours.out_proj.bias.copy_(theirs.linear_out.bias)
        if ours.score == "general":
            ours.attn.W_a.weight.copy_(
                theirs.linear_in.weight.t()
            )  # theirs: (W h_t)·h_s; ours: h_t·(W_a h_s)
        elif ours.score == "concat":
            ours.attn.query_proj.weight.copy_(theirs.linear_query.weight)
            ours.attn.key_proj.weight.copy_(theirs.linear_context.weight)
            ours.attn.key_proj.bias.copy_(
                theirs.linear_query.bias
            )  # W q + b + U h: where b sits is immaterial
            ours.attn.v.weight.copy_(theirs.v.weight)


@pytest.mark.parametrize("score,onmt_type", [("dot", "dot"), ("general", "general"), ("concat", "mlp")])
@pytest.mark.parametrize("many", [False, True])
def test_matches_opennmt_global_attention(monkeypatch, score, onmt_type, many):
    GlobalAttention = _onmt_global_attention(monkeypatch)
    torch.manual_seed(0)
    b, s, t, d = 3, 7, 4, 8
    theirs = GlobalAttention(d, attn_type=onmt_type).double()
    ours = AttentionalHidden(d, score).double()
    _copy_weights(ours, theirs)
    lengths = torch.tensor([7, 3, 5])
    mask = torch.arange(s)[None, :] < lengths[:, None]  # (b, s), True at real positions
    memory = torch.randn(b, s, d, dtype=torch.float64)
    query = torch.randn(b, t, d, dtype=torch.float64) if many else torch.randn(b, d, dtype=torch.float64)
    query.requires_grad_(True)
    memory.requires_grad_(True)

    h_ours, w_ours = ours(query, memory, mask=mask)
    h_theirs, w_theirs = theirs(query, memory, src_len=lengths)
    if score == "concat":  # OpenNMT leaves W_c [c; q] linear for "mlp"; Luong's eq. 5 (and seqlab) takes tanh
        h_theirs = torch.tanh(h_theirs)
    torch.testing.assert_close(w_ours, w_theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(h_ours, h_theirs, rtol=0, atol=1e-12)
    pad = ~mask[:, None, :].expand_as(w_ours) if many else ~mask
    assert bool((w_ours[pad] == 0).all())  # padded source positions get exactly zero weight

    g = torch.randn_like(h_ours)
    grads_ours = torch.autograd.grad((h_ours * g).sum(), (query, memory))
    grads_theirs = torch.autograd.grad((h_theirs * g).sum(), (query, memory))
    for a, c in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-12)
