r"""Training beyond one process: torch.distributed, launched by ``torchrun`` (DDP and FSDP2).

    torchrun --standalone --nproc_per_node 2 -m seqlab train RUN.yaml  # DDP: gloo on CPU, nccl on CUDA
    seqlab train RUN.yaml --nproc 2                                 # the same, through torchrun's own launcher
    seqlab train RUN.yaml --nproc 2 --train.strategy=fsdp           # FSDP2: parameters, gradients and
                                                                    # optimizer state sharded over the ranks

The data split. Batch index i is the same global batch of B rows on every rank (a pure function of the task's
seed, the split and i); rank r of W trains on rows [r·B/W, (r+1)·B/W). So no two ranks see the same row, and
a stateful stream (row j of batch i+1 continues row j of batch i, truncated BPTT) stays on one rank.

Why W processes give one process's numbers. DDP averages the gradients over ranks. For a task whose loss is a
mean over equally many positions per row (language models, classification), the mean of W rank means over
B/W rows each is the mean over the B rows, so W processes with B/W rows reproduce one process with B rows:
the same loss sequence, to float32 rounding (the sums run in another order; tests/training/test_ddp.py holds
them to 1e-5). Padded tasks (translation, captions) hold different numbers of real tokens per rank; their
average weighs ranks equally, which is close to, not equal to, the single-process mean. Two things make W
processes equal to one in distribution only, not number for number: dropout (each rank draws its own masks,
from a stream seeded by (seed, rank) after the model is built: masks shared by the ranks would cover B rows
with B/W draws) and BatchNorm (the video and captioning CNN encoders: each rank normalizes with the statistics
of its own B/W rows, and the running statistics kept are rank 0's, as plain DDP does).

What every rank does and what only rank 0 does. Every rank builds the model from the same seed, trains on its
rows, and evaluates the same validation batches (evaluation is cheap next to training, and under FSDP every
rank must take part in each forward). Rank 0 alone writes ``metrics.jsonl``, TensorBoard events, the progress
bar and the checkpoint directory; the logged loss and tokens/s are the means and sums over ranks.

Checkpoints. DDP: rank 0 writes the same checkpoint as a single process (the carried recurrent states of all
ranks are gathered into it). FSDP: every rank writes its shards with torch.distributed.checkpoint (DCP) into
the checkpoint directory, beside a consolidated ``model.safetensors`` gathered on rank 0, so ``generate``,
``export`` and the rest read it like any other. ``--resume`` works across a change of world size: DDP's
checkpoint holds full tensors; DCP reshards on load.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from seqlab.kernels.gemm import onednn_reason
from seqlab.training.config import cpu_has_bf16_matmul

log = logging.getLogger("seqlab.train")

__all__ = ["World", "setup", "shard_batch", "teardown", "world_from_env", "wrap"]


@dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` processes, ``local_rank`` on its machine."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def world_from_env() -> World:
    """The world torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK); one process without."""
    env = os.environ
    return World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(strategy: str, device: torch.device) -> World:
    """Join the process group torchrun set up (gloo on CPU, nccl on CUDA); FSDP in one process without
    torchrun gets a group of one on loopback. Returns this process's World."""
    world = world_from_env()
    if strategy == "fsdp" and "WORLD_SIZE" not in os.environ:  # a group of one: FSDP needs a process group
        group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1"}
        group = {k: v for k, v in {**group, "LOCAL_RANK": "0"}.items() if k not in os.environ}
        # taken out again by teardown: a later run of this process is not in a group
        _SET_BY_SETUP.update(group)
        os.environ.update(group)
    if (world.size > 1 or strategy == "fsdp") and not dist.is_initialized():
        device = local_device(device, world)  # nccl binds each rank to its own GPU, named by index
        if device.type == "cuda" and device.index is None:  # FSDP's group of one: the current GPU
            device = torch.device("cuda", torch.cuda.current_device())
        # the rank's GPU is its default too, so that nothing lands on GPU 0 by accident
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
        log.info("rank %d of %d joined the %s process group", world.rank, world.size, backend)
    return world


def teardown() -> None:
    """Leave the process group (at the end of ``seqlab train``), and take out the variables ``setup`` set."""
    if dist.is_initialized():
        dist.destroy_process_group()
    for key, value in list(_SET_BY_SETUP.items()):
        if os.environ.get(key) == value:
            del os.environ[key]
        del _SET_BY_SETUP[key]


_SET_BY_SETUP: dict[str, str] = {}


def local_device(device: torch.device, world: World) -> torch.device:
    """CUDA ranks each take the GPU of their local rank; CPU ranks share the CPU. A rank whose GPU this machine
    does not have is refused by name (torchrun started more processes on it than it has GPUs)."""
    if device.type == "cuda" and world.size > 1 and device.index is None:
        if world.local_rank >= (count := torch.cuda.device_count()):
            raise ValueError(
                f"rank {world.rank} of {world.size} is local rank {world.local_rank} on this machine and takes "
                f"GPU {world.local_rank}, but the machine has {count} GPU{'s' * (count != 1)}: start at most "
                f"{count} process{'es' * (count != 1)} per machine (torchrun --nproc_per_node), or train on "
                "the CPU with --device cpu"
            )
        return torch.device("cuda", world.local_rank)
    return device


def cuda_precision(precision: str, device: torch.device) -> None:
    """TF32 matmuls unless train.precision is 'fp32', and a report of the precision and of the SDPA backends
    torch may choose on this GPU (flash, memory-efficient, cuDNN, math: it takes the first that fits)."""
    tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    b = torch.backends.cuda
    backends = {
        "flash": b.flash_sdp_enabled(),
        "memory-efficient": b.mem_efficient_sdp_enabled(),
        "cudnn": b.cudnn_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }
    log.info(
        "%s: %s, TF32 %s; SDPA backends enabled: %s",
        torch.cuda.get_device_name(device),
        "bf16 autocast" if tf32 else "fp32",
        "on" if tf32 else "off",
        ", ".join(k for k, on in backends.items() if on),
    )


def cpu_precision(precision: str) -> None:
    """Log the precision of a CPU run, and where fp32 runs on a CPU with bf16 matmuls in hardware, the option."""
    if precision == "bf16":
        log.info("CPU: bf16 autocast (matmuls in bf16 on the CPU's AMX/AVX512-BF16 units)")
    elif cpu_has_bf16_matmul():
        log.info(
            "CPU: fp32. This CPU multiplies bf16 matrices in hardware (AMX/AVX512-BF16): train.precision=bf16 "
            "(autocast) trains faster at bf16's rounding (1.5-2x for GPT and ViT in seqlab's benchmarks)"
        )
    if precision != "bf16" and onednn_reason() is None:
        log.info(
            "CPU: the linear layers' large fp32 products run through oneDNN, faster than torch's MKL on this CPU "
            "(seqlab.kernels.gemm; SEQLAB_GEMM=torch keeps them with MKL)"
        )


def check_divisible(batch: dict[str, Tensor], world: World) -> None:
    """A ValueError before the first step when the world size does not divide the batch."""
    rows = _rows(batch)
    if rows % world.size:
        raise ValueError(
            f"the task's batch of {rows} rows cannot be split over {world.size} processes without overlap; "
            f"choose a batch size divisible by {world.size} (task.batch_size) or another --nproc"
        )


def _rows(batch: dict[str, Tensor]) -> int:
    return next(v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.dim() > 0)


def shard_batch(batch: dict[str, Tensor], world: World) -> dict[str, Tensor]:
    """This rank's rows of a global batch: every tensor with a batch dimension is cut along it, flags such as a
    stateful task's 0-d ``reset`` are kept whole."""
    if world.size == 1:
        return batch
    rows = _rows(batch)
    per = rows // world.size
    lo = world.rank * per
    return {k: v[lo : lo + per] if isinstance(v, Tensor) and v.dim() > 0 else v for k, v in batch.items()}


class DataParallel(nn.parallel.DistributedDataParallel):
    """DistributedDataParallel that also answers the wrapped model's own attributes (``output_lengths``,
    ``config``), so a task speaks to it as to the model."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def wrap(model: nn.Module, world: World, strategy: str, device: torch.device) -> nn.Module:
    """The module training calls: the model itself (one process), DDP around it, or the model with FSDP2's
    ``fully_shard`` applied to each block of every top-level ModuleList and then to the root (in place).

    DDP uses ``find_unused_parameters=True``: a model may leave parameters out of a step (a video model's
    caption decoder under the action head), and DDP must not wait for their gradients.
    """
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # on the run's device: torch's default mesh is CUDA's wherever a GPU is, also for a run on the CPU
        mesh = init_device_mesh(device.type, (world.size,))
        for module in model.modules():
            if isinstance(module, nn.ModuleList):
                for block in module:
                    fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if world.size == 1:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return DataParallel(model, device_ids=ids, find_unused_parameters=True)


def no_sync(net: nn.Module, last: bool):
    """DDP's ``no_sync`` for the micro-batches before the last of a gradient-accumulation step."""
    if isinstance(net, nn.parallel.DistributedDataParallel) and not last:
        return net.no_sync()
    return contextlib.nullcontext()


def reduce_step(loss: float, tokens: int, world: World) -> tuple[float, int]:
    """The step's loss averaged over ranks and its tokens summed (for the records)."""
    if world.size == 1:
        return loss, tokens
    t = torch.tensor([loss, float(tokens)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0]) / world.size, int(t[1])


def any_rank(flags: tuple[bool, ...], world: World) -> tuple[bool, ...]:
    """Each flag True on every rank when it is True on one (a stop must be taken by all ranks together)."""
    if world.size == 1:
        return flags
    t = torch.tensor([int(f) for f in flags])
    dist.all_reduce(t)
    return tuple(bool(v) for v in t.tolist())


def barrier(world: World) -> None:
    if world.size > 1 or dist.is_initialized():
        dist.barrier()


def cuda_rng_to_save(world: World, device: torch.device) -> dict[str, Any]:
    """The CUDA generator states a checkpoint keeps: ``rng_cuda``, every device as this rank sees it, and with
    several ranks on CUDA ``rng_cuda_ranks``, each rank's own device as that rank used it (a collective: every
    rank calls it)."""
    if not torch.cuda.is_available():
        return {}
    state: dict[str, Any] = {"rng_cuda": torch.cuda.get_rng_state_all()}
    if world.size > 1 and device.type == "cuda":
        state["rng_cuda_ranks"] = gather_objects(torch.cuda.get_rng_state(device), world)
    return state


def cuda_rng_to_restore(state: dict[str, Any], world: World, device: torch.device, device_count: int) -> dict:
    """{CUDA device index: generator state} that a resumed rank sets from a checkpoint's trainer state: its own
    device's state as that rank saved it (``rng_cuda_ranks``, one per rank) when the world has as many ranks;
    otherwise rank 0's view of every device (``rng_cuda``), for the devices this machine has."""
    per_rank = state.get("rng_cuda_ranks")
    if per_rank is not None and len(per_rank) == world.size and device.type == "cuda":
        return {device.index if device.index is not None else 0: per_rank[world.rank]}
    saved = state.get("rng_cuda")
    return {} if saved is None else dict(enumerate(list(saved)[:device_count]))


def _rank_seed(seed: int, rank: int, step: int) -> int:
    """A seed of its own for (seed, rank, step): SHA-256 of the three, 63 bits."""
    digest = hashlib.sha256(f"{seed}/{rank}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def seed_rank_streams(seed: int, world: World, step: int = 0) -> None:
    """Every rank built the model from the same seed; then ranks other than 0 reseed torch's generators (CPU and
    CUDA) from (seed, rank, step), so that their dropout masks differ (identical masks covered the B rows of a
    global batch with B/W masks). Rank 0 keeps the seed's stream, a single process's."""
    if world.size > 1 and world.rank > 0:
        torch.manual_seed(_rank_seed(seed, world.rank, step))


def cpu_rng_to_save(world: World) -> dict[str, Any]:
    """``rng_cpu`` (this rank's generator; rank 0's is the one written) and with several ranks ``rng_cpu_ranks``,
    every rank's (a collective: every rank calls it)."""
    state: dict[str, Any] = {"rng_cpu": torch.get_rng_state()}
    if world.size > 1:
        state["rng_cpu_ranks"] = gather_objects(torch.get_rng_state(), world)
    return state


def restore_cpu_rng(state: dict[str, Any], world: World, seed: int, step: int) -> None:
    """Each rank's own saved generator when the world has as many ranks as saved; otherwise rank 0's, and the
    other ranks a stream of their own from (seed, rank, step)."""
    per_rank = state.get("rng_cpu_ranks")
    if per_rank is not None and len(per_rank) == world.size:
        torch.set_rng_state(per_rank[world.rank])
        return
    torch.set_rng_state(state["rng_cpu"])
    seed_rank_streams(seed, world, step)


def gather_objects(obj: Any, world: World) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """FSDP's sharded parameters gathered into full CPU tensors (on rank 0; empty elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_shards(model: nn.Module, optimizer: torch.optim.Optimizer, where: Path) -> None:
    """Every rank writes its shards of the model and the optimizer state into ``where`` (DCP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(where))


def load_shards(model: nn.Module, optimizer: torch.optim.Optimizer, where: Path) -> None:
    """Load DCP shards written by any world size into this world's shards (DCP reshards on load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (where / ".metadata").is_file():
        raise ValueError(
            f"{where} holds no sharded (FSDP) state: it was saved with train.strategy=ddp or by one process, "
            f"and resumes with that strategy"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    try:
        dcp.load(state, checkpoint_id=str(where))
    except (CheckpointException, RuntimeError, ValueError) as e:  # said deep in DCP's planner: say it here
        cause = next(iter(getattr(e, "failures", {}).values()), e)  # DCP: rank -> (exception, frames)
        cause = cause[0] if isinstance(cause, tuple) else cause
        raise ValueError(
            f"the sharded checkpoint in {where} does not fit this model ({str(cause).splitlines()[0][:300]}); "
            f"resume with the model settings it was saved with"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
