"""Timings that survive a busy machine: contenders interleaved round by round, a spread beside each median,
noisy rows marked, and no flat/grows verdict on decode scaling that the spread cannot carry."""

import json
import random

import pytest

from seqlab.lab.decode import decode_profiles, row_spread, scaling_verdict
from seqlab.lab.records import RunCache, Spread, interleave
from seqlab.lab.suite import Suite, _adding
from seqlab.lab.systems import Systems
from seqlab.models import create

TINY = Suite("tiny", 8_000, 1, (_adding(12, 6),), decode_contexts=(8, 64), throughput_lengths=(16,))


class FakeClock:
    """A clock that moves ``step`` seconds per reading, times a random factor in [1, 1 + noise)."""

    def __init__(self, step: float = 1e-3, noise: float = 0.0, seed: int = 0):
        self.now, self.step, self.noise, self.rng = 0.0, step, noise, random.Random(seed)

    def __call__(self) -> float:
        self.now += self.step * (1 + self.noise * self.rng.random() * self.rng.choice((0, 1, 10)))
        return self.now


def test_contenders_take_turns_in_every_round_and_the_order_reverses():
    calls = []
    units = {name: (lambda name=name: calls.append(name) or 1.0) for name in "abc"}
    spreads = interleave(units, min_rounds=3, max_rounds=3)
    assert calls == list("abc") + list("abc") + list("cba") + list("abc")  # warm-up, then round-robin
    assert all(s.samples == (1.0, 1.0, 1.0) and not s.noisy() for s in spreads.values())


def test_quiet_timings_stop_early_and_noisy_ones_run_to_the_time_cap():
    quiet = interleave({"a": lambda: 1.0}, min_rounds=5, max_rounds=50, clock=FakeClock())
    assert len(quiet["a"].samples) == 5
    rng = random.Random(1)
    clock = FakeClock(step=1.0)
    noisy = interleave(
        {"a": lambda: rng.choice((1.0, 3.0))}, min_rounds=5, max_rounds=500, time_cap_s=40, clock=clock
    )
    assert 5 < len(noisy["a"].samples) < 500 and noisy["a"].noisy()


def test_spread_is_the_interquartile_range():
    s = Spread((1.0, 2.0, 3.0, 4.0, 5.0))
    assert (s.median, s.iqr) == (3.0, 2.0) and s.relative == pytest.approx(2 / 3) and s.noisy()
    assert not Spread((1.0, 1.01, 0.99, 1.0, 5.0)).noisy()  # one outlier does not move the quartiles


def test_the_verdict_is_withheld_when_the_spread_straddles_the_line():
    tight = Spread((1.0, 1.02, 0.98, 1.01, 0.99))
    assert scaling_verdict(tight, Spread(tuple(8 * x for x in tight.samples))) == "grows"
    assert scaling_verdict(tight, tight) == "flat"
    wide = Spread((1.0, 4.5, 0.8, 3.0, 1.2))  # GRU "4.5 ms at 64, 1.0 ms at 8192" on a busy machine
    assert scaling_verdict(wide, tight) == "unclear (noisy)"
    assert scaling_verdict(tight, wide) == "unclear (noisy)"
    assert scaling_verdict(tight, Spread((0.2, 0.21, 0.2, 0.22, 0.2))) == "unclear (near the line)"


@pytest.mark.parametrize("noise, verdict", [(0.0, "flat"), (3.0, "unclear (noisy)")])
def test_decode_rows_carry_their_spread_and_a_noisy_clock_gets_no_verdict(noise, verdict):
    model = create("test-lm-lstm", vocab_size=11)
    rows = decode_profiles(
        {"m": model}, 11, (4, 32), n_steps=2, time_cap_s=0.5, clock=FakeClock(noise=noise)
    )["m"]
    assert [r["context"] for r in rows] == [4, 32]
    assert all(len(r["latency_ms_samples"]) >= 5 and r["latency_iqr_ms"] >= 0 for r in rows)
    assert scaling_verdict(row_spread(rows[0]), row_spread(rows[-1])) == verdict
    assert row_spread(rows[0]).noisy() == (noise > 0)


@pytest.mark.parametrize("noise", [0.0, 3.0])
def test_systems_rows_mark_noisy_timings_and_store_the_load_average(tmp_path, noise):
    base = {"suite": "tiny", "budget": 8_000, "n_layers": 1, "seed": 0}
    clock = FakeClock(noise=noise)
    systems = Systems(dataclass_cap(TINY), ["gru"], 0, RunCache(tmp_path), base, False, clock=clock)
    records = systems.records()
    timed = [r for r in records if r.metric in ("latency_ms", "train_tokens_per_s")]
    assert len(timed) == 3 and all(r.spread is not None and r.noisy == (noise > 0) for r in timed)
    line = next(ln for ln in systems.summary(records) if ln.startswith("gru"))
    assert ("unclear (noisy)" in line and "*" in line) == (noise > 0)
    assert ("flat" in line and "*" not in line) == (noise == 0)
    stored = json.loads((tmp_path / "runs" / "gru__systems.json").read_text())
    assert len(stored["load_1min"]) == 2 and len(stored["decode"][0]["latency_ms_samples"]) >= 5
    assert set(systems.loads) == {"decode", "throughput"}
    assert any(ln.startswith("load average (1 min)") for ln in systems.summary(records))


def dataclass_cap(suite: Suite) -> Suite:
    import dataclasses

    return dataclasses.replace(suite, timing_cap_s=0.5)


def test_timings_of_the_same_rounds_are_compared_round_by_round():
    """A slow phase of the machine slows both timings of a round: their ratio stays put (the GRU of a quick
    suite on a quiet machine: 0.7-1.4 ms per token from round to round at both contexts)."""
    drift = (0.7, 1.2, 1.15, 0.93, 0.89, 0.70, 0.90, 0.78, 1.25, 1.31, 0.74)
    short = Spread(drift)
    assert short.noisy()
    assert scaling_verdict(short, Spread(tuple(1.02 * x for x in drift))) == "flat"
    assert scaling_verdict(short, Spread(tuple(1.5 * x for x in drift))) == "grows"
    shuffled = Spread(drift[5:] + drift[:5])  # the same numbers, no longer paired by round
    assert scaling_verdict(short, shuffled) == "unclear (noisy)"
    unpaired = Spread(drift[:-1])  # different numbers of rounds: the unpaired quartile range
    assert scaling_verdict(short, unpaired) == "unclear (noisy)"
