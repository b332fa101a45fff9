"""Which argv elements a program reads as code, and the refusal of placeholders in them.

``["sh", "-c", "cat {src}"]`` would let a value run as shell code; so would the
code options of other interpreters, the program text of ``awk`` and ``sed``, and
the string ``env -S`` splits. :func:`check_code_placeholders` refuses such a
template when the task is defined (:func:`ledgerflow.programs.program`).
"""

from __future__ import annotations

import os
import re

from ..errors import DefinitionError
from .params import names

__all__ = ["check_code_placeholders", "code_elements"]

#: Interpreters, and the options whose value is code: (basename, short letters, long names).
_INTERPRETERS = (
    (re.compile(r"(ba|da|z|k|a|fi|c|tc|mk|y)?sh|busybox"), "c", ()),
    (re.compile(r"(python|pypy)[0-9.]*"), "c", ()),
    (re.compile(r"perl[0-9.]*"), "eE", ()),
    (re.compile(r"ruby[0-9.]*"), "e", ()),
    (re.compile(r"node(js)?|bun"), "ep", ("--eval", "--print")),
    (re.compile(r"php[0-9.]*"), "rBRE", ()),
    (re.compile(r"Rscript|R|lua(jit|[0-9.]*)|tclsh[0-9.]*"), "e", ("--expr",)),
)
#: Programs whose first operand (or ``-e``) is a program text, and their options that take
#: a value: awk and sed (``-f FILE`` reads the program from a file instead).
_SCRIPT_FIRST = ((re.compile(r"[gmn]?awk"), ("-F", "-v", "-f")),
                 (re.compile(r"g?sed"), ("-e", "-f", "-l", "--expression", "--file")))
_SPLIT = ("-S", "--split-string")


def _script_first(prog: str, rest: tuple[str, ...], takes: tuple[str, ...]) -> list[str]:
    """The program texts of an awk or sed command line."""
    code: list[str] = []
    from_file, i = False, 0
    while i < len(rest):
        a = rest[i]
        if a == "--" or not a.startswith("-"):
            if a == "--":
                i += 1
            if not code and not from_file and i < len(rest):
                code.append(rest[i])             # the first operand is the program
            break
        if a in takes and i + 1 < len(rest):
            if a in ("-e", "--expression"):
                code.append(rest[i + 1])
            from_file = from_file or a in ("-f", "--file")
            i += 2
            continue
        if a.startswith(("-e", "--expression=")) and prog != "awk":
            code.append(a)
        from_file = from_file or a.startswith(("-f", "--file="))
        i += 1
    return code


def code_elements(argv: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(program, element)`` for every argv element that a program reads as code."""
    out: list[tuple[str, str]] = []
    for i, arg in enumerate(argv):
        base, rest = os.path.basename(arg), argv[i + 1:]
        if base == "env":                       # env -S 'sh -c ...': a string split up
            for j, a in enumerate(rest):
                if a in _SPLIT and j + 1 < len(rest):
                    out.append(("env -S", rest[j + 1]))
                elif a.startswith(("-S", "--split-string=")):
                    out.append(("env -S", a))
                elif not a.startswith("-"):
                    break
        for kind, takes in _SCRIPT_FIRST:
            if kind.fullmatch(base):
                out += [(base, a) for a in _script_first(base, rest, takes)]
        for kind, letters, longs in _INTERPRETERS:
            if not kind.fullmatch(base):
                continue
            pending = False
            for a in rest:
                if pending and a == "--":
                    continue                    # sh -c -- 'code'
                if pending:
                    out.append((base, a))
                    pending = False
                elif a.startswith("--"):
                    if a.partition("=")[0] in longs:
                        out.append((base, a))
                        pending = "=" not in a
                elif a.startswith("-") and any(c in letters for c in a[1:]):
                    out.append((base, a))       # -c, -ec, -cCODE
                    pending = True
    return out


def check_code_placeholders(name: str, argv: tuple[str, ...]) -> None:
    """Refuse ``["sh", "-c", "cat {src}"]``: a value would become code (see :func:`program`).

    The interpreter may come after a launcher (``env``, ``nice``, ``timeout 5``...); a
    ``--`` between the option and its code is seen through.
    """
    for prog, element in code_elements(argv):
        if names(element):
            raise DefinitionError(
                f"program {name!r}: placeholders {sorted(names(element))} in the code of "
                f"{prog} ({element!r}) would let a value run as code",
                hint='read the value from "$LEDGERFLOW_PARAM_X", or pass it as an argument: '
                     '["sh", "-c", \'cat "$1"\', "sh", "{src}"]')
