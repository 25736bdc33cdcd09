"""seqlab.models.beam: beam search against exhaustive search, greedy, batching, extras, boundary errors; and the
Transformer decoding through it, with the cross-attention weights along the returned hypotheses."""

import itertools
import math

import pytest
import torch

from seqlab.layers.masks import key_padding_mask
from seqlab.layers.transformer_blocks import TransformerDecoderLayer
from seqlab.models import create
from seqlab.models.beam import beam_rows, beam_search, greedy_search, length_penalty_gnmt

# the toy model: v = 4 tokens, every one of them possible at every step (pad and bos included)
V, BOS, PAD, EOS, MAX_LEN = 4, 1, 2, 3, 4
IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD}


def _table(seed: int, b: int) -> torch.Tensor:
    """(b, V^MAX_LEN, V) log p(next | prefix): one random distribution per sentence and whole prefix."""
    g = torch.Generator().manual_seed(seed)
    return (2.0 * torch.randn(b, V**MAX_LEN, V, generator=g, dtype=torch.float64)).log_softmax(-1)


def _toy(table: torch.Tensor):
    """step and reorder over a state (sentence (N,), prefix code (N,)); the prefix y_0..y_t (y_0 = bos) is
    coded as the base-V number y_0 y_1 ... y_t, so the extra [code, sentence] names the row's whole path."""

    def step(last, state):
        sentence, code = state
        after_eos = (code >= V) & (code % V == EOS)  # the row's previous token was eos
        assert (last[after_eos] == PAD).all(), "a finished row must continue with pad"
        code = code * V + last  # (N,)
        extra = torch.stack([code, sentence], dim=1).double()  # (N, 2)
        return table[sentence, code], (sentence, code), extra

    def reorder(state, rows):
        return state[0][rows], state[1][rows]

    return step, reorder


def _start(b: int, k: int = 1):
    rows = beam_rows(b, k)
    return rows, torch.zeros_like(rows)


def _beam(table, k, alpha=0.6, max_len=MAX_LEN):
    step, reorder = _toy(table)
    b = table.size(0)
    kw = {"batch_size": b, "beam_size": k, "max_len": max_len, "length_penalty": alpha, **IDS}
    return beam_search(step, _start(b, k), reorder, **kw)


def _greedy(table, max_len=MAX_LEN):
    step, _ = _toy(table)
    return greedy_search(step, _start(table.size(0)), batch_size=table.size(0), max_len=max_len, **IDS)


def _log_p(table_row: torch.Tensor, seq) -> float:
    code, total = BOS, 0.0
    for y in seq:
        total += float(table_row[code, y])
        code = code * V + y
    return total


def _lp(n: int, alpha: float) -> float:
    return ((5 + n) / 6) ** alpha


def _exhaustive(table_row: torch.Tensor, alpha: float) -> tuple[float, tuple[int, ...]]:
    """The best (score, sequence) over every sequence ending in eos within MAX_LEN or cut at MAX_LEN."""
    best = (-math.inf, ())
    for n in range(1, MAX_LEN + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS in seq[:-1] or (seq[-1] != EOS and n < MAX_LEN):
                continue
            best = max(best, (_log_p(table_row, seq) / _lp(n, alpha), seq))
    return best


def _sequences(out) -> list[tuple[int, ...]]:
    """The generated tokens of each row, after checking bos in front and pad after the end."""
    assert (out.tokens[:, 0] == BOS).all()
    seqs = []
    for row, n in zip(out.tokens.tolist(), out.lengths.tolist(), strict=True):
        assert all(y == PAD for y in row[1 + n :])
        seq = tuple(row[1 : 1 + n])
        assert EOS not in seq[:-1] and (n == out.tokens.size(1) - 1 or seq[-1] == EOS)
        seqs.append(seq)
    return seqs


def _check_extras(out) -> None:
    """The extra at step t is the code of the returned prefix tokens[:t + 1] and its sentence; zeros after."""
    b, n = out.tokens.size(0), out.tokens.size(1) - 1
    assert out.extras.shape == (b, n, 2)
    for i in range(b):
        for t in range(n):
            want = [0.0, 0.0]
            if t < out.lengths[i]:
                code = 0
                for y in out.tokens[i, : t + 1].tolist():
                    code = code * V + y
                want = [float(code), float(i)]
            assert out.extras[i, t].tolist() == want, (i, t)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wide_beam_is_exhaustive_search_and_narrow_ones_never_beat_it(seed, alpha):
    table = _table(seed, b=3)
    best = [_exhaustive(table[i], alpha) for i in range(3)]
    wide = _beam(table, k=V**MAX_LEN, alpha=alpha)  # wider than the 121 hypotheses there are
    assert _sequences(wide) == [seq for _, seq in best]
    torch.testing.assert_close(wide.scores, torch.tensor([s for s, _ in best], dtype=torch.float64))
    _check_extras(wide)
    for k in (1, 2, 3):
        narrow = _beam(table, k=k, alpha=alpha)
        for i, seq in enumerate(_sequences(narrow)):
            score = _log_p(table[i], seq) / _lp(len(seq), alpha)
            assert narrow.scores[i].item() == pytest.approx(score, rel=1e-12)
            assert score <= best[i][0] + 1e-12
        _check_extras(narrow)


def _beam_ref(table_row: torch.Tensor, k: int, alpha: float, max_len: int) -> tuple[float, tuple[int, ...]]:
    """The rule of seqlab.models.beam written out for one sentence, in Python: keep the k best candidates by
    raw log p (finished beams are their own only candidate), remember the best finished by log p / lp, and
    at the end compare it with the unfinished beams cut at max_len."""
    beams, best = [(0.0, (), False)], (-math.inf, ())
    for t in range(max_len):
        cands = []
        for s, seq, finished in beams:
            if finished:
                cands.append((s, seq, True))
                continue
            code = BOS
            for y in seq:
                code = code * V + y
            cands += [(s + float(table_row[code, y]), (*seq, y), y == EOS) for y in range(V)]
        beams = sorted(cands, key=lambda c: -c[0])[:k]
        for s, seq, finished in beams:
            if finished and len(seq) == t + 1:
                best = max(best, (s / _lp(t + 1, alpha), seq))
        if all(finished for _, _, finished in beams):
            break
    cut = [(s / _lp(len(seq), alpha), seq) for s, seq, finished in beams if not finished]
    return max([best, *cut])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_narrow_beams_follow_the_documented_rule(alpha):
    for seed in range(4):
        table = _table(seed, b=3)
        for k in (2, 3, 5):
            out = _beam(table, k=k, alpha=alpha)
            want = [_beam_ref(table[i], k, alpha, MAX_LEN) for i in range(3)]
            assert _sequences(out) == [seq for _, seq in want], (seed, k)
            torch.testing.assert_close(out.scores, torch.tensor([s for s, _ in want], dtype=torch.float64))


def _table_from(rows: dict[tuple[int, ...], list[float]], default: list[float]) -> torch.Tensor:
    """(1, V^MAX_LEN, V) log-probs: p(next | prefix) = rows[prefix] (prefix after bos), else ``default``."""
    table = torch.tensor(default, dtype=torch.float64).expand(1, V**MAX_LEN, V).clone()
    for prefix, p in rows.items():
        code = BOS
        for y in prefix:
            code = code * V + y
        table[0, code] = torch.tensor(p, dtype=torch.float64)
    return table.log()


def test_a_finished_hypothesis_pushed_out_of_the_beam_is_still_returned():
    """k = 2. Step 1: x = 0 (0.65) and eos (0.30) fill the beam, eos is finished. Step 2: x's two children
    (0.65 · 0.49 = 0.3185 each) push eos out. Every longer hypothesis has p < 0.08: eos alone is the best."""
    table = _table_from({(): [0.65, 0.02, 0.03, 0.30], (0,): [0.01, 0.49, 0.49, 0.01]}, [0.25] * 4)
    for alpha in (0.0, 0.6):
        out = _beam(table, k=2, alpha=alpha, max_len=3)
        assert _sequences(out) == [(EOS,)] == [_exhaustive(table[0], alpha)[1]]
        torch.testing.assert_close(out.scores, torch.tensor([math.log(0.3)], dtype=torch.float64))


def test_a_finished_beam_holds_one_slot_at_no_cost_and_the_search_stops_when_all_are_finished():
    # eos after bos at 0.9 stays in the beam, one slot, at log 0.9; the other slot (x = 0, log 0.05) can never
    # beat it (log p only falls), so the search is over after one step
    table = _table_from({(): [0.05, 0.025, 0.025, 0.9]}, [0.4, 0.3, 0.2, 0.1])
    out = _beam(table, k=2, alpha=0.0)
    assert _sequences(out) == [(EOS,)] and out.tokens.size(1) == 1 + 1
    torch.testing.assert_close(out.scores, torch.tensor([math.log(0.9)], dtype=torch.float64))
    # with a length penalty the bound is log p / lp(max_len): eos at 0.2 first, x = 0 at 0.7 then eos at 0.9
    # beats it later (log(0.63) / lp(2) > log(0.2) / lp(1)), so the search goes on and finds it
    table = _table_from({(): [0.7, 0.05, 0.05, 0.2], (0,): [0.05, 0.025, 0.025, 0.9]}, [0.4, 0.3, 0.2, 0.1])
    out = _beam(table, k=2, alpha=1.0)
    assert _sequences(out) == [(0, EOS)]
    # eos at 0.9 everywhere, alpha 0.6: x = 0 (log 0.05) reaches at best log 0.05 / lp(4) = -2.3, below
    # log 0.9 / lp(1) = -0.1: again one step. Where the unfinished beam can still win (x at 0.6, then eos
    # certain), the search goes on until both beams are finished, after step 2
    table = _table_from({}, [0.05, 0.025, 0.025, 0.9])
    out = _beam(table, k=2, alpha=0.6)
    assert _sequences(out) == [(EOS,)] and out.tokens.size(1) == 1 + 1
    assert _greedy(table).tokens.tolist() == [[BOS, EOS]]
    table = _table_from({(): [0.6, 0.0, 0.0, 0.4], (0,): [0.0, 0.0, 0.0, 1.0]}, [0.25] * 4)
    out = _beam(table, k=2, alpha=1.0)
    assert _sequences(out) == [(0, EOS)] and out.tokens.size(1) == 1 + 2


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_of_one_is_greedy(seed):
    table = _table(seed, b=5)
    greedy, beam = _greedy(table), _beam(table, k=1, alpha=0.0)
    assert torch.equal(beam.tokens, greedy.tokens) and torch.equal(beam.lengths, greedy.lengths)
    torch.testing.assert_close(beam.scores, greedy.scores, rtol=0, atol=0)
    torch.testing.assert_close(beam.extras, greedy.extras, rtol=0, atol=0)
    _check_extras(greedy)
    for i, seq in enumerate(_sequences(greedy)):  # the argmax at each step, by hand
        code, want = BOS, []
        for _ in range(MAX_LEN):
            y = int(table[i, code].argmax())
            want.append(y)
            if y == EOS:
                break
            code = code * V + y
        assert seq == tuple(want)
        assert greedy.scores[i].item() == pytest.approx(_log_p(table[i], seq), rel=1e-12)


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_batched_equals_one_sentence_at_a_time(search):
    table = _table(7, b=4)

    def run(t):
        return _beam(t, k=3, alpha=0.6) if search == "beam" else _greedy(t)

    together = run(table)
    for i in range(4):
        alone = run(table[i : i + 1])
        n = alone.tokens.size(1)
        assert torch.equal(together.tokens[i : i + 1, :n], alone.tokens)
        assert (together.tokens[i, n:] == PAD).all() and torch.equal(
            together.lengths[i : i + 1], alone.lengths
        )
        torch.testing.assert_close(together.scores[i : i + 1], alone.scores)
        ex, n_gen = together.extras[i], int(alone.lengths[0])
        assert torch.equal(ex[: n - 1, 0], alone.extras[0, :, 0]) and (ex[n - 1 :] == 0).all()
        assert (ex[:n_gen, 1] == i).all() and (alone.extras[0, :n_gen, 1] == 0).all()  # the sentence index


def test_length_penalty_is_gnmts():
    lengths = torch.tensor([0, 1, 7])
    torch.testing.assert_close(
        length_penalty_gnmt(lengths, 0.6), ((5 + lengths.double()) / 6) ** 0.6, check_dtype=False
    )
    assert (length_penalty_gnmt(lengths, 0.0) == 1).all() and length_penalty_gnmt(torch.tensor([1]), 1.0) == 1


def test_zero_steps_give_bos_only():
    table = _table(0, b=2)
    for out in (_beam(table, k=3, max_len=0), _greedy(table, max_len=0)):
        assert out.tokens.tolist() == [[BOS], [BOS]] and out.lengths.tolist() == [0, 0]
        assert out.scores.tolist() == [0.0, 0.0] and out.extras is None


def test_boundary_errors():
    table = _table(0, b=2)
    step, reorder = _toy(table)
    kw = {"batch_size": 2, "beam_size": 2, "max_len": 3, **IDS}
    with pytest.raises(ValueError, match="beam_size must be a positive integer, got 0"):
        beam_search(step, _start(2, 2), reorder, **{**kw, "beam_size": 0})
    with pytest.raises(ValueError, match="beam_size must be a positive integer, got 0"):
        beam_rows(2, 0)
    with pytest.raises(ValueError, match="max_len must be an integer >= 0, got -1"):
        beam_search(step, _start(2, 2), reorder, **{**kw, "max_len": -1})
    with pytest.raises(ValueError, match="max_len must be an integer >= 0, got -1"):
        greedy_search(step, _start(2), batch_size=2, max_len=-1, **IDS)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        greedy_search(step, _start(2), batch_size=0, max_len=3, **IDS)
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0, got -1"):
        beam_search(step, _start(2, 2), reorder, **{**kw, "length_penalty": -1.0})
    with pytest.raises(ValueError, match=r"log-probs of shape \(2, 4\), expected \(4, v\)"):
        beam_search(lambda last, state: (torch.zeros(2, V), state, None), None, reorder, **kw)

    def changing_vocab(last, state):
        logp, state, extra = step(last, state)
        return (logp if int(state[1][0]) < V else logp[:, :3]), state, extra

    with pytest.raises(ValueError, match=r"log-probs of shape \(4, 3\), expected \(4, 4\)"):
        beam_search(changing_vocab, _start(2, 2), reorder, **kw)

    def bad_extra(last, state):
        logp, state, extra = step(last, state)
        return logp, state, extra[:1]

    with pytest.raises(ValueError, match=r"extra of shape \(1, 2\), expected \(2, 2\)"):
        greedy_search(bad_extra, _start(2), batch_size=2, max_len=3, **IDS)
    with pytest.raises(ValueError, match=r"must return \(log_probs, state, extra\)"):
        greedy_search(lambda last, state: step(last, state)[:2], _start(2), batch_size=2, max_len=3, **IDS)


# ---- the Transformer -------------------------------------------------------------------------------------


def _transformer_and_source():
    """A random test-transformer whose eos logit is doubled: of 4 sentences some end in eos within 8 steps,
    some are cut, and beam search (k = 3) returns other hypotheses than greedy."""
    torch.manual_seed(0)
    model = create("test-transformer", dtype=torch.float64, share_embeddings=False).eval()
    with torch.no_grad():
        model.generator.weight[model.config.eos_id] *= 2.0
    src = torch.randint(3, 64, (4, 7))
    src[1, 5:] = 0  # padding
    src[2, 3:] = 0
    return model, src


@pytest.mark.parametrize("beam_size", [1, 3])
def test_transformer_generate_returns_the_attention_along_the_returned_hypotheses(beam_size):
    model, src = _transformer_and_source()
    ids, attn = model.generate(src, max_new_tokens=8, beam_size=beam_size, return_attention=True)
    b, n = ids.size(0), ids.size(1) - 1
    assert attn.shape == (b, n, 7) and attn.dtype == torch.float64
    real = src != 0
    is_eos = (ids[:, 1:] == 2).long()
    generated = (is_eos.cumsum(1) - is_eos) == 0  # (b, n): up to and including eos
    assert is_eos.any() and not generated.all()  # some hypotheses end early
    sums = attn.sum(-1)  # (b, n)
    torch.testing.assert_close(sums[generated], torch.ones_like(sums[generated]), rtol=0, atol=1e-12)
    assert (attn.masked_select(~real[:, None, :]) == 0).all()  # exactly 0 at padded source positions
    assert (attn[~generated] == 0).all()
    # the same weights from one teacher-forced pass over the returned tokens
    memory = model.encode(src, real)
    _, _, w = model._decoder_stack(ids[:, :-1], memory, real, need_weights=True)  # (b, h, n, s)
    torch.testing.assert_close(attn[generated], w.mean(1)[generated], rtol=0, atol=1e-10)
    assert torch.equal(model.generate(src, max_new_tokens=8, beam_size=beam_size), ids)
    if beam_size == 1:
        assert torch.equal(ids, model.greedy_decode(src, max_len=8))
    else:
        assert torch.equal(ids, model.beam_search(src, max_len=8, beam_size=3)[0])
        assert not torch.equal(ids, model.greedy_decode(src, max_len=8))  # the beams did reorder


def test_transformer_beam_and_greedy_run_and_agree_at_width_one():
    model, src = _transformer_and_source()
    model.train()  # decoding switches to eval and back
    greedy = model.greedy_decode(src, max_len=5)
    beam, scores = model.beam_search(src, max_len=5, beam_size=1, length_penalty=0.0)
    assert model.training and torch.equal(beam, greedy) and scores.shape == (4,)
    wide, wide_scores = model.beam_search(src, max_len=5, beam_size=4)
    assert wide.shape[0] == 4 and wide.shape[1] <= 6 and (wide[:, 0] == 1).all()
    assert torch.isfinite(wide_scores).all()
    with pytest.raises(ValueError, match="beam_size"):
        model.generate(src, beam_size=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_returns_the_cross_attention_weights(norm_first):
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first, dtype=torch.float64).eval()
    x, memory = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 6, 16, dtype=torch.float64)
    mm = key_padding_mask(torch.tensor([[True] * 6, [True] * 4 + [False] * 2]))
    y, state = layer(x, memory, memory_mask=mm)
    y2, state2, w = layer(x, memory, memory_mask=mm, need_weights=True)
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
    torch.testing.assert_close(state2[1].k, state[1].k, rtol=0, atol=0)
    if norm_first:
        h = x + layer.self_attn(layer.norm1(x))[0]
        query = layer.norm2(h)
    else:
        query = layer.norm1(x + layer.self_attn(x)[0])
    _, _, want = layer.cross_attn(query, memory, mask=mm, need_weights=True)  # (b, h, t, s)
    assert w.shape == (2, 4, 5, 6)
    torch.testing.assert_close(w, want, rtol=0, atol=0)
    assert (w[1, ..., 4:] == 0).all()
