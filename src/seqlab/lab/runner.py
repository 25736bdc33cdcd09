"""``seqlab compare``: train every mixer on every task of a suite, measure, and write the report.

Each run is one mixer × one task setting, built on the shared backbone at the suite's parameter budget and
trained by the ordinary trainer. Its record lands in ``DIR/runs/<key>.json`` the moment it finishes, so an
interrupted compare resumes where it stopped: a run whose file exists with the same settings is reused.
The mixers are the registry's (``seqlab.layers.list_mixers``). Before training, a few steps of one run are
timed here (:func:`seqlab.lab.budget.calibrate`); each run's cost scaled by that rate gives the plan's first
line its expected time, and the finished runs correct the rate as they come in.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from seqlab.lab.budget import Calibration, build_lab_model, calibrate, layout, makespan, run_cost
from seqlab.lab.records import Record, RunCache, collect_logs, slug
from seqlab.lab.suite import Entry, Suite
from seqlab.lab.systems import Systems
from seqlab.lab.workers import (
    quiet_train_log,
    start_worker,
    stop_after_interrupt,
    stop_pool_on_interrupt,
    training,
    worker_run,
)
from seqlab.layers.mixer import list_mixers, mixer_spec
from seqlab.training import TrainConfig, Trainer
from seqlab.training.allocator import keep_freed_memory

log = logging.getLogger("seqlab.lab")


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
    sets torch's intra-op threads in such a worker, whose log lines come back under "log".
    """
    from seqlab.tasks import create_task

    if threads:
        torch.set_num_threads(threads)
    with worker_run(), quiet_train_log(), collect_logs(threads is not None) as logs:
        task = create_task(entry.task, **entry.task_args, seed=seed)
        model, d_model, params = build_lab_model(mixer, suite, task.model_overrides(), seed)
        trainer = Trainer(model, task, _train_config(entry, seed))
        t0 = time.perf_counter()
        with training():
            summary = trainer.fit()
        seconds = time.perf_counter() - t0
    if summary.get("interrupted"):  # a stop signal: the trainer stopped at a step, so does the compare
        stop_after_interrupt(summary)
    x = task.get_batch("train", 0)["x"]
    tokens = summary["step"] * x.shape[0] * x.shape[1]  # the steps taken (a time budget can stop a run early)
    return {
        "summary": summary,
        "d_model": d_model,
        "params": params,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
        "train_tokens_per_s": tokens / max(summary["elapsed_s"], 1e-9),
        "curve": [[r["step"], r["loss"]] for r in trainer.history if r["split"] == "train"],
        **({"log": logs.lines} if logs is not None else {}),
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
        return run_cost(self.mixer, self.entry)

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


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class _Progress:
    """The runs' progress: the plan, one line per run (written above the bar, as are log lines), a bar with the
    time left on a terminal. The time left is the calibrated plan corrected by the finished runs: the ratio
    of their measured training time to the calibrated one scales every run's estimate."""

    def __init__(
        self, jobs: list[Job], todo: list[int], enabled: bool, parallel: int, cal: Calibration | None
    ):
        self.jobs, self.todo, self.enabled, self.cal = jobs, todo, enabled, cal
        self.parallel = max(1, parallel)
        self.started = time.perf_counter()
        self.n_done = 0
        self.measured = self.expected = 0.0  # training seconds of the finished runs, and their estimate
        self.unfinished = set(todo)
        self.bar = None
        self._stop = threading.Event()

    def _run_s(self, i: int) -> float:
        c = self.cal
        scale = self.measured / self.expected if self.expected else 1.0
        return c.setup_s + scale * self.jobs[i].cost * c.per_cost if c else 0.0

    def training_s(self) -> float:
        """The expected wall time of all the runs to train."""
        return makespan([self._run_s(i) for i in self.todo], self.parallel)

    def left_s(self) -> float:
        if not self.unfinished:
            return 0.0
        # past the plan, the runs in flight are taken as half done
        rest = makespan([self._run_s(i) for i in self.unfinished], self.parallel) / 2
        return max(self.training_s() - (time.perf_counter() - self.started), rest)

    def write(self, line: str) -> None:
        if self.enabled:
            tqdm.write(line)

    def __enter__(self) -> _Progress:
        self.started = time.perf_counter()
        if self.enabled and self.todo:
            fmt = "{desc} {bar} {n_fmt}/{total_fmt} runs [{elapsed}{postfix}]"
            self.bar = tqdm(total=len(self.todo), desc="[compare] training", bar_format=fmt, disable=None)
            if not self.bar.disable:  # a terminal: keep the time left moving between runs
                threading.Thread(target=self._tick, daemon=True).start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            if self.bar is not None and self.cal is not None:
                self.bar.set_postfix_str(f"about {_duration(self.left_s())} left")

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.bar is not None:
            self.bar.close()

    def report(self, i: int, data: dict[str, Any], status: str) -> None:
        self.n_done += 1
        job, e = self.jobs[i], self.jobs[i].entry
        if status == "done":
            self.unfinished.discard(i)
            if self.cal is not None:
                self.measured += data["seconds"]
                self.expected += job.cost * self.cal.per_cost
            if self.bar is not None:
                self.bar.update(1)
        left = f", about {_duration(self.left_s())} left" if status == "done" and self.cal else ""
        value = data["summary"].get(e.metric, float("nan"))
        self.write(
            f"[{self.n_done}/{len(self.jobs)}] {job.mixer:<17} {e.task} {e.setting}: {e.metric} "
            f"{value:.4f} ({status}, {data['seconds']:.0f} s{left})"
        )


class Compare:
    """One compare: the suite's entries × the mixers (default: every registered mixer), in ``out``.

    ``remeasure=("systems",)`` measures the speed and memory rows again and trains nothing: the trained runs
    stored in ``out`` are kept as they are (runs not trained yet stay out of the table)."""

    def __init__(
        self,
        out: str | Path,
        suite: Suite,
        mixers: list[str] | None = None,
        tasks: list[str] | None = None,
        seed: int = 0,
        progress: bool = True,
        jobs: int = 1,
        remeasure: tuple[str, ...] = (),
    ):
        if jobs < 1:
            raise ValueError(f"jobs must be a positive number of worker processes, got {jobs}")
        if set(remeasure) - {"systems"}:
            raise ValueError(f"remeasure takes 'systems' (the speed and memory rows), got {list(remeasure)}")
        self.out = Path(out)
        self.suite, self.seed, self.progress, self.jobs = suite, seed, progress, jobs
        self.remeasure = tuple(remeasure)
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
        if "systems" in self.remeasure and not (self.out / "runs").is_dir():
            raise ValueError(self._nothing_to_remeasure("no earlier compare"))
        self.cache = RunCache(self.out)
        if "systems" in self.remeasure and not any(self.cache.get(j.key, j.settings) for j in self._jobs()):
            raise ValueError(self._nothing_to_remeasure("no run this compare trained"))
        self.systems = Systems(
            suite, self.mixers, seed, self.cache, self._base_settings(), progress, "systems" in self.remeasure
        )

    def _nothing_to_remeasure(self, what: str) -> str:
        return (
            f"--remeasure systems measures the speed and memory rows again beside the runs an earlier compare "
            f"trained in --out, and {self.out} holds {what} (the {self.suite.name} suite, seed {self.seed}): "
            "run the compare there without --remeasure first"
        )

    def _base_settings(self) -> dict[str, Any]:
        """What every cached record of this compare depends on; each kind of record adds its own fields."""
        s = self.suite
        return {"suite": s.name, "budget": s.budget, "n_layers": s.n_layers, "seed": self.seed}

    def run_systems(self) -> list[Record]:
        """Decode latency and state size against context, training throughput and activation memory."""
        return self.systems.records()

    # ---- training runs, cached on disk ----------------------------------------------------------------------

    def run_training(self) -> list[Record]:
        with (
            quiet_train_log(),
            logging_redirect_tqdm(),
        ):  # this process's log lines pass above the progress bar
            return self._run_training()

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

    def _calibrate(self, jobs: list[Job], todo: list[int]) -> Calibration | None:
        """A few steps of the cheapest mixer on the first entry to train, with the runs' threads."""
        if not (self.progress and todo):
            return None
        entry = jobs[todo[0]].entry
        mixer = min(
            (jobs[i].mixer for i in todo if jobs[i].entry == entry), key=lambda m: mixer_spec(m).step_cost
        )
        parallel = self.jobs > 1 and len(todo) > 1
        config = _train_config(entry, self.seed)
        return calibrate(self.suite, mixer, entry, config, threads=1 if parallel else None)

    def _plan(self, jobs: list[Job], reused: int, todo: list[int], progress: _Progress) -> list[str]:
        """The first lines: what runs, how many are reused, the time expected here and where it comes from."""
        train_s = progress.training_s() if progress.cal else 0.0
        systems_s = self.systems.expected_s(progress.cal.per_cost if progress.cal else None)
        head = f"[compare] {self.suite.name}: {len(jobs)} runs ({_count(len(self.mixers), 'mixer')} x {_count(len(self.entries), 'task')})"
        if "systems" in self.remeasure:
            head += f", {reused} trained kept, none trained; speed and memory again"
        else:
            parallel = min(self.jobs, len(todo))
            head += f", {reused} reused, {len(todo)} to train" + (
                f" ({parallel} at once)" if parallel > 1 else ""
            )
        lines = [f"{head}; about {_duration(train_s + systems_s)} here"]
        if progress.cal:
            c = progress.cal
            lines.append(
                f"[compare] training about {_duration(train_s)} ({c.mixer} on {c.entry.task} {c.entry.setting} "
                f"took {1e3 * c.step_s:.0f} ms a step here), then speed, memory and plots"
                f" about {_duration(systems_s)}"
            )
        if "systems" in self.remeasure and todo:
            lines.append(
                f"[compare] {len(todo)} runs not trained yet stay out (run without --remeasure to train)"
            )
        lines.append(f"[compare] mixers: {', '.join(self.mixers)}")
        lines.append("[compare] tasks: " + ", ".join(f"{e.task} {e.setting}" for e in self.entries))
        return lines

    def _run_training(self) -> list[Record]:
        jobs = self._jobs()
        data = [self.cache.get(job.key, job.settings) for job in jobs]
        todo = [i for i, d in enumerate(data) if d is None]
        train = "systems" not in self.remeasure
        cal = self._calibrate(jobs, todo) if train else None
        progress = _Progress(jobs, todo if train else [], self.progress, min(self.jobs, len(todo)), cal)
        for line in self._plan(jobs, len(jobs) - len(todo), todo, progress):
            progress.write(line)
        for i, d in enumerate(data):
            if d is not None:
                progress.report(i, d, "reused")

        def finish(i: int, result: dict[str, Any]) -> None:
            for line in result.pop("log", []):
                progress.write(f"[{jobs[i].mixer} on {jobs[i].entry.task}] {line}")
            data[i] = {"settings": jobs[i].settings, **result}
            self.cache.put(jobs[i].key, data[i])
            progress.report(i, data[i], "done")

        if train:
            with progress:
                self._train(jobs, todo, finish)
            log.info("training runs took %.1f min", (time.perf_counter() - progress.started) / 60)
        return [job.record(d) for job, d in zip(jobs, data, strict=True) if d is not None]

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
        pool = ProcessPoolExecutor(self.jobs, ctx, initializer=start_worker, initargs=(keep_freed_memory,))
        with pool, stop_pool_on_interrupt(pool):
            futures = {
                pool.submit(train_run, self.suite, jobs[i].mixer, jobs[i].entry, self.seed, 1): i
                for i in order
            }
            failed = None  # the first failure: the runs not started are cancelled, the running ones kept
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                if isinstance(error := future.exception(), KeyboardInterrupt):
                    raise error  # a run stopped by a signal: the others stop too (stop_pool_on_interrupt)
                if error is not None:
                    if failed is None:
                        failed = error
                        job = jobs[futures[future]]
                        log.error(
                            "%s on %s %s failed: %s", job.mixer, job.entry.task, job.entry.setting, error
                        )
                        for other in futures:
                            other.cancel()
                    continue
                finish(futures[future], future.result())
            if failed is not None:
                raise failed
