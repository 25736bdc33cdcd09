"""The kernel cache (seqlab.kernels.cache): a recorded library is imported without torch's build step (so a cache
that cannot be written still serves it), a library cut short is built again instead of crashing the process, and
a lock left by a killed build does not make the next process wait forever."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import time

import pytest
import torch

from seqlab.kernels import cache
from seqlab.kernels.layer_norm import EXTENSION

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A copy of the LayerNorm kernel's built folder in a cache of its own, and a fresh CppExtension on it."""
    assert EXTENSION.load() is not None
    library = EXTENSION.library()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    ext = copy.copy(EXTENSION)
    ext._loaded = {}
    shutil.copytree(library.parent, ext.library().parent)
    return ext, ext.library()


FILE_LOCKS = pytest.mark.skipif(  # torch 2.14 on: test_an_os_lock_is_waited_on_while_held_...
    cache.os_locks(), reason="this torch locks through the OS: a lock file alone blocks nothing"
)


def _works(module) -> bool:
    x, w = torch.randn(3, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    y = module.forward(x, w, None, 1e-5)[0]
    return torch.allclose(y, torch.nn.functional.layer_norm(x, (8,), w, None, 1e-5))


def test_a_recorded_library_is_imported_without_the_build_step(cached, monkeypatch):
    ext, library = cached
    assert cache.recorded(library, library.stem)

    def no_build(*args, **kwargs):
        raise AssertionError("torch's load (which takes a lock in the folder) was called")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_build)
    module = ext.load()
    assert module is not None and _works(module) and ext.build_info()["cached"]


def test_a_library_cut_short_is_built_again(cached, caplog):
    """...also in a process whose torch built this name before, elsewhere (a first build into an empty cache):
    torch then named the rebuild ``<name>_v1``, and the library the cache records was not the one built."""
    from torch.utils import cpp_extension
    from torch.utils._cpp_extension_versioner import Entry

    ext, library = cached
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 3])  # its ELF header intact: importing it would die of SIGBUS
    cpp_extension.JIT_EXTENSION_VERSIONER.entries[library.stem] = Entry(0, 12345)  # another folder's build
    module = ext.load()
    assert module is not None and _works(module)
    assert "not a library recorded as built there" in caplog.text
    assert cache.recorded(library, library.stem)


def test_a_library_cut_short_without_its_record_is_built_again_not_imported(cached, tmp_path):
    """A copy of the cache cut short after the library but before its record: importing it killed every later
    process with SIGBUS (ninja found it up to date). Loaded in a child process, so a regression fails the test
    instead of killing the test session."""
    import subprocess
    import sys

    _, library = cached
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 3])
    library.with_name(library.name + ".record.json").unlink()
    code = (
        "import torch; from seqlab.kernels.layer_norm import EXTENSION as E; m = E.load(); "
        "x = torch.randn(3, 8, dtype=torch.float64); w = torch.randn(8, dtype=torch.float64); "
        "print(torch.allclose(m.forward(x, w, None, 1e-5)[0], torch.nn.functional.layer_norm(x, (8,), w)))"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("True") and "its record is missing" in done.stderr
    assert cache.recorded(library, library.stem)


@FILE_LOCKS
def test_a_lock_left_by_a_killed_build_is_cleared(cached, caplog):
    ext, library = cached
    for path in library.parent.glob("*.record.json"):
        path.unlink()  # no record: torch's build step runs, and waits while a lock file exists
    lock = library.parent / "lock"
    lock.write_text("", encoding="utf-8")
    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago))
    signal.alarm(120)  # a wait on the lock would never end: fail instead
    try:
        module = ext.load()
    finally:
        signal.alarm(0)
    assert module is not None and _works(module)
    assert "left 3600 s ago by a build that is not running" in caplog.text


@FILE_LOCKS
def test_a_young_lock_is_waited_on_while_a_build_runs_and_cleared_once_none_does(cached, caplog, monkeypatch):
    """A lock younger than the 10 minutes is waited on only while some process works in the folder (ninja and
    the compiler run there): a build killed seconds in no longer makes the next process wait forever."""
    import subprocess

    ext, library = cached
    monkeypatch.setattr(cache, "LOCK_GRACE_SECONDS", 1.0)
    library.unlink()  # nothing recorded: this process must build, under the lock
    lock = library.parent / "lock"
    lock.write_text("", encoding="utf-8")
    builder = subprocess.Popen(["sleep", "3"], cwd=library.parent)  # "a build" working in the folder
    start = time.perf_counter()
    signal.alarm(120)
    try:
        module = ext.load()
    finally:
        signal.alarm(0)
        builder.kill()
        builder.wait()
    assert module is not None and _works(module) and not lock.exists()
    assert time.perf_counter() - start > 2.0  # it waited for the running "build"
    assert (
        "waiting for another process's build" in caplog.text and "a build that is not running" in caplog.text
    )


def test_an_os_lock_is_waited_on_while_held_and_its_file_left_alone(tmp_path, monkeypatch, caplog):
    """torch 2.14 locks a build folder with flock on a file that stays after every build: that file alone is no
    build (waited on, it made every rebuild wait out the grace and then say a build had died); a held lock is
    waited on until its holder lets go, here by being killed, which the OS sees to."""
    import subprocess
    import sys
    import threading

    monkeypatch.setattr(cache, "os_locks", lambda: True)  # as torch 2.14 on, whatever torch runs the tests
    lock = tmp_path / "lock"
    lock.write_text("", encoding="utf-8")
    start = time.perf_counter()
    cache.wait_for_build(tmp_path)  # a finished build's file
    assert time.perf_counter() - start < 0.5 and lock.exists() and "waiting" not in caplog.text
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, os, time; fd = os.open({str(lock)!r}, os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        threading.Timer(1.5, holder.kill).start()  # a build killed mid-way
        start = time.perf_counter()
        cache.wait_for_build(tmp_path, poll=0.1)
        assert time.perf_counter() - start > 1.2 and lock.exists()
        assert "waiting for another process's build" in caplog.text and "ends with that build" in caplog.text
    finally:
        holder.kill()
        holder.wait()


@FILE_LOCKS
def test_a_library_another_process_built_while_this_one_waited_is_loaded_as_cached(cached, monkeypatch):
    """After the wait, the library the other process built (and recorded) is imported, and reported cached."""
    import threading

    ext, library = cached
    folder = library.parent
    kept = folder.parent / "kept"
    shutil.move(folder, kept)
    folder.mkdir()
    lock = folder / "lock"
    lock.write_text("", encoding="utf-8")

    def the_other_build():
        time.sleep(1.0)
        for path in kept.iterdir():
            shutil.copy2(path, folder / path.name)
        lock.unlink()

    def no_build(*args, **kwargs):
        raise AssertionError("built again after another process had built it")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_build)
    other = threading.Thread(target=the_other_build)
    other.start()
    try:
        module = ext.load()
    finally:
        other.join()
    assert module is not None and _works(module) and ext.build_info()["cached"]


def test_a_backward_runs_the_kernel_its_forward_ran_after_the_kernels_are_switched_off(monkeypatch):
    from seqlab.kernels.activations import gelu_tanh
    from seqlab.kernels.attention import attention
    from seqlab.kernels.layer_norm import layer_norm

    x = torch.randn(4, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, dtype=torch.float64, requires_grad=True)
    q, k, v = (torch.randn(2, 2, 40, 16, requires_grad=True) for _ in range(3))
    outs = [layer_norm(x, w, None, 1e-5), gelu_tanh(x), attention(q, k, v, is_causal=True)]
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "all")
    for y in outs:
        y.sum().backward()  # AttributeError: 'NoneType' ... before
    assert x.grad is not None and w.grad is not None and q.grad is not None


def test_kernel_entry_points_on_empty_and_odd_inputs():
    from seqlab.kernels.activations import gelu_bias
    from seqlab.kernels.attention import why_not_kernel
    from seqlab.kernels.causal_conv import causal_conv_silu, causal_conv_silu_ref
    from seqlab.kernels.recurrent import recurrent_layer

    assert gelu_bias(torch.randn(3, 0), torch.randn(0)).shape == (3, 0)
    q, k = torch.randn(2, 2, 40, 16), torch.randn(1, 2, 40, 16)
    assert "one batch size" in why_not_kernel(q, k, k, None, 0.0, True)  # torch broadcasts it instead
    assert why_not_kernel(q[..., :0], k[..., :0].expand(2, -1, -1, -1), k[..., :0].expand(2, -1, -1, -1),
                          None, 0.0, True) == "empty sizes go to torch"  # fmt: skip
    x, state, weight = torch.randn(2, 5, 3), torch.randn(2, 3, 3), torch.randn(4, 3)
    bias = torch.randn(6)[::2]  # every other element: a view that is not contiguous
    torch.testing.assert_close(
        causal_conv_silu(x, state, weight, bias), causal_conv_silu_ref(x, state, weight, bias)
    )
    with pytest.raises(ValueError, match=r"bias must have x's dtype"):
        causal_conv_silu(x, state, weight, bias.double())
    with pytest.raises(ValueError, match=r"t >= 1 positions, got shape \(2, 0, 3\)"):
        causal_conv_silu(x[:, :0], state, weight, bias)
    gru = torch.nn.GRU(4, 6)
    with pytest.raises(ValueError, match=r"t >= 1 steps, got shape \(0, 2, 4\)"):
        recurrent_layer(
            torch.randn(0, 2, 4), torch.zeros(2, 6), gru.weight_ih_l0, gru.weight_hh_l0, None, None, "GRU"
        )


def test_the_scans_record_covers_the_header_it_includes(tmp_path, monkeypatch):
    from seqlab.kernels import build

    for name in ("selective_scan.cpp", "vec_math.h"):
        shutil.copy(build.SOURCE.with_name(name), tmp_path / name)
    monkeypatch.setattr(build, "SOURCE", tmp_path / "selective_scan.cpp")
    before, name = build.sources_digest(["-O3"]), build._build_name_and_flags()[0]
    (tmp_path / "vec_math.h").write_text((tmp_path / "vec_math.h").read_text() + "\n// edited\n")
    assert build.sources_digest(["-O3"]) != before  # an old library is not imported for a changed header
    # and the edited sources build under a name of their own: two seqlab versions do not rebuild over each other
    assert build._build_name_and_flags()[0] != name


def test_every_kernel_builds_once_per_python_and_torch(monkeypatch):
    """A library built against one torch imports into no other ("undefined symbol"): the pybind kernels' cache
    folders were named by source and flags only, so a second environment sharing the cache (another torch in
    another venv) found the first one's library and fell back to torch with a warning, never rebuilding."""
    import sys
    from collections import namedtuple

    from seqlab.kernels import build

    names = lambda: (EXTENSION.name_and_flags()[0], build._build_name_and_flags()[0])  # noqa: E731
    here = names()
    assert all(f"py{sys.version_info.major}{sys.version_info.minor}_torch" in n for n in here)
    monkeypatch.setattr(torch, "__version__", "9.8.7+cu130")
    other_torch = names()
    assert all("_torch9_8_7_" in n for n in other_torch) and set(other_torch).isdisjoint(here)
    monkeypatch.setattr(sys, "version_info", namedtuple("V", "major minor")(3, 99))
    assert all("_py399_torch9_8_7_" in n for n in names()) and set(names()).isdisjoint(other_torch)


def test_the_scan_builds_in_an_empty_cache_and_a_later_process_loads_it_as_recorded(tmp_path):
    """The selective scan's loader (kernels/build.py), end to end in child processes on a cache of its own."""
    import json
    import subprocess
    import sys

    code = (
        "import json; from seqlab.kernels import build; ok = build.load_kernel(); i = build.build_info(); "
        "print(json.dumps({'ok': ok, 'cached': i.cached, 'reason': i.reason}))"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0] == {"ok": True, "cached": False, "reason": None}  # built here
    assert runs[1] == {"ok": True, "cached": True, "reason": None}  # imported as recorded
