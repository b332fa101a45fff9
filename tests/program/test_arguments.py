"""Parameters of a program task cannot become shell code or options."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerflow import DefinitionError, pipeline, program
from ledgerflow.programs import UnsafeArgument
from tests.program.proctools import PY


@pytest.mark.parametrize("argv", [
    ["sh", "-c", "cat {src}"],
    ["/bin/bash", "-ec", "echo {src}"],
    [PY, "-c", "print('{src}')"],
    ["perl", "-e", "print '{src}'"],
    ["env", "LC_ALL=C", "bash", "--norc", "-c", "ls {src}"],
    # seen through since: a -- before the code, env -S, perl -E, node --eval, awk, sed
    ["sh", "-c", "--", "cat {src}"],
    ["env", "-S", "sh -c 'cat {src}'"],
    ["perl", "-E", "say '{src}'"],
    ["node", "--eval", "console.log('{src}')"],
    ["node", "--eval=console.log('{src}')"],
    ["awk", "-F,", "-v", "n=1", "BEGIN {{ print \"{src}\" }}"],
    ["sed", "-n", "s/x/{src}/p", "file.txt"],
    ["sed", "-e", "s/x/{src}/e", "file.txt"],
])
def test_a_placeholder_in_the_code_of_an_interpreter_is_refused(argv: list[str]) -> None:
    with pytest.raises(DefinitionError, match="would let a value run as code") as info:
        program("inject", argv)
    assert "LEDGERFLOW_PARAM_X" in (info.value.hint or "")


def test_the_value_passed_after_sh_c_double_dash_stays_data(tmp_path: Path) -> None:
    """The form the refusal's hint points to works with a ``--`` too."""
    marker = tmp_path / "pwned"
    sh = program("sh", ["sh", "-c", "--", 'printf "%s\\n" "$1"', "sh", "{src}"])
    assert sh(src=f"x; touch {marker}")["stdout"] == f"x; touch {marker}\n"
    assert not marker.exists()


@pytest.mark.parametrize("argv", [
    ["awk", "-f", "prog.awk", "{src}"],
    ["sed", "-f", "prog.sed", "{src}"],
    ["awk", "-v", "n={n}", "{{ print n }}", "{src}"],
    ["env", "NAME={n}", "sh", "-e", "{src}"],
])
def test_a_placeholder_in_data_of_awk_sed_or_env_is_fine(argv: list[str]) -> None:
    program("data", argv)


def test_a_placeholder_in_a_script_path_or_an_option_value_is_fine(tmp_path: Path) -> None:
    script = tmp_path / "s.sh"
    script.write_text('echo "ran $1"\n')
    run = program("run", ["sh", "-e", "{script}", "{arg}"])
    assert run(script=str(script), arg="x")["stdout"] == "ran x\n"


def test_a_value_passed_as_an_argument_to_sh_c_stays_data(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    safe = program("safe", ["sh", "-c", 'printf "%s\\n" "$1"', "sh", "{src}"])
    out = safe(src=f"x; touch {marker}")["stdout"]
    assert out == f"x; touch {marker}\n" and not marker.exists()


def test_a_value_that_reads_as_an_option_is_refused_and_nothing_runs(tmp_path: Path,
                                                                    ledger: str) -> None:
    marker = tmp_path / "ran"
    touch = program("touch", ["sh", "-c", f': > {marker}; printf "%s\\n" "$@"', "sh", "{src}"],
                    retries=2)

    @pipeline
    def p(src: str):
        return touch(src=src)

    run = p.run("-o/etc/passwd", store=ledger, executor="threads")
    task = run.status().tasks["touch"]
    assert task.state == "failed"
    assert "would reach the program as an option" in (task.error or "")
    assert [a["outcome"] for a in run.attempts("touch")] == ["error"]   # not retried
    assert not marker.exists()


def test_after_a_double_dash_and_for_numbers_a_leading_dash_is_fine() -> None:
    show = [PY, "-c", "import sys; print('|'.join(sys.argv[1:]))"]
    after = program("after", [*show, "--", "{a}"])
    assert after(a="-o/path")["stdout"] == "--|-o/path\n"
    num = program("num", [*show, "{n}"])
    assert num(n=-3)["stdout"] == "-3\n" and num(n="-2.5e3")["stdout"] == "-2.5e3\n"
    with pytest.raises(UnsafeArgument, match=r"parameter n='-x'"):
        num(n="-x")


def test_a_value_cannot_lead_a_declared_path_out_of_its_folder(tmp_path: Path,
                                                              ledger: str) -> None:
    """``outputs=["out/{name}.txt"]``: the folder of an output is writable in the
    sandbox, so ``name="../../x"`` would have made a folder outside ``out/`` writable."""
    out, outside = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    outside.mkdir()
    write = program("write", ["sh", "-c", 'echo hi > "$1"', "sh", f"{out}/{{name}}.txt"],
                    outputs=[f"{out}/{{name}}.txt"], retries=1)

    @pipeline
    def p(name: str):
        return write(name=name)

    assert p.run("fine", store=ledger, executor="threads").status().state == "succeeded"
    assert (out / "fine.txt").read_text() == "hi\n"
    run = p.run("../elsewhere/evil", store=ledger, executor="threads")
    task = run.status().tasks["write"]
    assert task.state == "failed" and "outside" in (task.error or "")
    assert [a["outcome"] for a in run.attempts("write")] == ["error"]     # not retried
    assert list(outside.iterdir()) == []
    whole = program("whole", ["true"], inputs=["{src}"])            # the value is the path
    assert whole(src="../anything")["exit_code"] == 0
