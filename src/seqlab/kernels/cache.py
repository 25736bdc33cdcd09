"""The kernel cache's own checks: a built library is recorded (its size and SHA-256 beside it), so that a later
process can import it without writing to the cache (a read-only cache, a container image) and a damaged one (a
copy cut short, a disk that filled, a library whose record is missing) is rebuilt instead of crashing the
process (a truncated shared object kills it with SIGBUS on import); a build lock that a killed build left behind
is cleared instead of hanging every later process (torch 2.14 on locks through the OS, which lets go of a killed
build's lock itself: there a lock is waited on while held, and its file, which stays, is left alone).

Both loaders use these: ``extension.CppExtension`` (the pybind kernels) and ``build`` (the selective scan's
operator library), each naming a build by a digest of its sources and flags, so a recorded library is up to
date."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path

__all__ = [
    "LOCK_GRACE_SECONDS",
    "STALE_LOCK_SECONDS",
    "discard_damaged",
    "os_locks",
    "ready_after_wait",
    "record",
    "recorded",
    "wait_for_build",
]

log = logging.getLogger("seqlab.kernels")

# a first build takes seconds to a minute or two; a lock older than this is a dead build's
STALE_LOCK_SECONDS = 600
# where /proc shows that no process works in the build folder (ninja and the compiler run there), a lock older
# than this is a dead build's (the grace covers the moments before ninja starts and after it ends)
LOCK_GRACE_SECONDS = 30


def _record_path(library: Path) -> Path:
    return library.with_name(library.name + ".record.json")


def _digest(library: Path) -> dict:
    data = library.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def record(library: Path, sources: str) -> None:
    """Write ``library``'s record after it was built (or found up to date) and imported: its size and SHA-256,
    and ``sources`` (a digest of the sources and flags it was built from). A cache that cannot be written keeps
    no record (nothing else changes)."""
    with contextlib.suppress(OSError):
        _record_path(library).write_text(
            json.dumps({**_digest(library), "sources": sources}), encoding="utf-8"
        )


def recorded(library: Path, sources: str) -> bool | None:
    """True when ``library`` is the file its record describes, built from ``sources``: it can be imported as it
    is. None when there is no library. False otherwise: a library that differs from its record, or has no
    record of these sources (a copy cut short before its record, a build killed before it wrote one), is not
    trusted, since importing a truncated one kills the process (SIGBUS); it is built again."""
    path = _record_path(library)
    if not library.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("sources") != sources:
            return False
        return {k: saved.get(k) for k in ("bytes", "sha256")} == _digest(library)
    except (OSError, ValueError, AttributeError):
        return False


def discard_damaged(library: Path) -> None:
    """Remove ``library`` and its record, which :func:`recorded` found untrustworthy, with a warning, so that the
    build tool makes it again instead of importing a damaged file (a read-only cache keeps them: the build then
    fails there, and the kernel's PyTorch path runs)."""
    log.warning(
        "%s is not a library recorded as built there (cut short, changed, or its record is missing): building "
        "it again",
        library,
    )
    for path in (library, _record_path(library)):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _builder_running(folder: Path) -> bool | None:
    """True when a process works in ``folder`` (torch runs ninja, and ninja the compiler, there), False when
    none does, None when /proc cannot tell (another OS, or other users' processes hidden)."""
    try:
        target, seen = folder.resolve(), False
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    cwd = Path(os.readlink(f"/proc/{entry.name}/cwd"))
                    seen = True  # a process whose folder this one may read
                    if cwd == target:
                        return True
        return False if seen else None
    except OSError:
        return None


def os_locks() -> bool:
    """Whether this torch locks a build folder with an OS lock on its ``lock`` file (``filelock``, torch 2.14 on:
    the file stays after a build, and the OS lets go of a killed builder's lock) rather than by the file's mere
    existence (``FileBaton``, before: a killed build's file blocks every later build until it is removed)."""
    from torch.utils import cpp_extension

    return hasattr(cpp_extension, "FileLock")


def _held(lock: Path) -> bool:
    """Whether a process holds the OS lock on ``lock`` (False when there is no such file)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no flock to ask
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:  # BlockingIOError: another process's build holds it
        return True
    finally:
        os.close(fd)


def wait_for_build(folder: Path, poll: float = 0.5) -> None:
    """Wait while another process builds in ``folder`` (it holds torch's ``lock`` there), said once. Where torch
    locks through the OS (:func:`os_locks`), while that lock is held; else a lock file that no build holds any
    more is removed with a warning instead of waiting forever, as torch's own wait would: one older than
    ``LOCK_GRACE_SECONDS`` when no process works in the folder, else one older than ``STALE_LOCK_SECONDS``."""
    lock, said, os_lock = folder / "lock", False, os_locks()
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            return  # no lock: nobody is building
        if os_lock:
            if not _held(lock):
                return  # a finished (or killed) build's file: no process holds the OS lock on it
        elif age > STALE_LOCK_SECONDS or (age > LOCK_GRACE_SECONDS and _builder_running(folder) is False):
            log.warning("removing %s, left %.0f s ago by a build that is not running", lock, age)
            lock.unlink(missing_ok=True)
            return
        if not said:
            then = "it ends with that build" if os_lock else f"if none is running, delete {lock}"
            log.warning("waiting for another process's build in %s (%s)", folder, then)
            said = True
        time.sleep(poll)


def ready_after_wait(library: Path, sources: str) -> bool:
    """What both loaders do before building: wait for another process's build in the library's folder
    (:func:`wait_for_build`); True when that left ``library`` recorded (import it as it is), else False, after
    discarding a library :func:`recorded` does not trust (the caller builds)."""
    wait_for_build(library.parent)
    state = recorded(library, sources)
    if state is False:
        discard_damaged(library)
    return bool(state)
