"""A model-agnostic training loop.

The trainer knows a model only as an ``nn.Module`` and a task only through its interface
(``seqlab.tasks.base.Task``): the task turns a batch into a loss. What the trainer adds is the engineering
every run needs: AdamW with weight-decay groups, warmup + cosine learning rate, gradient clipping by global
norm, gradient accumulation, truncated BPTT (the recurrent state is carried from batch to batch and detached),
periodic evaluation, metrics as JSON lines, a progress bar, atomic checkpoints and an exact resume.

Exact resume: batches are a pure function of their index, the learning rate a pure function of the step,
and the checkpoint holds the optimizer, the RNG state, any carried recurrent state and the loss summed since
the last train record, so a resumed run produces the same loss sequence and the same ``metrics.jsonl``
records (timings aside) as an uninterrupted one, whatever ``log_every`` and ``save_every`` are.

The run directory (``out_dir``):

- ``metrics.jsonl`` holds one strict JSON record per line; a value that is not finite (a diverged metric)
  is written as ``null``, never ``NaN``. A train record at step s holds the mean loss over the steps since
  the last multiple of ``log_every`` (the final record of a run that stops between two, too).
- Every start first removes what an interrupted save left behind (seqlab's own temporary names only,
  ``seqlab.training.manifest.remove_leftovers``).
- A resume starts from the newest complete, verified checkpoint (``checkpoint.resumable_checkpoint``) and cuts
  ``metrics.jsonl`` back to its step: records written after the checkpoint go (``manifest.cut_metrics``).
- A fresh start never appends to the ``metrics.jsonl`` of an earlier run: it moves that file aside to
  ``metrics.jsonl.stale-N`` (the first free N) with a warning. Nothing is deleted.
- A fresh start into a directory that holds a run's checkpoints (a ``latest`` file or a manifest) is refused:
  its saves would join that run's manifest and prune its checkpoints.
- While ``fit`` runs, the run directory is locked (``.lock``, ``manifest.lock_run``): a second training into it
  is refused with the holder's process id instead of the two moving and pruning each other's files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seqlab.models import check_can_train
from seqlab.training import checkpoint as ckpt
from seqlab.training import distributed
from seqlab.training import loop_state as loop
from seqlab.training import manifest as run_files
from seqlab.training.config import TrainConfig
from seqlab.training.interrupt import StopDuringEval, stop_on_interrupt
from seqlab.training.optim import clip_gradients, lr_at, make_optimizer
from seqlab.training.run_dir import check_saves, open_run_dir
from seqlab.training.threads import governor_for

log = logging.getLogger("seqlab.train")


class Trainer:
    """Trains ``model`` on ``task``; writes metrics and checkpoints to ``out_dir`` when given."""

    def __init__(
        self,
        model: nn.Module,
        task,
        config: TrainConfig,
        out_dir: str | Path | None = None,
        run_config: dict[str, Any] | None = None,
    ):
        self.model, self.task, self.config = model, task, config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._lock: int | None = None  # the run directory's lock while fit runs (rank 0)
        self.run_config = run_config or {}
        self.world = distributed.setup(config.strategy, config.resolved_device())
        self.device = distributed.local_device(config.resolved_device(), self.world)
        self.model.to(self.device)
        self._governor = governor_for(config.threads, self.device, self.world.size)  # fewer when busy
        if self.world.size > 1:  # before any work: the batch must split over the ranks
            distributed.check_divisible(task.get_batch("train", 0), self.world)
        self.net = distributed.wrap(model, self.world, config.strategy, self.device)  # what training calls
        distributed.seed_rank_streams(config.seed, self.world)  # the weights alike, dropout's draws not
        self.optimizer = make_optimizer(model, config.lr, config.weight_decay, (config.beta1, config.beta2))
        self.step, self._saved_step = 0, None  # the step of the newest checkpoint written or resumed
        self._eval_pending = False  # a stop cut the evaluation of this step's weights
        self.elapsed = 0.0  # seconds of training, summed over resumed segments
        self.carry: Any = None  # recurrent state carried between batches (stateful tasks only)
        self.history: list[dict[str, Any]] = []  # every metrics record of this process
        # the loss since the last train record (saved), tokens and time (this process)
        self.window = loop.Window()
        self.last: dict[str, Any] = {"train_loss": None}  # the newest train loss and eval metrics
        self.grad_norm: float | None = None  # the last step's gradient norm before clipping
        self.tb = None  # the TensorBoard writer, with train.loggers: [tensorboard]

    # ---- checkpoints ----------------------------------------------------------------------------------------

    def _checkpoint_config(self) -> dict[str, Any]:
        m = self.model
        return {
            "family": getattr(m, "family", type(m).__name__),
            "model": dataclasses.asdict(m.config)
            if dataclasses.is_dataclass(getattr(m, "config", None))
            else {},
            "task": self.task.describe(),
            "train": dataclasses.asdict(self.config),
            "run": self.run_config,
        }

    def save(self) -> Path | None:
        """Write a checkpoint (rank 0; under FSDP every rank writes its shards). Returns its path on rank 0."""
        if self.out_dir is None:
            raise ValueError("this trainer has no out_dir to save to")
        fsdp = self.config.strategy == "fsdp"
        state = {
            "step": self.step,
            "elapsed": self.elapsed,
            "optimizer": None if fsdp else self.optimizer.state_dict(),  # FSDP: in the shards
            **distributed.cpu_rng_to_save(self.world),
            "carry": self.carry,
            "log_window": {"loss": self.window.loss, "n": self.window.n},
            "eval_pending": self._eval_pending,  # a stop cut this step's evaluation: the resume does it
            **distributed.cuda_rng_to_save(self.world, self.device),
        }
        if self.world.size > 1 and self.task.stateful:  # every rank's streams, for a resume on as many ranks
            state["carry_ranks"] = distributed.gather_objects(
                loop.move_to(self.carry, torch.device("cpu")), self.world
            )
        state["world_size"] = self.world.size
        shards = self.out_dir / "checkpoints" / f".tmp-step-{self.step:08d}-shards" if fsdp else None
        weights = distributed.full_model_state(self.model) if fsdp else self.model
        if fsdp:
            distributed.save_shards(self.model, self.optimizer, shards)
        path = None
        if self.world.main:
            tok = getattr(self.task, "tokenizer", None)
            path = ckpt.save_checkpoint(
                self.out_dir,
                self.step,
                weights,
                self._checkpoint_config(),
                state,
                tok.to_json() if tok is not None else None,
                self.config.keep_checkpoints,
                shards=shards,
            )
        distributed.barrier(self.world)
        self._saved_step = self.step
        return path

    def resume(self, path: str | Path | None = None) -> None:
        """Load weights and trainer state from ``path`` (a checkpoint, or a run directory: its newest complete,
        verified checkpoint; default: this run's) and cut ``metrics.jsonl`` back to the checkpoint's step."""
        if path is None and self.out_dir is None:
            raise ValueError(
                "resume=True continues the run in the Trainer's out_dir, and it has none: give one"
            )
        where = ckpt.resumable_checkpoint(path or self.out_dir)
        state = ckpt.load_trainer_state(where, verified=True)
        if self.config.strategy == "fsdp":
            distributed.load_shards(self.model, self.optimizer, where)
        elif state["optimizer"] is None:
            raise ValueError(f"{where} was saved with train.strategy=fsdp; resume it with that strategy")
        else:
            ckpt.load_weights(self.model, where / "model.safetensors")
            self.optimizer.load_state_dict(state["optimizer"])
        distributed.restore_cpu_rng(state, self.world, self.config.seed, int(state["step"]))
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            for index, rng in distributed.cuda_rng_to_restore(state, self.world, self.device, count).items():
                torch.cuda.set_rng_state(rng, index)
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        self._saved_step = self.step
        self.carry = loop.restored_carry(state, self.world, self.device)
        self.window.restore(**state.get("log_window", {}))  # older checkpoints: an empty window
        self._eval_pending = bool(state.get("eval_pending", False))
        if self.step > self.config.steps:
            raise ValueError(
                f"train.steps={self.config.steps} is below the step {self.step} of the checkpoint {where}; "
                f"pass train.steps >= {self.step} to continue this run"
            )
        if self.out_dir is not None:
            self._cut_metrics()
        log.info("resumed from %s at step %d", where, self.step)

    def _cut_metrics(self) -> None:
        """Cut ``metrics.jsonl`` back to the resumed step; the newest train loss and eval metrics it keeps
        become ``last`` (what a resumed run that has nothing left to do reports)."""
        for rec in run_files.cut_metrics(self.out_dir / "metrics.jsonl", self.step):
            if rec.get("split") == "train":
                self.last["train_loss"] = rec.get("loss")
            elif rec.get("split") == "val":
                self.last.update({k: v for k, v in rec.items() if k not in ("step", "split", "elapsed_s")})

    # ---- the loop -------------------------------------------------------------------------------------------

    def _record(self, rec: dict[str, Any]) -> None:
        """Append one record to ``metrics.jsonl`` as strict JSON (non-finite numbers as null)."""
        rec = run_files.finite_or_none(rec)
        self.history.append(rec)
        if not self.world.main:
            return
        if self.out_dir is not None:
            with open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, allow_nan=False) + "\n")
        if self.tb is not None:
            self.tb.write(rec)

    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        try:
            return self.task.evaluate(self.model, self.config.eval_batches)
        finally:
            self.model.train()

    def _last_good(self) -> str:
        latest = self.out_dir / "latest" if self.out_dir is not None else None
        if latest is None or not latest.is_file():
            return "No checkpoint was saved before it."
        return f"The last good checkpoint is {self.out_dir / latest.read_text().strip()} (--resume starts there)."

    def _autocast(self):
        """bf16 autocast where train.precision asks for it ('bf16'; 'auto' on CUDA); nothing otherwise."""
        dtype = self.config.autocast_dtype()
        return contextlib.nullcontext() if dtype is None else torch.autocast(self.device.type, dtype)

    def train_step(self, stop=None) -> tuple[float, int] | None:
        """One optimizer step over ``grad_accum`` batches. Returns (mean loss, tokens seen), or None when
        ``stop`` (a StopFlag) is set between two of the step's batches in a one-process run: the step is
        dropped (no update; gradients, RNG and carried state as at its start) rather than finished."""
        c, task = self.config, self.task
        lr = lr_at(self.step, c.lr, c.steps, c.warmup_steps, c.min_lr if c.min_lr is not None else c.lr / 10)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total, tokens = 0.0, 0
        start = loop.StepStart(self.carry, self.device) if stop is not None and stop.drops_steps else None
        for micro in range(c.grad_accum):
            if start is not None and micro > 0 and stop.set:
                self.carry = start.restore()
                self.optimizer.zero_grad(set_to_none=True)
                return None
            batch = task.get_batch("train", self.step * c.grad_accum + micro)
            batch = loop.to_device(distributed.shard_batch(batch, self.world), self.device)
            state = None
            if task.stateful:
                reset = batch.pop("reset", None)
                state = None if reset is None or bool(reset) else loop.detach_state(self.carry)
            with distributed.no_sync(self.net, micro == c.grad_accum - 1):
                with self._autocast():
                    loss, _, new_state = task.loss(self.net, batch, state)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"loss is {loss.item()} at step {self.step + 1}; lower train.lr (now {c.lr:g})"
                        + (" or set train.grad_clip. " if c.grad_clip is None else ". ")
                        + self._last_good()
                    )
                (loss / c.grad_accum).backward()
            self.carry = loop.detach_state(new_state) if task.stateful else None
            total += loss.item()
            tokens += task.tokens_in(batch)
        if c.grad_clip is not None:  # the norm before clipping, for the records; refused when not finite
            self.grad_norm = clip_gradients(self.model, c.grad_clip, self.step, self._last_good)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return distributed.reduce_step(total / c.grad_accum, tokens, self.world)

    def fit(self, resume: bool | str | Path = False, until: int | None = None) -> dict[str, Any]:
        """Train to ``config.steps`` (or stop early at step ``until``, saving there, as a pause point).

        ``resume``: True continues from this run's newest complete, verified checkpoint, a path from that
        checkpoint (or run directory); False starts afresh.
        """
        try:
            return self._fit(resume, until)
        finally:
            run_files.unlock_run(self._lock)
            self._lock = None
            self._governor.restore()

    def _fit(self, resume: bool | str | Path, until: int | None) -> dict[str, Any]:
        c = self.config
        self._start(resume)
        bar = loop.progress_bar(c.progress and self.world.main, c.steps, self.step)
        window, last = self.window, self.last
        window.start = time.perf_counter()
        stop = None
        if self._eval_pending:  # the evaluation a stop cut, of these weights: recorded as it would have been
            self._eval_pending = False
            last.update(self._log_eval(window, bar, last["train_loss"]))
        with stop_on_interrupt() as interrupted:
            interrupted.one_process, interrupted.grad_accum = self.world.size == 1, c.grad_accum
            while self.step < c.steps and stop is None:
                stop = self._one_step(window, last, bar, until, interrupted)
        if stop == "budget":
            log.warning(
                "stopping at step %d: train.max_minutes=%s reached (the run's training time over all its sessions; "
                "--resume with a larger --train.max_minutes continues it)",
                self.step,
                c.max_minutes,
            )
        if stop == "interrupted":
            interrupted.say_stopped(self.step, self.out_dir)
        if bar is not None:
            bar.close()
        if self.tb is not None:
            self.tb.close()
        summary = {"step": self.step, "elapsed_s": self.elapsed, "stopped_early": stop == "budget", **last}
        if stop == "interrupted":
            summary.update(interrupted.summary())
        return run_files.finite_or_none(summary)

    def _one_step(self, window, last: dict, bar, until: int | None, interrupted) -> str | None:
        """One optimizer step, then the logging, evaluation and saving it is due; the reason to stop, if any."""
        c = self.config
        self._governor.tick()
        t0 = time.perf_counter()
        result = self.train_step(interrupted)
        self.elapsed += time.perf_counter() - t0
        if result is None:  # dropped half-way by a stop: save the last whole step unless it is saved
            if self.out_dir is not None and self._saved_step != self.step:
                self.save()
            return "interrupted"
        window.add(*result)
        stop = self._stop_reason(until, interrupted.set)
        done = self.step >= c.steps or stop is not None
        # a Ctrl-C or a pause saves mid-window without a record, so a resume logs as if never cut
        finish = done and stop not in ("interrupted", "paused")
        if self.step % c.log_every == 0 or finish:
            last["train_loss"] = self._log_train(window, bar)
        if (c.eval_every and self.step % c.eval_every == 0) or finish:
            last.update(self._log_eval(window, bar, last["train_loss"], interrupted))
            stop, done = ("interrupted", True) if self._eval_pending else (stop, done)
        if self.out_dir is not None and ((c.save_every and self.step % c.save_every == 0) or done):
            self.save()
        if bar is not None:
            bar.update(1)
        return stop

    def _start(self, resume: bool | str | Path) -> None:
        """Threads, the run directory (cleared of an interrupted save's leftovers; an earlier run's metrics set
        aside on a fresh start), the checkpoint to resume from, training mode."""
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        if self.out_dir is not None and self.world.main:
            self._lock = open_run_dir(self.out_dir, resume)
        distributed.barrier(self.world)
        if self.device.type == "cuda":
            distributed.cuda_precision(self.config.precision, self.device)
        elif self.device.type == "cpu":
            distributed.cpu_precision(self.config.precision)
            check_can_train(self.model)  # gradients and optimizer state fit, or said before step 1
        if resume is not False:
            self.resume(None if resume is True else resume)
        if self.out_dir is not None and self.world.main:
            check_saves(self.out_dir, self.step, self.config, self.model)  # no stray folder there; disk room
        if "tensorboard" in self.config.loggers and self.out_dir is not None and self.world.main:
            from seqlab.training.tensorboard import TensorBoardLog

            self.tb = TensorBoardLog(self.out_dir / "tb", purge_step=self.step + 1 if self.step else None)
        self.model.train()

    def _stop_reason(self, until: int | None, interrupted: bool = False) -> str | None:
        """'interrupted' after a Ctrl-C, 'paused' at step ``until``, 'budget' past train.max_minutes, else None
        (go on); with several processes, a stop one rank sees is taken by all."""
        c = self.config
        over = c.max_minutes is not None and self.elapsed > 60 * c.max_minutes
        interrupted, over = distributed.any_rank((interrupted, over), self.world)
        if interrupted:
            return "interrupted"
        if until is not None and self.step >= until:
            return "paused"
        return "budget" if over else None

    def _log_train(self, window: loop.Window, bar) -> float:
        """Record the mean training loss since the last multiple of ``log_every`` and the throughput since
        the last record; returns the loss."""
        now, lr = time.perf_counter(), self.optimizer.param_groups[0]["lr"]
        rec = loop.train_record(self.step, window, lr, self.grad_norm, self.elapsed, now)
        self._record(rec)
        window.reset(now, keep_loss=self.step % self.config.log_every != 0)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", refresh=False)
        return rec["loss"]

    def _log_eval(self, window: loop.Window, bar, train_loss: float | None, stop=None) -> dict[str, float]:
        """Evaluate, record the metrics and return them; evaluation time does not count against throughput.
        A stop signal during it (``stop``, a StopFlag) ends it unrecorded: {} and ``_eval_pending``, saved."""
        t_eval = time.perf_counter()
        try:
            with stop.raising() if stop is not None else contextlib.nullcontext():
                metrics = self.evaluate()
        except StopDuringEval:  # the weights are the step's: a resume evaluates them first
            self._eval_pending = True
            return {}
        self._record({"step": self.step, "split": "val", **metrics, "elapsed_s": round(self.elapsed, 3)})
        window.start += time.perf_counter() - t_eval
        if bar is not None:  # with the train loss once one is logged (an evaluation can come before it)
            shown = metrics if train_loss is None else {"loss": train_loss, **metrics}
            bar.set_postfix(**{k: f"{v:.3f}" for k, v in shown.items()}, refresh=False)
        log.info("step %d: %s", self.step, metrics)
        return metrics
