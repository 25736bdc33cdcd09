"""The training run's settings: ``TrainConfig``, every field documented and checked before any work starts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from seqlab.validation import check_nonnegative, check_positive_floats, check_positive_ints

__all__ = ["TrainConfig", "cpu_has_bf16_matmul"]


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX512-BF16 dot products, which
    oneDNN uses for bf16 matmuls): there bf16 autocast trains faster than fp32, elsewhere far slower."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


@dataclass
class TrainConfig:
    """The settings of a training run (the ``train`` section of a run file)."""

    steps: int = 1000
    """Optimizer steps (each one is ``grad_accum`` batches)."""
    lr: float = 2e-3
    """Peak learning rate, reached after the warmup, then a cosine down to ``min_lr``."""
    min_lr: float | None = None
    """Learning rate at the end of the cosine; None means lr / 10."""
    warmup_steps: int = 100
    """Steps of linear warmup from 0 to ``lr``."""
    weight_decay: float = 0.1
    """AdamW's decoupled decay, on matrices only (seqlab.training.optim.param_groups)."""
    beta1: float = 0.9
    beta2: float = 0.99
    """AdamW's decay rates of the first and second moment estimates (β1, β2)."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this value (Pascanu et al. 2013); None disables clipping."""
    grad_accum: int = 1
    """Batches whose gradients are summed (and averaged) into one optimizer step."""
    eval_every: int = 250
    """Evaluate every this many steps (and always at the end); 0 evaluates only at the end."""
    eval_batches: int = 20
    log_every: int = 10
    """Write a train record (mean loss, tokens/s) every this many steps."""
    save_every: int = 500
    """Checkpoint every this many steps (and always at the end); 0 saves only at the end."""
    keep_checkpoints: int = 2
    """The newest checkpoints kept on disk; 0 keeps every one."""
    max_minutes: float | None = None
    """Wall-time budget: when exceeded, evaluate, save and stop early."""
    seed: int = 0
    """Seeds torch's RNG before the model is built (seqlab.run): the initial weights and dropout follow."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    strategy: str = "ddp"
    """With several processes (torchrun): 'ddp' replicates the model and averages gradients; 'fsdp' shards
    parameters, gradients and optimizer state (FSDP2), for models that do not fit one process."""
    precision: str = "auto"
    """'auto' (bf16 autocast and TF32 matmuls on CUDA, fp32 on CPU), 'fp32', or 'bf16' (bf16 autocast: on CUDA,
    and on a CPU that multiplies bf16 matrices in hardware, AMX or AVX512-BF16; elsewhere bf16 matmuls are
    emulated, many times slower than fp32, and 'bf16' is refused)."""
    threads: int | None = None
    """torch.set_num_threads for this run, pinned. None: PyTorch's default, fewer while other processes hold cores
    on a CPU run of one process (``seqlab.training.threads``: a busy machine otherwise slows every step)."""
    progress: bool = True
    """A progress bar on the terminal."""
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where the records go: 'jsonl' (``metrics.jsonl``, always written: resuming reads it) and 'tensorboard'
    (event files in the run directory's ``tb/``; needs the tensorboard package)."""

    def __post_init__(self):
        check_positive_ints(self, ("steps", "grad_accum", "eval_batches", "log_every"), "train.")
        check_positive_floats(self, ("lr",), "train.")
        check_positive_floats(self, ("grad_clip", "max_minutes"), "train.", allow_none=True)
        check_positive_ints(self, ("threads",), "train.", allow_none=True)
        cores = os.cpu_count() or 1  # more threads than that are never faster, and thousands fail to start
        if self.threads is not None and self.threads > cores:
            raise ValueError(
                f"train.threads={self.threads} is more than this machine's {cores} CPU threads; give "
                f"--train.threads={cores} or fewer (a resume may change it)"
            )
        self._check_ranges()

    def _check_ranges(self) -> None:
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
                raise ValueError(f"train.{name} must be in [0, 1), got {v!r}")
        for name in ("progress",):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"train.{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"train.seed must be an integer from 0 to 2**63 - 1, got {self.seed!r}")
        self._check_device()
        self._check_loggers()
        self._check_strategy()
        check_nonnegative(self, ("warmup_steps", "save_every", "eval_every", "keep_checkpoints"), "train.")
        check_nonnegative(self, ("min_lr", "weight_decay"), "train.", numbers=True)
        if self.min_lr is not None and self.min_lr > self.lr:  # the cosine would climb instead of decaying
            raise ValueError(
                f"train.min_lr={self.min_lr} is above train.lr={self.lr}; the schedule decays to it"
            )
        if self.warmup_steps > self.steps:  # allowed (a short trial run), but never at the rate it names
            logging.getLogger("seqlab").warning(
                "train.warmup_steps=%d is more than train.steps=%d: the whole run trains in the warmup, below "
                "train.lr=%s (it reaches %.3g); lower warmup_steps to train at that rate",
                self.warmup_steps,
                self.steps,
                self.lr,
                self.lr * self.steps / self.warmup_steps,
            )

    def _check_loggers(self) -> None:
        known = ("jsonl", "tensorboard")
        if not isinstance(self.loggers, list | tuple) or any(name not in known for name in self.loggers):
            raise ValueError(
                f"train.loggers must be a list of {known}, got {self.loggers!r} (on the command line: "
                "--train.loggers=[tensorboard])"
            )
        self.loggers = list(dict.fromkeys(["jsonl", *self.loggers]))
        if "tensorboard" in self.loggers:
            from seqlab.training.tensorboard import check_available

            check_available()

    def _check_strategy(self) -> None:
        if self.strategy not in ("ddp", "fsdp"):
            raise ValueError(f"train.strategy must be 'ddp' or 'fsdp', got {self.strategy!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"train.precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}")
        kind = self.resolved_device().type
        if self.strategy == "fsdp" and kind == "cpu" and not hasattr(torch.cpu.Stream, "record_event"):
            raise ValueError(  # FSDP2 records events on its streams; the CPU's have them from torch 2.7
                f"train.strategy='fsdp' on the CPU needs torch 2.7 or later, this is torch {torch.__version__}; "
                "use train.strategy='ddp', or a newer torch"
            )
        if self.precision == "bf16" and kind == "cpu" and not cpu_has_bf16_matmul():
            raise ValueError(
                "train.precision='bf16' on this CPU: it has neither AMX nor AVX512-BF16, so bf16 matmuls are "
                "emulated, many times slower than fp32; use 'auto' or 'fp32'"
            )
        if self.precision == "bf16" and kind not in ("cpu", "cuda"):
            raise ValueError(f"train.precision='bf16' runs on CUDA or the CPU, not on {kind}; use 'fp32'")

    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 under 'bf16', and under 'auto' on CUDA; None (fp32, no autocast) otherwise."""
        kind = self.resolved_device().type
        if self.precision == "bf16" or (self.precision == "auto" and kind == "cuda"):
            return torch.bfloat16
        return None

    def _check_device(self) -> None:
        """A device torch knows and this machine has; checked before any model is built or step taken."""
        if self.device == "auto":
            return
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(
                f"train.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            ) from e
        if dev.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n == 0:
                raise ValueError(
                    f"train.device={self.device!r}, but this machine has no CUDA device; use 'cpu' or 'auto'"
                )
            if dev.index is not None and dev.index >= n:
                raise ValueError(f"train.device={self.device!r}, but this machine has {n} CUDA device(s)")
        elif dev.type == "mps" and not torch.backends.mps.is_available():
            raise ValueError(
                f"train.device={self.device!r}, but this machine (or this PyTorch build) has no MPS device; "
                "use 'cpu' or 'auto'"
            )
        elif dev.type not in ("cpu", "mps"):
            raise ValueError(f"train.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)
