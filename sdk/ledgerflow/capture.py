"""Per-attempt output: what a task writes to stdout, stderr and ``logging``, kept per attempt.

:func:`install` puts a router in front of ``sys.stdout`` and ``sys.stderr``
and a handler on the root logger, once per process. While an attempt runs
(:func:`attempt`, entered by :func:`ledgerflow.executor.execute` in whatever
thread or process runs it), writes made in that attempt's context go to its
:class:`AttemptOutput` instead of the terminal, so output is attributed to
the task that wrote it even when threads run several tasks at once. Writes
outside an attempt pass through unchanged. Output of threads a task starts
itself (which do not inherit the context) is not captured.

Each attempt keeps at most ``cap`` characters (``LEDGERFLOW_LOG_CAP``,
default 64 KiB): the first and the last half, with how much was dropped in
between. With ``echo``, lines also go to the real stderr as they are written,
prefixed with the task key.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any, TextIO

DEFAULT_CAP = 64 * 1024


def default_cap() -> int:
    """The per-attempt cap in characters (``LEDGERFLOW_LOG_CAP``, read when capture is
    installed in a process)."""
    try:
        return max(256, int(os.environ.get("LEDGERFLOW_LOG_CAP", DEFAULT_CAP)))
    except ValueError:
        return DEFAULT_CAP


_cap = DEFAULT_CAP


_NONE: list[str] = []            # shared, never written: an attempt's head before it wrote
_NO_TAIL: deque[str] = deque()
_first_write = threading.Lock()


class AttemptOutput:
    """The captured output of one attempt: head and tail within a cap."""

    __slots__ = ("_lock", "dropped", "echo", "half", "head", "key", "partial", "size", "tail",
                 "tail_size")

    def __init__(self, key: str, *, cap: int | None = None, echo: bool = False) -> None:
        self.key = key
        self.half = (cap or _cap) // 2
        #: the buffers and their lock are made on the first write (most attempts write
        #: nothing): ``head`` is falsy until something was kept
        self.head: list[str] = _NONE
        self.size = 0                       # characters kept in head
        self.tail: deque[str] = _NO_TAIL
        self.tail_size = 0
        self.dropped = 0
        self.echo = echo
        self.partial = ""
        self._lock: threading.Lock | None = None

    def _buffers(self) -> threading.Lock:
        """Make the buffers and the lock, once (the first write)."""
        with _first_write:
            if self._lock is None:
                self.head = []
                self.tail = deque()
                self._lock = threading.Lock()
            return self._lock

    def write(self, text: str) -> None:
        """Add ``text`` (thread-safe)."""
        if not text:
            return
        with self._lock or self._buffers():
            room = self.half - self.size
            if room > 0:
                self.head.append(text[:room])
                self.size += min(room, len(text))
                text = text[room:]
            if text:
                self.tail.append(text)
                self.tail_size += len(text)
                while self.tail_size > self.half and self.tail:
                    extra = self.tail_size - self.half
                    first = self.tail[0]
                    if len(first) <= extra:
                        self.tail.popleft()
                        self.tail_size -= len(first)
                        self.dropped += len(first)
                    else:
                        self.tail[0] = first[extra:]
                        self.tail_size -= extra
                        self.dropped += extra

    def text(self) -> str:
        """Everything kept, with a marker where the middle was dropped."""
        if not self.head or self._lock is None:
            return ""
        with self._lock:
            head = "".join(self.head)
            tail = "".join(self.tail)
            if self.dropped:
                return (head + f"\n[... {self.dropped} characters dropped by ledgerflow "
                        f"(LEDGERFLOW_LOG_CAP) ...]\n" + tail)
            return head + tail


_current: contextvars.ContextVar[AttemptOutput | None] = contextvars.ContextVar(
    "ledgerflow_output", default=None)
_echo_to: list[TextIO] = []       # the real stderr, for echoed lines


def current() -> AttemptOutput | None:
    """The output of the attempt running in this context, if any."""
    return _current.get()


class _Router(io.TextIOBase):
    """``sys.stdout``/``sys.stderr``: to the running attempt's output, else through."""

    def __init__(self, original: TextIO) -> None:
        self.original = original
        self._partial: dict[int, str] = {}

    def write(self, s: str) -> int:
        if not isinstance(s, str):      # a caller that writes bytes to a text stream
            s = bytes(s).decode("utf-8", "replace")
        out = _current.get()
        if out is None:
            return self.original.write(s)
        out.write(s)
        if out.echo and _echo_to:
            _echo_lines(out, s)
        return len(s)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.original.flush()

    def fileno(self) -> int:
        return self.original.fileno()

    def isatty(self) -> bool:
        return self.original.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.original, "encoding", "utf-8")

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def real(stream: TextIO) -> TextIO:
    """The stream behind a router (what ledgerflow itself prints to: never captured)."""
    return stream.original if isinstance(stream, _Router) else stream


def _echo_lines(out: AttemptOutput, s: str) -> None:
    text = out.partial + s
    lines = text.split("\n")
    out.partial = lines.pop()
    if lines:
        target = _echo_to[0]
        with contextlib.suppress(Exception):
            target.write("".join(f"[{out.key}] {line}\n" for line in lines))
            target.flush()


class _Handler(logging.Handler):
    """Root handler: a record logged inside an attempt goes to the attempt's output."""

    def emit(self, record: logging.LogRecord) -> None:
        out = _current.get()
        if out is None:
            root = logging.getLogger()
            if all(h is self for h in root.handlers) and record.levelno >= logging.WARNING \
                    and logging.lastResort is not None:
                logging.lastResort.handle(record)     # as if no handler were installed
            return
        try:
            text = self.format(record) + "\n"
        except Exception:   # a broken record must not break the task
            return
        out.write(text)
        if out.echo and _echo_to:
            _echo_lines(out, text)


_install_lock = threading.Lock()
_root = logging.getLogger()
_handler = _Handler()
_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))


def install() -> None:
    """Route stdout, stderr and logging through the capture (idempotent, cheap)."""
    global _cap
    if type(sys.stdout) is _Router and type(sys.stderr) is _Router \
            and _handler in _root.handlers:
        return
    with _install_lock:
        _cap = default_cap()
        if type(sys.stderr) is not _Router:
            _echo_to[:] = [sys.stderr]
            sys.stderr = _Router(sys.stderr)
        if type(sys.stdout) is not _Router:
            sys.stdout = _Router(sys.stdout)
        root = logging.getLogger()
        if _handler not in root.handlers:
            root.addHandler(_handler)


def start(key: str, *, echo: bool = False, cap: int | None = None
          ) -> tuple[AttemptOutput, contextvars.Token[AttemptOutput | None]]:
    """Begin capturing the output of task ``key`` in this context (see :func:`stop`)."""
    install()
    out = AttemptOutput(key, cap=cap, echo=echo)
    return out, _current.set(out)


def stop(out: AttemptOutput, token: contextvars.Token[AttemptOutput | None]) -> None:
    """End the capture :func:`start` began."""
    _current.reset(token)
    if out.echo and out.partial and _echo_to:
        _echo_lines(out, "\n")


@contextlib.contextmanager
def attempt(key: str, *, echo: bool = False, cap: int | None = None
            ) -> Iterator[AttemptOutput]:
    """Capture what the code in this block writes, as the output of task ``key``."""
    out, token = start(key, echo=echo, cap=cap)
    try:
        yield out
    finally:
        stop(out, token)
