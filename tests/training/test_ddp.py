"""Distributed training on CPU with gloo: real processes started by torch.distributed's launcher (torchrun).

W processes with B/W rows each must give the loss sequence of one process with B rows; a run must resume on
another number of processes; FSDP's sharded checkpoints must reshard. Each launch is bounded in time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqlab.cli import main
from seqlab.training import distributed
from seqlab.training.config import TrainConfig

TEXT = "".join(
    f"Line {i}: the quick brown fox jumps over the lazy dog, {i * 7 % 13} times.\n" for i in range(300)
)
LAUNCH_TIMEOUT = 120  # seconds per launch: a hung collective fails the test instead of the suite


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


# every step in the warmup, so that the rates do not depend on train.steps, which the resumes raise from 3 to 6
WARMUP_ONLY = ("--train.warmup_steps=6",)


def _args(text_file, model: str, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        f"--model.name={model}",
        "--task.name=text",
        f"--task.source={text_file}",
        "--task.seq_len=16",
        "--task.batch_size=4",
        f"--train.steps={steps}",
        "--train.eval_every=0",
        "--train.eval_batches=1",
        "--train.progress=false",
        "--train.warmup_steps=2",
        "--train.log_every=1",
        "--train.save_every=3",
        "--device=cpu",  # gloo on the CPU also where a GPU is (with fewer GPUs than ranks, CUDA is refused)
        *extra,
    ]


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch(args: list[str], *launcher: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "seqlab", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _torchrun(args: list[str], nproc: int = 2) -> None:
    _launch(args, "--nproc_per_node", str(nproc), "--master_port", str(_free_port()))


def _seqlab_nproc(args: list[str], nproc: int = 2) -> None:
    """``seqlab train --nproc N``: the same launch through seqlab's hand-over to torchrun."""
    cmd = [sys.executable, "-m", "seqlab", *args, "--nproc", str(nproc)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"torchrun --standalone --nproc_per_node {nproc} -m seqlab train")


def _one_process(args: list[str]) -> None:
    """One process, outside torchrun; in a subprocess when it needs a process group (FSDP)."""
    if any(a == "--train.strategy=fsdp" for a in args):
        done = subprocess.run(
            [sys.executable, "-m", "seqlab", *args], capture_output=True, text=True, timeout=60, env=_env()
        )
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        assert main(args) == 0


def _endless_nproc_run(text_file, out, preexec_fn=None) -> subprocess.Popen:
    """`seqlab train --nproc 2` of 100,000 steps into ``out``, saving only when stopped, its output piped."""
    args = [
        *_args(text_file, "test-lstm-lm", 100_000, "--train.save_every=0"),
        "--out",
        str(out),
        "--nproc",
        "2",
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "seqlab", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=preexec_fn,
    )


def _communicate(proc: subprocess.Popen, out) -> tuple[str, str]:
    """``proc.communicate`` within LAUNCH_TIMEOUT; on a timeout every process training into ``out`` is killed
    first (torchrun and its ranks run in a session of their own, which would outlive the test)."""
    import signal

    try:
        return proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(out).encode() in cmdline.read_bytes():
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)
            except OSError:
                continue
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(run_dir) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_two_processes_give_one_process_losses(text_file, tmp_path, grad_accum):
    """Stateful truncated-BPTT streams (an LSTM on contiguous text): each rank keeps its rows' streams."""
    args = _args(text_file, "test-lstm-lm", 6, f"--train.grad_accum={grad_accum}")
    _one_process([*args, "--out", str(tmp_path / "one")])
    _torchrun([*args, "--out", str(tmp_path / "two")])
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 6
    assert two == pytest.approx(one, rel=1e-5, abs=1e-6)  # float32: the sums run in another order
    assert one[-1] < one[0]  # it trained


@pytest.mark.parametrize("world", [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes(text_file, tmp_path, world):
    args = _args(text_file, "test-gpt", 6, "--task.sampling=random", *WARMUP_ONLY)
    _one_process([*args, "--out", str(tmp_path / "whole")])
    first, second = world
    half = [a if not a.startswith("--train.steps") else "--train.steps=3" for a in args]
    for nproc, run_args in ((first, half), (second, [*args, "--resume"])):
        run_args = [*run_args, "--out", str(tmp_path / "cut")]
        _seqlab_nproc(run_args, nproc) if nproc > 1 else _one_process(run_args)
    assert _losses(tmp_path / "cut") == pytest.approx(_losses(tmp_path / "whole"), rel=1e-5, abs=1e-6)


@pytest.mark.skipif(not hasattr(torch.cpu.Stream, "record_event"), reason="FSDP on the CPU needs torch 2.7")
def test_fsdp_shards_and_reshards_on_resume(text_file, tmp_path):
    """FSDP on 2 processes writes torch.distributed.checkpoint shards; one process resumes from them."""
    args = _args(text_file, "test-gpt", 6, "--task.sampling=random", "--train.strategy=fsdp", *WARMUP_ONLY)
    reference = _args(text_file, "test-gpt", 6, "--task.sampling=random", *WARMUP_ONLY)
    _one_process([*reference, "--out", str(tmp_path / "ddp")])
    half = [a if not a.startswith("--train.steps") else "--train.steps=3" for a in args]
    _torchrun([*half, "--out", str(tmp_path / "fsdp")])
    step3 = tmp_path / "fsdp" / "checkpoints" / "step-00000003"
    assert (step3 / ".metadata").is_file() and len(list(step3.glob("*.distcp"))) == 2
    _one_process([*args, "--resume", "--out", str(tmp_path / "fsdp")])
    assert _losses(tmp_path / "fsdp") == pytest.approx(_losses(tmp_path / "ddp"), rel=1e-5, abs=1e-6)
    # the consolidated weights read like any checkpoint's
    from seqlab.training.checkpoint import load_model

    assert sum(p.numel() for p in load_model(tmp_path / "fsdp").parameters()) > 0
    # shards of another model's shape: a clear error, not DCP's planner trace
    run = {
        "model": {"name": "test-gpt", "n_layers": 3},
        "task": {
            "name": "text",
            "source": str(text_file),
            "seq_len": 16,
            "batch_size": 4,
            "sampling": "random",
        },
        "train": {"strategy": "fsdp", "progress": False, "device": "cpu"},
    }
    script = (
        "from seqlab.run import build_run; from seqlab.training import Trainer;"
        f"m, t, c = build_run({run!r}); Trainer(m, t, c).resume({str(step3)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert done.returncode != 0
    assert "does not fit this model" in done.stderr, done.stderr[-2000:]


def test_two_nodes_over_loopback(text_file, tmp_path):
    """The multi-machine command (c10d rendezvous) with two 'nodes' of one process each on this machine."""
    args = [*_args(text_file, "test-gpt", 4, "--task.sampling=random"), "--out", str(tmp_path / "nodes")]
    _one_process([*_args(text_file, "test-gpt", 4, "--task.sampling=random"), "--out", str(tmp_path / "one")])
    endpoint = f"127.0.0.1:{_free_port()}"
    launcher = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "seqlab", *args]
    nodes = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=LAUNCH_TIMEOUT) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert _losses(tmp_path / "nodes") == pytest.approx(_losses(tmp_path / "one"), rel=1e-5, abs=1e-6)


def test_batch_rows_split_without_overlap():
    batch = {"x": torch.arange(12).view(4, 3), "y": torch.arange(4), "reset": torch.tensor(True)}
    parts = [distributed.shard_batch(batch, distributed.World(r, 2)) for r in range(2)]
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert [p["y"].tolist() for p in parts] == [[0, 1], [2, 3]]
    assert all(p["reset"] is batch["reset"] for p in parts)  # a flag is kept whole
    with pytest.raises(ValueError, match="4 rows cannot be split over 3 processes"):
        distributed.check_divisible(batch, distributed.World(0, 3))


def test_device_and_precision_errors(text_file, tmp_path, capsys):
    if not torch.cuda.is_available():
        assert main([*_args(text_file, "test-gpt", 2), "--device", "cuda", "--out", str(tmp_path / "c")]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    assert TrainConfig(device="cpu").autocast_dtype() is None  # fp32 on CPU
    with pytest.raises(ValueError, match=r"train\.strategy must be 'ddp' or 'fsdp'"):
        TrainConfig(strategy="zero3")


def test_fsdp_on_the_cpu_is_refused_where_torch_cannot_run_it(monkeypatch):
    """FSDP2 records events on its streams; the CPU's streams have no record_event before torch 2.7 (torch 2.6
    failed at the first forward, inside FSDP, with an AttributeError): said before anything is built."""

    class OldStream:  # torch 2.6's torch.cpu.Stream
        def wait_stream(self, stream) -> None:
            pass

    monkeypatch.setattr(torch.cpu, "Stream", OldStream)
    with pytest.raises(ValueError, match=r"train\.strategy='fsdp' on the CPU needs torch 2\.7 or later"):
        TrainConfig(strategy="fsdp", device="cpu")
    assert TrainConfig(strategy="ddp", device="cpu").strategy == "ddp"


def _gpus(monkeypatch, count: int) -> None:
    """This machine as torch would see it with ``count`` GPUs (no GPU is touched by what the tests call)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_each_cuda_rank_joins_the_group_with_its_own_gpu(monkeypatch):
    """nccl needs the rank's GPU by index (torch: "Please use a device_id with index", seen under torchrun on
    an H100 machine when the run's device was plain 'cuda'): rank 1 of 2 binds cuda:1."""
    _gpus(monkeypatch, 2)
    joined, current = {}, []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: joined.update(kw))
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    world = distributed.setup("ddp", torch.device("cuda"))
    assert (world.rank, world.size, world.local_rank) == (1, 2, 1)
    assert joined == {"backend": "nccl", "device_id": torch.device("cuda", 1)}
    assert current == [torch.device("cuda", 1)]  # the rank's default GPU before the group forms (not GPU 0)
    assert distributed.local_device(torch.device("cuda"), world) == torch.device("cuda", 1)
    assert distributed.local_device(torch.device("cuda", 0), world) == torch.device("cuda", 0)  # as named
    assert distributed.local_device(torch.device("cpu"), world) == torch.device("cpu")
    # FSDP in one process on CUDA (a group of one): the current GPU, by index
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    joined.clear()
    assert distributed.setup("fsdp", torch.device("cuda")).size == 1
    distributed.teardown()
    assert joined == {"backend": "nccl", "device_id": torch.device("cuda", 0)}


def test_more_cuda_ranks_on_a_machine_than_gpus_are_refused_by_name(monkeypatch, text_file, tmp_path, capsys):
    _gpus(monkeypatch, 1)
    with pytest.raises(
        ValueError, match=r"local rank 1 on this machine and takes GPU 1, but the machine has 1 GPU:"
    ):
        distributed.local_device(torch.device("cuda"), distributed.World(3, 4, 1))
    args = [*_args(text_file, "test-gpt", 2), "--device=cuda", "--out", str(tmp_path / "r"), "--nproc", "2"]
    assert main(args) == 2  # before torchrun starts
    err = capsys.readouterr().err
    assert (
        "--nproc 2 on CUDA takes one GPU per process: this machine has 1; train on the CPU with --device cpu"
        in err
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_autocast_is_bf16():
    assert TrainConfig(device="cuda").autocast_dtype() == torch.bfloat16
    assert TrainConfig(device="cuda", precision="fp32").autocast_dtype() is None


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_kill_under_nproc_saves_and_says_how_to_resume(text_file, tmp_path, signame):
    """Ctrl-C (or kill's SIGTERM) reaches `seqlab train --nproc 2`, which hands it to the training processes
    (not to torchrun): they finish the step, save, and stop together, none left running; the run then resumes."""
    import signal
    import time

    signum = getattr(signal, signame)

    out = tmp_path / "run"
    # SIGINT's default action in the launcher, as from a terminal
    proc = _endless_nproc_run(text_file, out, lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not (out / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)
    proc.send_signal(signum)
    _, err = _communicate(proc, out)
    assert proc.returncode == 128 + signum, err[-3000:]
    said = "Ctrl-C" if signum == signal.SIGINT else signame
    assert f"stopped by {said}; continue with the same command and --resume" in err
    assert (out / "latest").is_file()
    # no training process outlives the launcher (after a SIGTERM they ran on in the background, holding the run)
    from seqlab.training.manifest import lock_run, unlock_run

    unlock_run(lock_run(out))  # a RunInUseError while a rank still holds it


def test_ranks_draw_dropout_of_their_own_and_resume_their_own_streams():
    def draws(world, **restore):
        torch.manual_seed(3)  # every rank built the model from the same seed
        if restore:
            distributed.restore_cpu_rng(restore["state"], world, 3, restore["step"])
        else:
            distributed.seed_rank_streams(3, world)
        return torch.rand(4)

    one, r0, r1 = (
        draws(distributed.World(0, 1)),
        draws(distributed.World(0, 2)),
        draws(distributed.World(1, 2)),
    )
    assert torch.equal(r0, one)  # rank 0 keeps a single process's stream
    assert not torch.equal(r1, r0)  # before: identical masks on every rank
    states = [torch.manual_seed(s).get_state() for s in (10, 11)]
    saved = {"rng_cpu": states[0], "rng_cpu_ranks": states}
    resumed = [draws(distributed.World(r, 2), state=saved, step=5) for r in (0, 1)]
    assert torch.equal(resumed[1], torch.manual_seed(11) and torch.rand(4))  # each rank its own saved stream
    three = [draws(distributed.World(r, 3), state=saved, step=5) for r in range(3)]  # another world size
    assert torch.equal(three[0], resumed[0]) and len({tuple(t.tolist()) for t in three}) == 3


def test_a_one_process_fsdp_group_leaves_no_variables_behind(monkeypatch):
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    world = distributed.setup("fsdp", torch.device("cpu"))
    assert world.size == 1 and os.environ["WORLD_SIZE"] == "1"
    distributed.teardown()
    # a later `seqlab train --nproc 2` in this process launches instead of training as a world of one
    assert not {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"} & set(os.environ)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--nproc", "3"], r"task\.batch_size=4 cannot be split over --nproc 3"),  # the run's batch
        (["--nproc", "3", "DEFAULT_BATCH"], r"task\.batch_size=32 cannot be split over --nproc 3"),  # copy's
        (["--nproc", "2", "--train.strategy=zero"], r"train\.strategy must be 'ddp' or 'fsdp'"),
    ],
)
def test_nproc_refuses_before_launching_what_one_process_would(text_file, tmp_path, capsys, extra, match):
    import re

    args = [*_args(text_file, "test-gpt", 2), "--out", str(tmp_path / "r"), *extra]
    if "DEFAULT_BATCH" in extra:  # the task's own batch size, none given
        args = [
            "train",
            "--model.name=test-lm-gru",
            "--task.name=copy",
            "--out",
            str(tmp_path / "r"),
            *extra[:2],
        ]
    assert main(args) == 2
    err = capsys.readouterr()
    assert re.search(match, err.err) and "torchrun" not in err.out  # refused here, no process started


@pytest.mark.parametrize("delay", [0.0, 2.0])  # before torchrun starts the ranks; while they start up
def test_a_stop_before_the_first_checkpoint_does_not_advise_resume(text_file, tmp_path, delay):
    import signal
    import time

    from seqlab.training.checkpoint import holds_run

    out = tmp_path / "early"
    proc = _endless_nproc_run(text_file, out)
    assert proc.stdout.readline().startswith("torchrun")  # launched: the ranks are starting up
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = _communicate(proc, out)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    if holds_run(out):  # the ranks were already training: they saved
        assert "continue with the same command and --resume" in err
    else:
        assert "it saved no checkpoint yet, so there is nothing to resume: run the same command again" in err


def test_fsdp_shards_over_the_runs_device_also_where_a_gpu_is(monkeypatch):
    """torch's default FSDP mesh is the accelerator's, CUDA's wherever a GPU is: a CPU run under torchrun on a
    one-GPU H100 machine set rank 1 on GPU 1 ("invalid device ordinal"). Here torch reports CUDA as the machine's
    accelerator (nothing CUDA is touched): the mesh ``wrap`` shards over is the run's, the CPU."""
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    world = distributed.setup("fsdp", torch.device("cpu"))
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList([torch.nn.Linear(4, 4)]))
        distributed.wrap(model, world, "fsdp", torch.device("cpu"))
        meshes = {p.device_mesh.device_type for p in model.parameters()}  # FSDP2's parameters are DTensors
        assert meshes == {"cpu"}
        assert model[1][0](torch.ones(1, 4)).shape == (1, 4)  # a sharded block gathers and runs on the CPU
    finally:
        distributed.teardown()


def test_two_nproc_runs_on_one_machine_do_not_collide_on_a_port(text_file, tmp_path):
    """`--nproc` starts torchrun --standalone (a rendezvous on a free port): with 29500, torchrun's default,
    taken (another run, or xdist workers on a GPU machine: EADDRINUSE), the run still trains."""
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", 29500))
        except OSError:
            pytest.skip("port 29500 is in use on this machine already")
        taken.listen()
        _seqlab_nproc(
            [*_args(text_file, "test-gpt", 2, "--task.sampling=random"), "--out", str(tmp_path / "r")]
        )
    assert (tmp_path / "r" / "metrics.jsonl").exists()
