"""The errors a program task raises: failed, hit a limit, sandbox not available."""

from __future__ import annotations

from typing import Any

from ..errors import NonRetryableError

__all__ = ["LimitExceeded", "ProgramError", "SandboxUnavailable", "UnsafeArgument"]


class ProgramError(Exception):
    """The program failed: an exit code not in ``ok_codes``, a signal, a missing output.

    Retried by the task's policy (``retries``, ``retry_on``).
    """

    def __init__(self, message: str, exit_code: int | None = None,
                 signal_name: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.signal = signal_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.exit_code, self.signal))


class LimitExceeded(ProgramError):
    """The program hit one of its :class:`Limits`; ``limit`` names it (e.g. ``memory_mb``)."""

    def __init__(self, message: str, exit_code: int | None = None,
                 signal_name: str | None = None, limit: str = "") -> None:
        super().__init__(message, exit_code, signal_name)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.exit_code, self.signal, self.limit))


class SandboxUnavailable(NonRetryableError):
    """``sandbox="bwrap"`` was asked for and cannot be had as specified.

    Bubblewrap is not installed, or it cannot make a user namespace and drop
    every capability here. The program is never run in a weaker sandbox.
    """


class UnsafeArgument(NonRetryableError):
    """A parameter would change how the program reads its argv (e.g. become an option)."""
