"""Text that a command prints must reach the user even when the terminal's encoding cannot show all of it.

A sample, a translation or a transcript may hold characters that stdout's encoding lacks (``PYTHONIOENCODING=ascii``,
a latin-1 or cp1252 console). Printing would raise ``UnicodeEncodeError`` and lose the result that took the
model its time. :func:`escape_unencodable` makes stdout write such characters as ``\\xf6``/``\\u2014`` escapes
instead, and :func:`escapes_note` says afterwards, once, that it happened and how to get the characters.
:func:`say` puts a closing line (an error) on a line of its own, below any progress bar still drawn, and
:func:`said_if_slow` says what a long silent step is doing once it has taken a few seconds, and
:func:`out_of_memory` turns a failed allocation into one line that says what to lower.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import sys
import threading
import time

__all__ = ["escape_unencodable", "escapes_note", "out_of_memory", "said_if_slow", "say"]

_HANDLER = "seqlab-escape"
_escaped: list[int] = [0]  # characters escaped so far in this process


def _escape(error: UnicodeError):
    if not isinstance(error, UnicodeEncodeError):
        raise error
    _escaped[0] += error.end - error.start
    return codecs.backslashreplace_errors(error)


def escape_unencodable(stream=None) -> None:
    """Make ``stream`` (stdout by default) escape what its encoding cannot write, instead of raising; the
    count that :func:`escapes_note` reports starts again from zero."""
    stream = sys.stdout if stream is None else stream
    _escaped[0] = 0
    try:
        codecs.lookup_error(_HANDLER)
    except LookupError:
        codecs.register_error(_HANDLER, _escape)
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors=_HANDLER)


def escapes_note() -> str | None:
    """One line saying how many characters stdout could not show, or None when it showed them all."""
    if not _escaped[0]:
        return None
    encoding = getattr(sys.stdout, "encoding", None) or "unknown"
    return (
        f"note: {_escaped[0]} character(s) of the output are written as \\x/\\u escapes: stdout's encoding "
        f"({encoding}) cannot show them; run with PYTHONIOENCODING=utf-8 (or a UTF-8 terminal) to see them"
    )


def say(line: str) -> None:
    """Print ``line`` on stderr below any tqdm progress bar still open (a run stopped by an error leaves its bar
    mid-line, and the error was printed at its end)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or ()):
        bar.close()  # ends the bar's line
    print(line, file=sys.stderr)


@contextlib.contextmanager
def said_if_slow(what: str, after: float = 5.0):
    """Around a step that is quick on small data and can take minutes on large (reading and encoding a corpus):
    when it is still running ``after`` seconds in, ``what`` is said on stderr, and its time once it ends."""
    start, said = time.perf_counter(), threading.Event()

    def notice() -> None:
        print(f"{what} ...", file=sys.stderr, flush=True)
        said.set()

    timer = threading.Timer(after, notice)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # a notice on its way is out before the line that closes it
        if said.is_set():
            print(f"{what}: done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def out_of_memory(error: BaseException) -> str | None:
    """The ``error:`` line for an allocation that failed (torch's CPU allocator raises a plain RuntimeError, CUDA
    an OutOfMemoryError, Python a MemoryError), or None for any other error."""
    text = str(error)
    if not (
        isinstance(error, MemoryError)
        or type(error).__name__ == "OutOfMemoryError"
        or "can't allocate memory" in text
    ):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)  # torch's CPU allocator
    numpy = re.search(r"Unable to allocate ([\d.]+ \w+) for an array", text)  # numpy's MemoryError
    size = f"{int(asked.group(1)) / 1e9:,.1f} GB" if asked else numpy.group(1) if numpy else "some memory"
    return (
        f"error: out of memory (an allocation of {size} failed); less data held at once (task.batch_size, n_train, "
        "image or frame sizes), shorter sequences or a smaller model need less (`seqlab params` counts a model's "
        "parameters)"
    )
