"""The kernel cache's own checks: a built library is recorded (its size and SHA-256 beside it), so that a later
process can import it without writing to the cache (a read-only cache, a container image) and a damaged one (a
copy cut short, a disk that filled) is rebuilt instead of crashing the process (a truncated shared object kills
it with SIGBUS on import); a build lock that a killed build left behind is cleared instead of hanging every
later process.

Both loaders use these: ``extension.CppExtension`` (the pybind kernels) and ``build`` (the selective scan's
operator library), each naming a build by a digest of its sources and flags, so a recorded library is up to
date."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from pathlib import Path

__all__ = ["STALE_LOCK_SECONDS", "clear_stale_lock", "discard_damaged", "record", "recorded"]

log = logging.getLogger("seqlab.kernels")

# a first build takes seconds to a minute or two; a lock older than this is a dead build's
STALE_LOCK_SECONDS = 600


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
    is. False when it differs from its record (damaged); None when there is no library or no record, or the
    record is of other sources (then the build tool decides)."""
    path = _record_path(library)
    if not (library.is_file() and path.is_file()):
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("sources") != sources:
            return None
        return {k: saved.get(k) for k in ("bytes", "sha256")} == _digest(library)
    except (OSError, ValueError, AttributeError):
        return False


def discard_damaged(library: Path) -> None:
    """Remove ``library`` and its record, which :func:`recorded` found to differ (damaged), with a warning, so that
    the build tool makes it again instead of importing a damaged file."""
    log.warning(
        "%s is not the library that was built there (cut short or changed): building it again", library
    )
    for path in (library, _record_path(library)):
        path.unlink(missing_ok=True)


def clear_stale_lock(folder: Path) -> None:
    """torch's build takes a ``lock`` file in the build folder and waits while one exists; a build that was
    killed leaves it behind, and every later process would wait forever. A lock older than
    ``STALE_LOCK_SECONDS`` is removed, with a warning; a younger one is another process's build, said once."""
    lock = folder / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return
    if age > STALE_LOCK_SECONDS:
        log.warning("removing %s, left %.0f minutes ago by a build that did not finish", lock, age / 60)
        lock.unlink(missing_ok=True)
    else:
        log.warning("waiting for another process's build in %s (if none is running, delete %s)", folder, lock)
