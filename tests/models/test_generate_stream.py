"""Streaming a sample (``generate(..., on_tokens=...)``, what ``seqlab generate`` prints as it goes): the stretches
handed out as they are drawn are the sample, and the sample is the one drawn without streaming (same tokens,
same draws), on the static-cache decoder that loops in one call and on the step-by-step path."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from seqlab.commands_generate import _Stream
from seqlab.models import make_config
from seqlab.models.generation import STREAM_EVERY
from seqlab.models.gpt import gpt_fields
from seqlab.models.lm import LM


def gpt(fast_path: bool = True) -> LM:
    torch.manual_seed(0)
    return LM(make_config("lm", gpt_fields(16, 2, 4, 64, vocab_size=50)), fast_path=fast_path).eval()


def lstm() -> LM:
    torch.manual_seed(0)
    return LM(make_config("lm", {"vocab_size": 50, "d_model": 16, "n_layers": 2, "mixer": "lstm"})).eval()


@pytest.mark.parametrize("make", [gpt, lstm], ids=["static-cache", "step-by-step"])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_k": 20}])
def test_the_streamed_stretches_are_the_sample_drawn_without_streaming(make, sampling):
    model, prompt, n = make(), torch.randint(0, 50, (2, 5)), 3 * STREAM_EVERY + 3
    whole = model.generate(prompt, n, generator=torch.Generator().manual_seed(7), **sampling)
    stretches = []
    streamed = model.generate(
        prompt, n, generator=torch.Generator().manual_seed(7), on_tokens=stretches.append, **sampling
    )
    assert torch.equal(streamed, whole)
    assert torch.equal(torch.cat(stretches, dim=1), whole[:, 5:])
    assert len(stretches) > 3 and max(s.size(1) for s in stretches) <= STREAM_EVERY


def test_the_static_cache_decoder_streams_on_its_loop():
    """The fast decoder runs its loop in stretches of STREAM_EVERY tokens, not token by token."""
    model = gpt()
    assert model.why_not_fast_path() is None
    stretches = []
    model.generate(
        torch.randint(0, 50, (5,)), 2 * STREAM_EVERY + 1, temperature=0, on_tokens=stretches.append
    )
    assert [s.size(1) for s in stretches] == [1, STREAM_EVERY, STREAM_EVERY]


class Bytes:
    """A byte-level tokenizer: a character of several bytes spans several tokens."""

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(list(text.encode("utf-8")))

    def decode(self, ids: torch.Tensor) -> str:
        return bytes(ids.tolist()).decode("utf-8", errors="replace")


def test_the_printer_waits_for_a_characters_last_byte(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(_Stream, "PERIOD", 0.0)  # every token shown (else at most every 0.1 s)
    tok = Bytes()
    stream, writes = _Stream(tok, tok.encode("Ö:")), []
    rest = tok.encode(" é—x")  # é two bytes, — three
    for i in range(len(rest)):
        stream(rest[i : i + 1][None])
        writes.append(out.getvalue())
    stream.finish(tok.decode(torch.cat([tok.encode("Ö:"), rest])))
    assert out.getvalue() == "Ö: é—x\n"
    assert "\ufffd" not in "".join(writes)
    assert writes == ["Ö: ", "Ö: ", "Ö: é", "Ö: é", "Ö: é", "Ö: é—", "Ö: é—x"]  # shown as each char completes


def test_the_printer_decodes_at_most_every_period(monkeypatch):
    """Decoding the whole text at every token made a long sample quadratic: shown at most every PERIOD."""
    out, clock = io.StringIO(), [100.0]
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr("seqlab.commands_generate.time.monotonic", lambda: clock[0])
    tok = Bytes()
    stream = _Stream(tok, tok.encode(">"))
    for ch in "abcdef":
        clock[0] += 0.04
        stream(tok.encode(ch)[None])
        if ch == "b":
            assert out.getvalue() == ">"  # 0.08 s: not yet
        if ch == "c":
            assert out.getvalue() == ">abc"  # 0.12 s
    stream.finish(">abcdef")
    assert out.getvalue() == ">abcdef\n"
