"""How every ``pipeline`` command fails: exit codes, ``Error:``/``Hint:`` lines, ``--debug``.

0 the run succeeded; 1 it failed or was cancelled; 2 bad usage or bad input
(one ``Error:`` line with the cause, one ``Hint:`` line with the fix, no
traceback unless ``--debug``); 70 an internal error (a bug: the traceback is
printed). ``--debug`` works before or after the command name.
"""

from __future__ import annotations

import functools
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import PipelineError
from .render import out

F = TypeVar("F", bound=Callable[..., Any])


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_root().meta["ledgerflow.debug"] = True


#: ``--debug`` for a command (the group has its own): either place works.
debug_option = click.option("--debug", is_flag=True, expose_value=False, is_eager=True,
                            callback=_set_debug, help="Show tracebacks for errors.")


def debugging() -> bool:
    root = click.get_current_context().find_root()
    return bool(root.params.get("debug") or root.meta.get("ledgerflow.debug"))


def fail(exc: PipelineError, debug: bool) -> None:
    """Print ``exc`` as Error/Hint lines and exit with its code."""
    message, hint = str(exc), exc.hint
    if debug:
        traceback.print_exception(exc)
        # the traceback is above: no "(run with --debug ...)" advice
        message, hint = _undebug(message), _undebug(hint) if hint else hint
    out(f"Error: {message}", err=True)
    for line in exc.detail:
        out(f"  {line}", err=True)
    if hint:
        out(f"Hint: {hint}", err=True)
    sys.exit(exc.exit_code)


_ASK_DEBUG = re.compile(r"\s*\(run with --debug[^)]*\)|\s*run with --debug[^;.)]*[;.]?")


def _undebug(text: str) -> str:
    """``text`` without advice to run with ``--debug`` (it is on)."""
    return _ASK_DEBUG.sub("", text).strip()


def guard(fn: F) -> F:
    """Turn PipelineErrors into Error/Hint lines and exit codes; anything else is a bug."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PipelineError as exc:
            fail(exc, debugging())
        except (click.exceptions.Exit, click.ClickException, KeyboardInterrupt, SystemExit):
            raise
        except BrokenPipeError:
            sys.exit(0)
        except Exception as exc:  # a bug: say so, with the traceback
            traceback.print_exception(exc)
            out(f"Error: internal error: {type(exc).__name__}: {exc}", err=True)
            out("Hint: this is a bug in ledgerflow; please report it with the "
                "traceback above", err=True)
            sys.exit(70)
    return debug_option(wrapper)  # type: ignore[return-value]
