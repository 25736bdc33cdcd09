"""The lab's task-independent measurements: decode latency and state size against context, training
throughput and activation memory, for every mixer's model at the suite's budget.

Each mixer's decode and memory profile is one cached record (``RunCache``); the throughput of all mixers is
measured together, alternating, and cached as one record that is remeasured whenever the set of mixers
changes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from seqlab.lab.budget import build_lab_model, layout
from seqlab.lab.decode import decode_profile
from seqlab.lab.records import Record, RunCache, slug
from seqlab.lab.suite import Suite

VOCAB_SIZE = 256
"""Token vocabulary of the systems models (speed and memory do not depend on a task)."""
BATCH_SIZE = 8
"""Batch of the throughput and activation-memory measurements."""


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
    models: dict[str, torch.nn.Module], vocab_size: int, seq_len: int, batch_size: int = 8, rounds: int = 7
) -> dict[str, float]:
    """Training tokens/s (forward + backward + AdamW step) of each model at one sequence length.

    One warm-up step each, then ``rounds`` rounds of one timed step per model, the order reversed every other
    round, so that a slow phase of a shared machine hits every family alike; the median step per model.
    """
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    x = torch.randint(0, vocab_size, (batch_size, seq_len))

    def step(name: str) -> float:
        t0 = time.perf_counter()
        models[name](x).float().logsumexp(-1).mean().backward()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    names = list(models)
    for name in names:
        step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(step(name))
    return {name: batch_size * seq_len / statistics.median(t) for name, t in times.items()}


class Systems:
    """The systems measurements of one compare: ``records()`` measures what the cache lacks."""

    def __init__(
        self,
        suite: Suite,
        mixers: list[str],
        seed: int,
        cache: RunCache,
        base_settings: dict[str, Any],
        progress: bool,
    ):
        self.suite, self.mixers, self.seed, self.cache = suite, mixers, seed, cache
        self.base_settings, self.progress = base_settings, progress
        self.longest = max(suite.throughput_lengths)  # activation memory is taken at the longest length

    def records(self) -> list[Record]:
        speed = self.throughput()
        out: list[Record] = []
        for mixer in self.mixers:
            profile = self.profile(mixer)
            self._say_profile(mixer, profile)
            out += self._records(mixer, profile, speed[mixer])
        return out

    def _model(self, mixer: str):
        return build_lab_model(mixer, self.suite, {"vocab_size": VOCAB_SIZE}, self.seed)

    def profile(self, mixer: str) -> dict[str, Any]:
        """{params, d_model, decode, activation_bytes, seconds} of one mixer's model, cached."""
        settings = {
            **self.base_settings,
            "contexts": list(self.suite.decode_contexts),
            "lengths": list(self.suite.throughput_lengths),
            "layout": layout(mixer),
        }
        key = slug(mixer, "systems")
        data = self.cache.get(key, settings)
        if data is None:
            t0 = time.perf_counter()
            model, d_model, params = self._model(mixer)
            decode = decode_profile(model, VOCAB_SIZE, self.suite.decode_contexts)
            model.train()
            memory = activation_bytes(model, torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, self.longest)))
            data = {"settings": settings, "params": params, "d_model": d_model, "decode": decode}
            data.update(activation_bytes=memory, seconds=time.perf_counter() - t0)
            self.cache.put(key, data)
        return data

    def throughput(self) -> dict[str, dict[str, float]]:
        """{mixer: {length: tokens/s}}, every mixer of this compare timed together (see :func:`throughput`)."""
        settings = {
            **self.base_settings,
            "lengths": list(self.suite.throughput_lengths),
            "mixers": self.mixers,
            "layouts": {m: layout(m) for m in self.mixers},
        }
        key = slug("throughput", *self.mixers)
        data = self.cache.get(key, settings)
        if data is None:
            self._say(f"[systems] training throughput of {len(self.mixers)} mixers, alternating")
            models = {m: self._model(m)[0].train() for m in self.mixers}
            speed: dict[str, dict[str, float]] = {m: {} for m in self.mixers}
            for length in self.suite.throughput_lengths:
                for m, v in throughput(models, VOCAB_SIZE, length, BATCH_SIZE).items():
                    speed[m][str(length)] = v
            data = {"settings": settings, "speed": speed}
            self.cache.put(key, data)
        return data["speed"]

    def _records(self, mixer: str, profile: dict[str, Any], speed: dict[str, float]) -> list[Record]:
        common = {"mixer": mixer, "params": profile["params"], "seconds": profile["seconds"]}
        out = [
            Record(
                **common,
                task="decode",
                setting=f"context={row['context']}",
                metric=metric,
                value=row[metric],
                x_value=row["context"],
            )
            for row in profile["decode"]
            for metric in ("latency_ms", "state_bytes")
        ]
        out += [
            Record(
                **common,
                task="throughput",
                setting=f"t={t}",
                metric="train_tokens_per_s",
                value=v,
                train_tokens_per_s=v,
                x_value=int(t),
            )
            for t, v in speed.items()
        ]
        memory = profile["activation_bytes"]
        setting = f"b={BATCH_SIZE}, t={self.longest}"
        return [
            *out,
            Record(**common, task="memory", setting=setting, metric="activation_bytes", value=memory),
        ]

    def _say_profile(self, mixer: str, profile: dict[str, Any]) -> None:
        d0, d1 = profile["decode"][0], profile["decode"][-1]
        self._say(
            f"[systems] {mixer:<17} decode {d0['latency_ms']:.3f} ms @ {d0['context']} -> "
            f"{d1['latency_ms']:.3f} ms @ {d1['context']}, state {d0['state_bytes']:,} -> "
            f"{d1['state_bytes']:,} B"
        )

    def _say(self, line: str) -> None:
        if self.progress:
            print(line, flush=True)
