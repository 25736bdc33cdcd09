"""What seqlab wrote into a run directory, and whether it is still the bytes it wrote.

``RUN/checkpoints/manifest.json`` names every checkpoint directory seqlab wrote into the run, with the sha256
and size of each of its files::

    {"format": 1,
     "checkpoints": {"step-00000010": {"step": 10,
                                       "files": {"model.safetensors": {"sha256": "9f2c…", "bytes": 68312},
                                                 "config.json": {...}, ...}},
                     ...}}

Guarantees:

- seqlab deletes only what it wrote. Pruning removes only directories the manifest names; the cleanup at the
  start of a run (:func:`remove_leftovers`) removes only seqlab's own temporary names (``.tmp-step-*`` and
  ``.old-step-*`` directories in ``checkpoints/``, the ``.NAME.tmp-*`` files of an interrupted
  :func:`write_text_atomic` of ``latest``, ``metrics.jsonl`` or the manifest). Anything else a user keeps in
  the run directory is never touched.
- Every file here is replaced atomically (:func:`write_text_atomic`), so a process killed at any moment
  leaves the old or the new manifest, never half of one.
- A checkpoint the manifest names is verified file by file against it (:func:`verify`): a file that is
  missing, truncated or overwritten raises :class:`CorruptCheckpointError` (a ValueError) naming it. A checkpoint the
  manifest does not name (written by seqlab 0.1, or copied out of its run directory) has nothing to be
  verified against and loads as it is (a warning in a run's ``checkpoints/``, debug level elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("seqlab.train")

MANIFEST = "manifest.json"
FORMAT = 1

# seqlab's own temporary names: the only things the start-of-run cleanup removes
_LEFTOVER_DIRS = re.compile(r"\.tmp-step-\d+-[A-Za-z0-9_]+|\.old-step-\d+")
_ATOMIC_TEMP = r"\.{}\.tmp-[A-Za-z0-9_]+"
_LEFTOVER_FILES = {
    "run": re.compile("|".join(_ATOMIC_TEMP.format(re.escape(n)) for n in ("latest", "metrics.jsonl"))),
    "checkpoints": re.compile(_ATOMIC_TEMP.format(re.escape(MANIFEST))),
}


class CorruptCheckpointError(ValueError):
    """A file of a checkpoint is missing or differs from what the manifest recorded when seqlab wrote it."""


# ---- atomic files -----------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (renames, new files) to disk, where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new file, never half of one.

    It goes through ``.NAME.tmp-XXXX`` beside it, flushed to disk and renamed over ``path``. The file gets the
    permissions a plain ``open(path, "w")`` would give it (0666 less the umask), not the 0600 of the
    temporary file.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


# ---- checksums and the manifest ---------------------------------------------------------------------------


def file_digest(path: Path) -> dict[str, Any]:
    """``{"sha256": hex digest, "bytes": size}`` of one file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def digest_dir(path: Path) -> dict[str, dict[str, Any]]:
    """The digest of every file of a checkpoint directory, by file name."""
    return {f.name: file_digest(f) for f in sorted(path.iterdir()) if f.is_file()}


def read_manifest(ckpt_root: Path) -> dict[str, dict[str, Any]]:
    """The checkpoints ``ckpt_root/manifest.json`` names ({} when there is none); a ValueError when the file
    is not a manifest seqlab wrote (it is never overwritten then, so its record is not lost)."""
    file = Path(ckpt_root) / MANIFEST
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        entries = data["checkpoints"]
        if data["format"] != FORMAT or not all(isinstance(e["files"], dict) for e in entries.values()):
            raise ValueError
        return entries
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise ValueError(
            f"{file} is not a seqlab checkpoint manifest (format {FORMAT}); it records which checkpoints seqlab "
            f"wrote: restore it, or move the run's checkpoints/ away and start afresh"
        ) from None


def write_manifest(ckpt_root: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Replace ``ckpt_root/manifest.json`` atomically with ``entries``, ordered by step."""
    ordered = dict(sorted(entries.items(), key=lambda kv: kv[1]["step"]))
    text = json.dumps({"format": FORMAT, "checkpoints": ordered}, indent=1, allow_nan=False)
    write_text_atomic(Path(ckpt_root) / MANIFEST, text + "\n")


def damaged(file: Path, said: str) -> ValueError:
    """The error for a checkpoint file that cannot be read (``said``: how): damaged, or gone with its folder
    (:func:`check_still_there`)."""
    if not file.parent.is_dir():
        return _gone(file.parent)
    return ValueError(f"{file} {said}; the checkpoint is damaged")


def no_checkpoint(path: Path) -> FileNotFoundError:
    """The error for a checkpoint or run path that is not there; a checkpoint's may have been pruned by its run."""
    pruned = path.parent.name == "checkpoints"
    hint = " (a run still training keeps its newest only: give the run's folder)" if pruned else ""
    return FileNotFoundError(f"no such checkpoint or run directory: {path}{hint}")


def check_still_there(ckpt_dir: Path) -> None:
    """A CorruptCheckpointError that says so when ``ckpt_dir`` is gone: a run still training removed it (it keeps
    its newest checkpoints only) between the moment a command found it and the moment it read it."""
    if not Path(ckpt_dir).is_dir():
        raise _gone(ckpt_dir)


def _gone(ckpt_dir: Path) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{ckpt_dir} was removed while it was being read: its run is still training and keeps only its "
        "newest checkpoints (train.keep_checkpoints); run the command again to read the newest one, or "
        "copy a checkpoint folder out of the run to read it at leisure"
    )


def verify(ckpt_dir: Path, names: tuple[str, ...] | None = None) -> bool:
    """Check the files ``names`` (default: every file recorded) of a checkpoint against its run's manifest.

    Returns True when verified, False when the manifest does not name this checkpoint (nothing to check);
    raises :class:`CorruptCheckpointError` naming the first file that is missing or differs.
    """
    ckpt_dir = Path(ckpt_dir)
    entry = read_manifest(ckpt_dir.parent).get(ckpt_dir.name)
    if entry is None:
        check_still_there(ckpt_dir)  # pruned by its training run since it was found
        _say_unverified(ckpt_dir)
        return False
    for name in names if names is not None else tuple(entry["files"]):
        file = ckpt_dir / name
        if name not in entry["files"]:
            continue  # optional files (tokenizer.json, trainer state) the checkpoint was written without
        if not file.is_file():
            check_still_there(ckpt_dir)
            raise CorruptCheckpointError(f"{file} is missing; {ckpt_dir.parent / MANIFEST} records it")
        if file_digest(file) != entry["files"][name]:
            raise CorruptCheckpointError(
                f"{file} does not match the sha256 recorded in {ckpt_dir.parent / MANIFEST}: it changed "
                f"after seqlab wrote it (overwritten, truncated or corrupted on disk)"
            )
    return True


_SAID_UNVERIFIED: set[Path] = set()


def _say_unverified(ckpt_dir: Path) -> None:
    """Say once per process that ``ckpt_dir`` loads without a checksum: a warning where it sits in a run's
    ``checkpoints/`` (whose manifest was deleted or edited, or a run of seqlab 0.1, which wrote none), at debug
    level for a checkpoint copied out of its run (nothing there could record it)."""
    key = ckpt_dir.resolve()
    if key in _SAID_UNVERIFIED:
        return
    _SAID_UNVERIFIED.add(key)
    if ckpt_dir.parent.name != "checkpoints":
        log.debug("%s is outside a run's checkpoints/: no manifest, no checksum to verify", ckpt_dir)
        return
    file = ckpt_dir.parent / MANIFEST
    why = f"{file} does not name it" if file.is_file() else f"there is no {file}"
    log.warning(
        "%s loads without checking its files' sha256: %s (seqlab 0.1 wrote no manifest; a deleted or edited "
        "manifest loses the check)",
        ckpt_dir,
        why,
    )


def remove_leftovers(run_dir: Path) -> list[str]:
    """Remove what an interrupted save left behind in ``run_dir``: seqlab's own temporary names only.

    Returns the removed paths, relative to ``run_dir``.
    """
    run_dir, removed = Path(run_dir), []
    for where, files in (
        (run_dir, _LEFTOVER_FILES["run"]),
        (run_dir / "checkpoints", _LEFTOVER_FILES["checkpoints"]),
    ):
        if not where.is_dir():
            continue
        for p in sorted(where.iterdir()):
            if where != run_dir and p.is_dir() and not p.is_symlink() and _LEFTOVER_DIRS.fullmatch(p.name):
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_file() and not p.is_symlink() and files.fullmatch(p.name):
                p.unlink(missing_ok=True)
            else:
                continue
            removed.append(str(p.relative_to(run_dir)))
    if removed:
        log.info("removed what an interrupted run left in %s: %s", run_dir, ", ".join(removed))
    return removed


# ---- metrics.jsonl ----------------------------------------------------------------------------------------


def finite_or_none(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` with every non-finite float (NaN, ±inf) replaced by None, JSON's null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in rec.items()}


def _parse_record(raw: bytes) -> dict[str, Any] | None:
    """One ``metrics.jsonl`` line as a record, or None when it is not one (torn by a kill, or garbage)."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    ok = isinstance(rec, dict) and isinstance(rec.get("step"), int) and not isinstance(rec["step"], bool)
    return rec if ok else None


def cut_metrics(file: Path, step: int) -> list[dict[str, Any]]:
    """Cut a ``metrics.jsonl`` back to ``step`` (atomically) and return the records kept.

    Records of later steps (written by an interrupted run after its checkpoint) and lines that are not
    records go, with a warning: a last line torn by a kill; other unreadable lines (not seqlab's writing) after a
    copy of the file as it was, ``metrics.jsonl.unreadable-N``. The kept lines stay byte for byte.
    """
    if not file.is_file():
        return []
    kept, lines, unreadable = [], [], []
    raws = [raw for raw in file.read_bytes().splitlines() if raw.strip()]
    for i, raw in enumerate(raws):
        rec = _parse_record(raw)
        if rec is None:
            unreadable.append(i)
        elif rec["step"] <= step:
            kept.append(rec)
            lines.append(raw.decode("utf-8") + "\n")
    if unreadable == [len(raws) - 1]:  # seqlab only appends: a kill can tear the last line, no other
        log.warning("%s: dropped its last line, torn by an interrupted write", file)
    elif unreadable:
        aside = _free_name(file, "unreadable")
        shutil.copy2(file, aside)
        log.warning(
            "%s: %d line(s) are not seqlab records (line %s; not a torn write, which leaves only the last line "
            "unreadable): left out of the run's metrics; the file as it was is kept as %s",
            file,
            len(unreadable),
            ", ".join(str(i + 1) for i in unreadable[:5]) + (", ..." if len(unreadable) > 5 else ""),
            aside.name,
        )
    write_text_atomic(file, "".join(lines))
    return kept


def _free_name(file: Path, tag: str) -> Path:
    """``FILE.TAG-N`` beside ``file``, the first N for which nothing exists (nothing is overwritten)."""
    n = 1
    while (aside := file.with_name(f"{file.name}.{tag}-{n}")).exists():
        n += 1
    return aside


def set_aside(file: Path) -> Path | None:
    """Move ``file`` (an earlier run's metrics, or its TensorBoard folder) to ``FILE.stale-N``, the first free N,
    with a warning; returns where it went (None when there was none). Nothing is deleted."""
    if not file.exists():
        return None
    aside = _free_name(file, "stale")
    file.rename(aside)
    log.warning("%s is from an earlier run; this fresh start moved it to %s", file, aside.name)
    return aside


class RunInUseError(ValueError):
    """Another process is training into the same run directory."""


def lock_run(run_dir: Path) -> int:
    """An exclusive lock on ``run_dir/.lock`` for this process (released by :func:`unlock_run` or when the
    process ends, however it ends): two trainings writing one run directory would set each other's metrics
    aside, interleave their checkpoints in one manifest and prune each other's. Returns the lock's descriptor;
    a RunInUseError naming the holder's process id when another process holds it."""
    import fcntl

    path = Path(run_dir) / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise RunInUseError(
            f"{run_dir} is in use by another seqlab training (process {holder}); wait for it to finish, or "
            "choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def unlock_run(fd: int | None) -> None:
    """Release a lock taken by :func:`lock_run` (the file stays; it holds nothing but the last holder's pid)."""
    if fd is not None:
        os.close(fd)


def holds_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a run's checkpoints: a ``latest`` file or a checkpoint manifest (``latest``
    alone is not enough: a user may delete it, a copy leave it out, a kill come before it is first written;
    a fresh run there would then re-save, and prune, the checkpoints the manifest lists); a manifest that names
    only checkpoints that are not there (a kill during a run's first save) is not a run."""
    run_dir = Path(run_dir)
    if (run_dir / "latest").is_file():
        return True
    ckpt_root = run_dir / "checkpoints"
    if not (ckpt_root / MANIFEST).is_file():
        return False
    try:  # a manifest whose every entry is missing (a kill during the first save) holds nothing to lose
        return any((ckpt_root / name).is_dir() for name in read_manifest(ckpt_root))
    except ValueError:  # unreadable: treated as a run, never overwritten
        return True
