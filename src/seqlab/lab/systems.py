"""The lab's task-independent measurements: decode latency and state size against context, training
throughput and activation memory, for every mixer's model at the suite's budget.

Timings are taken so that they survive a busy machine: the contenders (every mixer's model; for decoding,
every model at every context) run round-robin, repeat until each spread (IQR / median) is below
:data:`seqlab.lab.records.SPREAD_LIMIT` or the suite's ``timing_cap_s`` is spent, and are stored with their
repeats; a timing whose spread stays large is marked noisy. The 1-minute load average before and after each
measurement is stored beside it.

Each mixer's decode and memory profile is one cached record (``RunCache``), and the throughput of all mixers is
one record; both are remeasured whenever the set of mixers changes, so the numbers side by side in a table were
always timed round-robin together. ``remeasure=True`` measures again what is cached
(the replaced files are kept as ``.prev``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from seqlab.lab.budget import build_lab_model, layout
from seqlab.lab.decode import decode_profiles, row_spread
from seqlab.lab.records import SPREAD_LIMIT, Record, RunCache, Spread, interleave, slug
from seqlab.lab.suite import Suite
from seqlab.layers.mixer import mixer_spec
from seqlab.training.config import TrainConfig
from seqlab.training.optim import clip_gradients, make_optimizer

VOCAB_SIZE = 256
"""Token vocabulary of the systems models (speed and memory do not depend on a task)."""
BATCH_SIZE = 8
"""Batch of the throughput and activation-memory measurements."""
TIMING = 3
"""The version of the timing method stored in the settings: records of an older method are measured again
(3: the throughput step is ``seqlab train``'s, cross-entropy, clipping and fused AdamW; 2 took logsumexp as its
loss and torch's default AdamW)."""


def load_1min() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def activation_bytes(model, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for the backward pass of one forward: the activation memory that
    training holds at its peak, measured exactly (unlike process RSS) and the same way for every family."""
    total = 0
    seen: set[int] = set()

    def pack(t: torch.Tensor):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)
    return total


def throughput(
    models: dict[str, torch.nn.Module],
    vocab_size: int,
    seq_len: int,
    batch_size: int = 8,
    rounds: int = 5,
    time_cap_s: float = 30.0,
    max_rounds: int = 60,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Spread]:
    """The seconds of one training step of each model at one length: the step ``seqlab train`` takes with its
    defaults (:class:`seqlab.training.config.TrainConfig`): next-token cross-entropy on random tokens, backward,
    the gradient norm clipped to 1, seqlab's AdamW (torch's fused kernel where it takes the parameters).

    The models are timed round-robin by :func:`seqlab.lab.records.interleave`: a warm-up round, then at least
    ``rounds`` rounds, until every spread is small or ``time_cap_s`` has passed. Tokens/s is
    ``batch_size * seq_len`` over the median.
    """
    c = TrainConfig()
    opts = {name: make_optimizer(m, c.lr, c.weight_decay, (c.beta1, c.beta2)) for name, m in models.items()}
    x = torch.randint(0, vocab_size, (batch_size, seq_len))
    y = torch.randint(0, vocab_size, (batch_size * seq_len,))

    def unit(name: str) -> Callable[[], float]:
        model, opt = models[name], opts[name]

        def step() -> float:
            t0 = clock()
            F.cross_entropy(model(x).flatten(0, 1).float(), y).backward()
            clip_gradients(model, c.grad_clip, 0, lambda: "")
            opt.step()
            opt.zero_grad(set_to_none=True)
            return clock() - t0

        return step

    units = {name: unit(name) for name in models}
    return interleave(units, min_rounds=rounds, max_rounds=max_rounds, time_cap_s=time_cap_s, clock=clock)


def _num(record: Record | None, fmt: str) -> str:
    if record is None:
        return "–"
    if fmt != "bytes":
        return fmt.format(record.value)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if record.value >= size:
            return f"{record.value / size:.1f} {unit}"
    return f"{record.value:.0f} B"


def _pm(*records: Record | None) -> str:
    """'±4%', or '±31%*' where a timing's spread stayed large: noisy (the largest of ``records``)."""
    found = [r for r in records if r is not None and r.spread is not None and r.value > 0]
    if not found:
        return "–"
    worst = max(r.spread / r.value for r in found)
    return f"±{worst:.0%}" + ("*" if any(r.noisy for r in found) else "")


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


class Systems:
    """The systems measurements of one compare: ``records()`` measures what the cache lacks (everything, with
    ``remeasure``); afterwards ``verdicts`` holds each mixer's decode-scaling verdict and ``loads`` the
    1-minute load average [before, after] of each measurement (the highest where records differ)."""

    def __init__(
        self,
        suite: Suite,
        mixers: list[str],
        seed: int,
        cache: RunCache,
        base_settings: dict[str, Any],
        progress: bool,
        remeasure: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.suite, self.mixers, self.seed, self.cache = suite, mixers, seed, cache
        self.base_settings, self.progress, self.remeasure = base_settings, progress, remeasure
        self.clock = clock  # of the timings (a test's fake clock)
        self.longest = max(suite.throughput_lengths)  # activation memory is taken at the longest length
        self.verdicts: dict[str, str] = {}
        self.loads: dict[str, list[float | None]] = {}

    def records(self) -> list[Record]:
        from seqlab.lab.decode import scaling_verdict

        profiles = self.profiles()
        speed = self.throughput()
        out: list[Record] = []
        for mixer in self.mixers:
            rows = profiles[mixer]["decode"]
            self.verdicts[mixer] = scaling_verdict(row_spread(rows[0]), row_spread(rows[-1]))
            self._say_profile(mixer, profiles[mixer])
            out += self._records(mixer, profiles[mixer], speed[mixer])
        return out

    def _model(self, mixer: str):
        return build_lab_model(mixer, self.suite, {"vocab_size": VOCAB_SIZE}, self.seed)

    def _get(self, key: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        return None if self.remeasure else self.cache.get(key, settings)

    def _profile_settings(self, mixer: str) -> dict[str, Any]:
        return {
            **self.base_settings,
            "contexts": list(self.suite.decode_contexts),
            "lengths": list(self.suite.throughput_lengths),
            "layout": layout(mixer),
            "timing": TIMING,
            # decode latencies compare only when timed round-robin together: a profile is reused by a compare
            # of the same mixers, and the whole set is timed again when it changes (as throughput is)
            "decoded_with": sorted(self.mixers),
        }

    def profiles(self) -> dict[str, dict[str, Any]]:
        """{mixer: {params, d_model, decode, activation_bytes, seconds, load_1min}}, cached per mixer for this
        set of mixers; the mixers measured now decode round-robin together."""
        found = {m: self._get(slug(m, "systems"), self._profile_settings(m)) for m in self.mixers}
        todo = [m for m, data in found.items() if data is None]
        if todo:
            found.update(self._measure_profiles(todo))
        self._note_load("decode", found.values())
        return found

    def _measure_profiles(self, mixers: list[str]) -> dict[str, dict[str, Any]]:
        t0, before = time.perf_counter(), load_1min()
        built = {m: self._model(m) for m in mixers}
        contexts = self.suite.decode_contexts
        self._say(
            f"[systems] decode latency of {len(mixers)} mixer(s) at contexts {', '.join(map(str, contexts))}, "
            f"round-robin until the spread is under 10% (at most {self.suite.timing_cap_s:g} s)"
        )
        decode = decode_profiles(
            {m: b[0] for m, b in built.items()},
            VOCAB_SIZE,
            contexts,
            time_cap_s=self.suite.timing_cap_s,
            clock=self.clock,
        )
        after = load_1min()
        out = {}
        for m, (model, d_model, params) in built.items():
            model.train()
            memory = activation_bytes(model, torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, self.longest)))
            out[m] = {"settings": self._profile_settings(m), "params": params, "d_model": d_model}
            out[m].update(decode=decode[m], activation_bytes=memory, load_1min=[before, after])
            out[m]["seconds"] = time.perf_counter() - t0
            self.cache.put(slug(m, "systems"), out[m])
        return out

    def throughput(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{mixer: {length: {tokens_per_s, step_s_samples}}}, every mixer of this compare timed round-robin."""
        settings = self._throughput_settings()
        key = slug("throughput", *self.mixers)
        data = self._get(key, settings)
        if data is None:
            data = {"settings": settings, **self._measure_throughput()}
            self.cache.put(key, data)
        self._note_load("throughput", [data])
        return data["speed"]

    def _throughput_settings(self) -> dict[str, Any]:
        return {
            **self.base_settings,
            "lengths": list(self.suite.throughput_lengths),
            "mixers": self.mixers,
            "layouts": {m: layout(m) for m in self.mixers},
            "timing": TIMING,
        }

    def expected_s(self, per_cost: float | None = None) -> float:
        """Roughly the seconds the measurements still to take will last: each timing's cap, or the time of its
        minimum rounds where the calibrated training rate ``per_cost`` (seconds per unit of
        :func:`seqlab.lab.budget.run_cost`) says that is longer; plus building, reading contexts, plotting."""
        cap = self.suite.timing_cap_s
        decode = any(self._get(slug(m, "systems"), self._profile_settings(m)) is None for m in self.mixers)
        speed = self._get(slug("throughput", *self.mixers), self._throughput_settings()) is None
        step_cost = sum(mixer_spec(m).step_cost for m in self.mixers) * BATCH_SIZE * (per_cost or 0.0)
        rounds = 1 + 5  # the warm-up and the minimum of interleave()
        lengths = self.suite.throughput_lengths
        return 20 + decode * cap + speed * sum(max(cap, rounds * step_cost * t) for t in lengths)

    def _measure_throughput(self) -> dict[str, Any]:
        before = load_1min()
        models = {m: self._model(m)[0].train() for m in self.mixers}
        speed: dict[str, dict[str, Any]] = {m: {} for m in self.mixers}
        for length in self.suite.throughput_lengths:
            self._say(
                f"[systems] training throughput of {len(self.mixers)} mixer(s) at t={length}, round-robin "
                f"(at most {self.suite.timing_cap_s:g} s)"
            )
            cap = self.suite.timing_cap_s
            spreads = throughput(models, VOCAB_SIZE, length, BATCH_SIZE, time_cap_s=cap, clock=self.clock)
            for m, spread in spreads.items():
                tokens_per_s = BATCH_SIZE * length / spread.median
                speed[m][str(length)] = {"mixer": m, "length": length, "tokens_per_s": tokens_per_s}
                speed[m][str(length)]["step_s_samples"] = list(spread.samples)  # report.html's spread rows
        return {"speed": speed, "load_1min": [before, load_1min()]}

    def _note_load(self, what: str, records) -> None:
        pairs = [r.get("load_1min") or [None, None] for r in records]
        self.loads[what] = [max((p[i] for p in pairs if p[i] is not None), default=None) for i in (0, 1)]

    def _records(self, mixer: str, profile: dict[str, Any], speed: dict[str, Any]) -> list[Record]:
        common = {"mixer": mixer, "params": profile["params"], "seconds": profile["seconds"]}
        out = []
        for row in profile["decode"]:
            where = {"task": "decode", "setting": f"context={row['context']}", "x_value": row["context"]}
            out.append(
                Record(
                    **common,
                    **where,
                    metric="latency_ms",
                    value=row["latency_ms"],
                    spread=row_spread(row).iqr,
                    noisy=row_spread(row).noisy(),
                )
            )
            out.append(Record(**common, **where, metric="state_bytes", value=row["state_bytes"]))
        for t, v in speed.items():
            steps = Spread(tuple(v["step_s_samples"]))
            q1, _, q3 = steps.quartiles()
            tokens = BATCH_SIZE * int(t)
            out.append(
                Record(
                    **common,
                    task="throughput",
                    setting=f"t={t}",
                    metric="train_tokens_per_s",
                    value=v["tokens_per_s"],
                    train_tokens_per_s=v["tokens_per_s"],
                    x_value=int(t),
                    spread=tokens / q1 - tokens / q3,
                    noisy=steps.noisy(),
                )
            )
        memory = profile["activation_bytes"]
        setting = f"b={BATCH_SIZE}, t={self.longest}"
        return [
            *out,
            Record(**common, task="memory", setting=setting, metric="activation_bytes", value=memory),
        ]

    def summary(self, records: list[Record]) -> list[str]:
        """The speed and memory rows for a terminal (100 columns): one line per mixer, each timing's relative
        spread beside it ('*' where it stayed above the limit: noisy), and the load average."""
        from seqlab.lab.records import select

        c0, c1, t = self.suite.decode_contexts[0], self.suite.decode_contexts[-1], self.longest
        w = max(5, *map(len, self.mixers))
        lines = [
            f"{'mixer':<{w}} {'tokens/s':>9} {'±':<6} {'decode ms/token':>17} {'±':<6} "
            f"{f'{c1} / {c0}':<21} {'state':>8} {'act. mem':>8}",
            f"{'':<{w}} {f't={t}':>9} {'':<6} {f'@{c0}':>8} {f'@{c1}':>8} {'':<6} {'':<21} {f'@{c1}':>8}",
        ]
        for m in self.mixers:
            hit = {(r.task, r.setting, r.metric): r for r in select(records, mixer=m)}
            speed = hit.get(("throughput", f"t={t}", "train_tokens_per_s"))
            d0, d1 = (hit.get(("decode", f"context={c}", "latency_ms")) for c in (c0, c1))
            state = hit.get(("decode", f"context={c1}", "state_bytes"))
            memory = hit.get(("memory", f"b={BATCH_SIZE}, t={t}", "activation_bytes"))
            ratio = f"{d1.value / d0.value:.2f}× " if d0 and d1 and d0.value > 0 else ""
            lines.append(
                f"{m:<{w}} {_num(speed, '{:,.0f}'):>9} {_pm(speed):<6} {_num(d0, '{:.3f}'):>8} "
                f"{_num(d1, '{:.3f}'):>8} {_pm(d0, d1):<6} {ratio + self.verdicts.get(m, ''):<21} "
                f"{_num(state, 'bytes'):>8} {_num(memory, 'bytes'):>8}"
            )
        lines += [
            f"± is the interquartile range over the median of interleaved repeats; * noisy: it stayed above "
            f"{SPREAD_LIMIT:.0%}",
            f"until the time cap, so that number is unsettled. The {c1} / {c0} verdict compares the two",
            "contexts round by round (one round's timings share the machine's phase); unclear: too wide.",
            "load average (1 min), before -> after: "
            + "; ".join(f"{what} {_load(b)} -> {_load(a)}" for what, (b, a) in self.loads.items())
            + f" ({os.cpu_count()} cores)",
        ]
        return lines

    def _say_profile(self, mixer: str, profile: dict[str, Any]) -> None:
        d0, d1 = profile["decode"][0], profile["decode"][-1]
        self._say(
            f"[systems] {mixer:<17} decode {d0['latency_ms']:.3f} ms @ {d0['context']} -> "
            f"{d1['latency_ms']:.3f} ms @ {d1['context']} ({self.verdicts[mixer]}), "
            f"state {d0['state_bytes']:,} -> {d1['state_bytes']:,} B"
        )

    def _say(self, line: str) -> None:
        if self.progress:
            tqdm.write(line)
