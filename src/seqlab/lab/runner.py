"""``seqlab compare``: train every mixer on every task of a suite, measure, and write the report.

Each run is one mixer × one task setting, built on the shared backbone at the suite's parameter budget and
trained by the ordinary trainer. Its record lands in ``DIR/runs/<key>.json`` the moment it finishes, so an
interrupted compare resumes where it stopped: a run whose file exists with the same settings is reused.
The mixers are the registry's (``seqlab.layers.list_mixers``); a run's cost estimate, which orders parallel
jobs and times the ETA, is the mixer's registered ``step_cost``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqlab.lab.budget import build_lab_model, layout
from seqlab.lab.records import Record, RunCache, slug
from seqlab.lab.suite import Entry, Suite
from seqlab.lab.systems import Systems
from seqlab.layers.mixer import list_mixers, mixer_spec
from seqlab.training import TrainConfig, Trainer
from seqlab.training.allocator import keep_freed_memory

log = logging.getLogger("seqlab.lab")


def _cost(mixer: str, entry: Entry) -> float:
    """A run's rough cost: steps x tokens per sequence x the mixer's relative step cost."""
    length = entry.task_args.get("seq_len", 64) + entry.task_args.get("n_tokens", 0)
    return mixer_spec(mixer).step_cost * entry.steps * length


def _train_config(entry: Entry, seed: int) -> TrainConfig:
    """The trainer's settings for one lab run: the entry's steps and learning rate, evaluation at the end."""
    return TrainConfig(
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
    logging.getLogger("seqlab.train").setLevel(logging.WARNING)  # one progress line per run, not eval lines
    task = create_task(entry.task, **entry.task_args, seed=seed)
    model, d_model, params = build_lab_model(mixer, suite, task.model_overrides(), seed)
    trainer = Trainer(model, task, _train_config(entry, seed))
    t0 = time.perf_counter()
    summary = trainer.fit()
    seconds = time.perf_counter() - t0
    x = task.get_batch("train", 0)["x"]
    tokens = entry.steps * x.shape[0] * x.shape[1]
    return {
        "summary": summary,
        "d_model": d_model,
        "params": params,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
        "train_tokens_per_s": tokens / max(summary["elapsed_s"], 1e-9),
        "curve": [[r["step"], r["loss"]] for r in trainer.history if r["split"] == "train"],
    }


@dataclass(frozen=True)
class Job:
    """One training run of a compare: its cache key and the settings its cached record must match."""

    mixer: str
    entry: Entry
    key: str
    settings: dict[str, Any]

    @property
    def cost(self) -> float:
        return _cost(self.mixer, self.entry)

    def record(self, data: dict[str, Any]) -> Record:
        """The run's :class:`Record` from its cached data."""
        e = self.entry
        return Record(
            mixer=self.mixer,
            task=e.task,
            setting=e.setting,
            metric=e.metric,
            value=data["summary"].get(e.metric, float("nan")),
            params=data["params"],
            seconds=data["seconds"],
            train_tokens_per_s=data["train_tokens_per_s"],
            x_value=e.x_value,
            higher_is_better=e.higher_is_better,
            curve=data.get("curve", []),
        )


class _Progress:
    """Progress lines of the training runs: the plan first, then one line per run with an ETA taken from the
    rate at which the runs trained by this process went."""

    def __init__(self, jobs: list[Job], todo: list[int], enabled: bool):
        self.jobs, self.todo, self.enabled = jobs, todo, enabled
        self.started = time.perf_counter()
        self.n_done = 0
        self.finished: set[int] = set()

    def plan(self, parallel: int) -> None:
        """Say what is about to train: the first runs to finish may take a minute or more."""
        if not (self.enabled and self.todo):
            return
        line = f"[compare] training {len(self.todo)} run(s)"
        if parallel > 1 and len(self.todo) > 1:
            longest = self.jobs[max(self.todo, key=lambda i: self.jobs[i].cost)]
            line += f", {min(parallel, len(self.todo))} at a time, longest first"
            line += f" ({longest.mixer} on {longest.entry.task})"
        print(line, flush=True)

    def _eta(self) -> str:
        done_cost = sum(self.jobs[j].cost for j in self.finished)
        left = sum(self.jobs[j].cost for j in self.todo if j not in self.finished)
        return f", ETA {(time.perf_counter() - self.started) * left / max(done_cost, 1e-9) / 60:.1f} min"

    def report(self, i: int, data: dict[str, Any], status: str) -> None:
        self.n_done += 1
        if status == "done":
            self.finished.add(i)
        if not self.enabled:
            return
        job = self.jobs[i]
        e = job.entry
        value = data["summary"].get(e.metric, float("nan"))
        eta = self._eta() if status == "done" else ""
        print(
            f"[{self.n_done}/{len(self.jobs)}] {job.mixer:<17} {e.task} {e.setting}: {e.metric} "
            f"{value:.4f} ({status}, {data['seconds']:.0f} s{eta})",
            flush=True,
        )


class Compare:
    """One compare: the suite's entries × the mixers (default: every registered mixer), in ``out``."""

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
        if jobs < 1:
            raise ValueError(f"jobs must be a positive number of worker processes, got {jobs}")
        self.out = Path(out)
        self.suite, self.seed, self.progress, self.jobs = suite, seed, progress, jobs
        known = list_mixers()
        self.mixers = list(mixers or known)
        unknown = sorted(set(self.mixers) - set(known))
        if unknown:
            raise ValueError(f"unknown mixer(s) {unknown}; known: {', '.join(known)}")
        known_tasks = sorted({e.task for e in suite.entries})
        bad = sorted(set(tasks or ()) - set(known_tasks))
        if bad:
            raise ValueError(f"task(s) {bad} are not in the {suite.name} suite; it has {known_tasks}")
        self.entries = [e for e in suite.entries if not tasks or e.task in tasks]
        self.cache = RunCache(self.out)

    def _base_settings(self) -> dict[str, Any]:
        """What every cached record of this compare depends on; each kind of record adds its own fields."""
        s = self.suite
        return {"suite": s.name, "budget": s.budget, "n_layers": s.n_layers, "seed": self.seed}

    def run_systems(self) -> list[Record]:
        """Decode latency and state size against context, training throughput and activation memory."""
        return Systems(
            self.suite, self.mixers, self.seed, self.cache, self._base_settings(), self.progress
        ).records()

    # ---- training runs, cached on disk ----------------------------------------------------------------------

    def run_training(self) -> list[Record]:
        train_log = logging.getLogger("seqlab.train")
        level = train_log.level
        train_log.setLevel(logging.WARNING)  # one progress line per run instead of the trainer's eval lines
        try:
            return self._run_training()
        finally:
            train_log.setLevel(level)

    def _jobs(self) -> list[Job]:
        """Every (mixer, entry) run; jobs are referred to by their index (an Entry holds a dict)."""
        base = self._base_settings()
        return [
            Job(
                m,
                e,
                slug(m, e.task, e.setting),
                {**base, "entry": dataclasses.asdict(e), "layout": layout(m)},
            )
            for e in self.entries
            for m in self.mixers
        ]

    def _run_training(self) -> list[Record]:
        jobs = self._jobs()
        data = [self.cache.get(job.key, job.settings) for job in jobs]
        todo = [i for i, d in enumerate(data) if d is None]
        progress = _Progress(jobs, todo, self.progress)
        for i, d in enumerate(data):
            if d is not None:
                progress.report(i, d, "reused")
        progress.plan(self.jobs)

        def finish(i: int, result: dict[str, Any]) -> None:
            data[i] = {"settings": jobs[i].settings, **result}
            self.cache.put(jobs[i].key, data[i])
            progress.report(i, data[i], "done")

        self._train(jobs, todo, finish)
        log.info("training runs took %.1f min", (time.perf_counter() - progress.started) / 60)
        return [job.record(d) for job, d in zip(jobs, data, strict=True)]

    def _train(self, jobs: list[Job], todo: list[int], finish: Callable[[int, dict[str, Any]], None]) -> None:
        """Train the runs ``todo`` (indices into ``jobs``), calling ``finish(i, result)`` as each ends."""
        if self.jobs == 1 or len(todo) <= 1:
            for i in todo:
                finish(i, train_run(self.suite, jobs[i].mixer, jobs[i].entry, self.seed))
            return
        # worker processes, one torch thread each: small models use a core better than two threads do
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = mp.get_context("spawn")  # no forked torch thread pools
        order = sorted(todo, key=lambda i: -jobs[i].cost)  # longest first: no long run starts last
        # workers are training processes of their own: let them keep freed memory (seqlab.training.allocator)
        with ProcessPoolExecutor(
            max_workers=self.jobs, mp_context=ctx, initializer=keep_freed_memory
        ) as pool:
            futures = {
                pool.submit(train_run, self.suite, jobs[i].mixer, jobs[i].entry, self.seed, 1): i
                for i in order
            }
            for future in as_completed(futures):
                finish(futures[future], future.result())
