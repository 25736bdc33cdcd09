"""``seqlab compare``: train every mixer on every task of a suite, measure, and write the report.

Each run is one mixer × one task setting, built on the shared backbone at the suite's parameter budget and
trained by the ordinary trainer. Its record lands in ``DIR/runs/<key>.json`` the moment it finishes, so an
interrupted compare resumes where it stopped: a run whose file exists with the same settings is reused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.budget import LAYOUT, lm_fields, match_width
from seqlab.lab.decode import decode_profile
from seqlab.lab.suite import MIXER_ORDER, Entry, Suite
from seqlab.models import build, make_config
from seqlab.training import TrainConfig, Trainer
from seqlab.training.allocator import keep_freed_memory
from seqlab.training.checkpoint import write_text_atomic

log = logging.getLogger("seqlab.lab")


_STEP_COST = {"mamba": 5.6, "gru": 1.9, "linear-attention": 1.8, "s4d": 1.7, "attention": 1.5, "rnn": 1.3}
"""Rough cost of a training step relative to an LSTM's at the lab's sizes on CPU (medians over the quick
suite's tasks, 60k parameters, one thread per run: Mamba's chunked scan is the slow one); only the ETA and
the order in which parallel jobs start depend on it."""


def _cost(mixer: str, entry: Entry) -> float:
    """A run's rough cost: steps x tokens per sequence x the mixer's relative step cost."""
    length = entry.task_args.get("seq_len", 64) + entry.task_args.get("n_tokens", 0)
    return _STEP_COST.get(mixer, 1.0) * entry.steps * length


def _slug(*parts: str) -> str:
    return "__".join("".join(ch if ch.isalnum() or ch in "-." else "-" for ch in p) for p in parts)


def _model(mixer: str, suite: Suite, overrides: dict[str, Any], seed: int):
    base = {"n_layers": suite.n_layers, "n_heads": 4, **overrides}
    d_model, params = match_width(mixer, suite.budget, base)
    torch.manual_seed(seed)
    model = build("lm", make_config("lm", lm_fields(mixer, d_model, base)))
    return model, d_model, params


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


def train_run(
    suite: Suite, mixer: str, entry: Entry, seed: int, threads: int | None = None
) -> dict[str, Any]:
    """Train one mixer on one suite entry with the ordinary trainer; the run's record (without settings).

    A module-level function so that ``Compare`` can hand it to worker processes (``jobs > 1``); ``threads``
    sets torch's intra-op threads in such a worker.
    """
    from seqlab.tasks import create_task

    if threads:
        torch.set_num_threads(threads)
    train_log = logging.getLogger("seqlab.train")
    train_log.setLevel(logging.WARNING)  # one progress line per run instead of the trainer's eval lines
    task = create_task(entry.task, **entry.task_args, seed=seed)
    model, d_model, params = _model(mixer, suite, task.model_overrides(), seed)
    cfg = TrainConfig(
        steps=entry.steps,
        lr=entry.lr,
        warmup_steps=min(100, entry.steps // 10),
        eval_every=0,
        eval_batches=10,
        log_every=max(1, entry.steps // 50),
        save_every=0,
        progress=False,
        seed=seed,
        device="cpu",
    )
    trainer = Trainer(model, task, cfg)
    t0 = time.perf_counter()
    summary = trainer.fit()
    seconds = time.perf_counter() - t0
    batch = task.get_batch("train", 0)
    tokens = entry.steps * batch["x"].shape[0] * batch["x"].shape[1]
    curve = [[r["step"], r["loss"]] for r in trainer.history if r["split"] == "train"]
    return {
        "summary": summary,
        "d_model": d_model,
        "params": params,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
        "train_tokens_per_s": tokens / max(summary["elapsed_s"], 1e-9),
        "curve": curve,
    }


class Compare:
    def __init__(
        self,
        out: str | Path,
        suite: Suite,
        mixers: list[str] | None = None,
        tasks: list[str] | None = None,
        seed: int = 0,
        progress: bool = True,
        jobs: int = 1,
    ):
        from seqlab.models.lm import MIXERS

        if jobs < 1:
            raise ValueError(f"jobs must be a positive number of worker processes, got {jobs}")
        self.out = Path(out)
        self.suite, self.seed, self.progress, self.jobs = suite, seed, progress, jobs
        self.mixers = list(mixers or [m for m in MIXER_ORDER if m in MIXERS])
        unknown = sorted(set(self.mixers) - set(MIXERS))
        if unknown:
            raise ValueError(f"unknown mixer(s) {unknown}; known: {', '.join(sorted(MIXERS))}")
        known_tasks = sorted({e.task for e in suite.entries})
        if tasks:
            bad = sorted(set(tasks) - set(known_tasks))
            if bad:
                raise ValueError(f"task(s) {bad} are not in the {suite.name} suite; it has {known_tasks}")
        self.entries = [e for e in suite.entries if not tasks or e.task in tasks]
        (self.out / "runs").mkdir(parents=True, exist_ok=True)

    # ---- one record per run, cached on disk ---------------------------------------------------------------

    def _base_settings(self) -> dict[str, Any]:
        """What every cached record of this compare depends on; each kind of record adds its own fields."""
        return {
            "suite": self.suite.name,
            "budget": self.suite.budget,
            "n_layers": self.suite.n_layers,
            "seed": self.seed,
        }

    def _cached(self, key: str, settings: dict[str, Any]):
        settings = json.loads(json.dumps(settings))  # compare as stored: tuples become lists
        f = self.out / "runs" / f"{key}.json"
        if f.is_file():
            data = json.loads(f.read_text(encoding="utf-8"))
            if data.get("settings") == settings:
                return data
        return None

    def _store(self, key: str, data: dict[str, Any]) -> None:
        write_text_atomic(self.out / "runs" / f"{key}.json", json.dumps(data, indent=1))

    def run_training(self) -> list[dict[str, Any]]:
        train_log = logging.getLogger("seqlab.train")
        level = train_log.level
        train_log.setLevel(logging.WARNING)  # one progress line per run instead of the trainer's eval lines
        try:
            return self._run_training()
        finally:
            train_log.setLevel(level)

    def _run_training(self) -> list[dict[str, Any]]:
        jobs = [(m, e) for e in self.entries for m in self.mixers]
        settings = [
            {**self._base_settings(), "entry": dataclasses.asdict(e), "layout": LAYOUT.get(m, {})}
            for m, e in jobs
        ]  # jobs are referred to by their index (an Entry holds a dict, so it cannot be a key)
        key = [_slug(m, e.task, e.setting) for m, e in jobs]
        data = [self._cached(key[i], settings[i]) for i in range(len(jobs))]
        todo = [i for i in range(len(jobs)) if data[i] is None]
        started, n_done = time.perf_counter(), 0
        finished: set[int] = set()

        def report(i: int, status: str) -> None:
            nonlocal n_done
            n_done += 1
            if not self.progress:
                return
            mixer, entry = jobs[i]
            value = data[i]["summary"].get(entry.metric, float("nan"))
            eta = ""
            if finished and status == "done":  # remaining cost at the rate the finished runs went
                done_cost = sum(_cost(*jobs[j]) for j in finished)
                left = sum(_cost(*jobs[j]) for j in todo if j not in finished)
                eta = f", ETA {(time.perf_counter() - started) * left / max(done_cost, 1e-9) / 60:.1f} min"
            print(
                f"[{n_done}/{len(jobs)}] {mixer:<17} {entry.task} {entry.setting}: {entry.metric} "
                f"{value:.4f} ({status}, {data[i]['seconds']:.0f} s{eta})",
                flush=True,
            )

        for i in range(len(jobs)):
            if data[i] is not None:
                report(i, "reused")
        if self.progress and todo:  # the first runs to finish may take a minute or more: say what is coming
            plan = f"[compare] training {len(todo)} run(s)"
            if self.jobs > 1 and len(todo) > 1:
                mixer, entry = jobs[max(todo, key=lambda i: _cost(*jobs[i]))]
                plan += f", {min(self.jobs, len(todo))} at a time, longest first ({mixer} on {entry.task})"
            print(plan, flush=True)

        def finish(i: int, result: dict[str, Any]) -> None:
            finished.add(i)
            data[i] = {"settings": settings[i], **result}
            self._store(key[i], data[i])
            report(i, "done")

        if self.jobs == 1 or len(todo) <= 1:
            for i in todo:
                finish(i, train_run(self.suite, *jobs[i], self.seed))
        else:  # worker processes, one torch thread each: small models use a core better than two threads do
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = mp.get_context("spawn")  # no forked torch thread pools
            # longest first, so that no long run starts last while the other workers sit idle
            todo.sort(key=lambda i: -_cost(*jobs[i]))
            # workers are training processes of their own: let them keep freed memory (seqlab.training.allocator)
            with ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=ctx, initializer=keep_freed_memory
            ) as pool:
                futures = {pool.submit(train_run, self.suite, *jobs[i], self.seed, 1): i for i in todo}
                for future in as_completed(futures):
                    finish(futures[future], future.result())
        log.info("training runs took %.1f min", (time.perf_counter() - started) / 60)
        records = []
        for (mixer, entry), d in zip(jobs, data, strict=True):
            records.append(
                {
                    "mixer": mixer,
                    "task": entry.task,
                    "setting": entry.setting,
                    "metric": entry.metric,
                    "value": d["summary"].get(entry.metric, float("nan")),
                    "params": d["params"],
                    "train_tokens_per_s": d["train_tokens_per_s"],
                    "seconds": d["seconds"],
                    "x_value": entry.x_value,
                    "higher_is_better": entry.higher_is_better,
                    "curve": d.get("curve", []),
                }
            )
        return records

    # ---- task-independent measurements ----------------------------------------------------------------------

    def run_systems(self) -> list[dict[str, Any]]:
        """Decode latency and state size against context, training throughput and activation memory."""
        records = []
        vocab = 256
        speed = self._throughput(vocab)
        for mixer in self.mixers:
            settings = {
                **self._base_settings(),
                "contexts": list(self.suite.decode_contexts),
                "lengths": list(self.suite.throughput_lengths),  # activation memory is taken at the longest
                "layout": LAYOUT.get(mixer, {}),
            }
            key = _slug(mixer, "systems")
            data = self._cached(key, settings)
            if data is None:
                t0 = time.perf_counter()
                model, d_model, params = _model(mixer, self.suite, {"vocab_size": vocab}, self.seed)
                decode = decode_profile(model, vocab, self.suite.decode_contexts)
                model.train()
                x = torch.randint(0, vocab, (8, max(self.suite.throughput_lengths)))
                memory = activation_bytes(model, x)
                data = {
                    "settings": settings,
                    "params": params,
                    "d_model": d_model,
                    "decode": decode,
                    "activation_bytes": memory,
                    "seconds": time.perf_counter() - t0,
                }
                self._store(key, data)
            if self.progress:
                d0, d1 = data["decode"][0], data["decode"][-1]
                print(
                    f"[systems] {mixer:<17} decode {d0['latency_ms']:.3f} ms @ {d0['context']} -> "
                    f"{d1['latency_ms']:.3f} ms @ {d1['context']}, state {d0['state_bytes']:,} -> "
                    f"{d1['state_bytes']:,} B",
                    flush=True,
                )
            for row in data["decode"]:
                for metric in ("latency_ms", "state_bytes"):
                    records.append(
                        {
                            "mixer": mixer,
                            "task": "decode",
                            "setting": f"context={row['context']}",
                            "metric": metric,
                            "value": row[metric],
                            "params": data["params"],
                            "train_tokens_per_s": None,
                            "seconds": data["seconds"],
                            "x_value": row["context"],
                        }
                    )
            for t, v in speed[mixer].items():
                records.append(
                    {
                        "mixer": mixer,
                        "task": "throughput",
                        "setting": f"t={t}",
                        "metric": "train_tokens_per_s",
                        "value": v,
                        "params": data["params"],
                        "train_tokens_per_s": v,
                        "seconds": data["seconds"],
                        "x_value": int(t),
                    }
                )
            records.append(
                {
                    "mixer": mixer,
                    "task": "memory",
                    "setting": f"b=8, t={max(self.suite.throughput_lengths)}",
                    "metric": "activation_bytes",
                    "value": data["activation_bytes"],
                    "params": data["params"],
                    "train_tokens_per_s": None,
                    "seconds": data["seconds"],
                    "x_value": None,
                }
            )
        return records

    def _throughput(self, vocab: int) -> dict[str, dict[str, float]]:
        """{mixer: {length: tokens/s}}, every mixer of this compare timed together (see :func:`throughput`);
        cached as one record, remeasured whenever the set of mixers changes."""
        settings = {
            **self._base_settings(),
            "lengths": list(self.suite.throughput_lengths),
            "mixers": self.mixers,
            "layouts": {m: LAYOUT.get(m, {}) for m in self.mixers},
        }
        key = _slug("throughput", *self.mixers)
        data = self._cached(key, settings)
        if data is None:
            if self.progress:
                print(f"[systems] training throughput of {len(self.mixers)} mixers, alternating", flush=True)
            models = {
                m: _model(m, self.suite, {"vocab_size": vocab}, self.seed)[0].train() for m in self.mixers
            }
            speed = {m: {} for m in self.mixers}
            for length in self.suite.throughput_lengths:
                for m, v in throughput(models, vocab, length).items():
                    speed[m][str(length)] = v
            data = {"settings": settings, "speed": speed}
            self._store(key, data)
        return data["speed"]
