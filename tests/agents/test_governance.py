"""Tools' schemas and checks, the runtime guard, the budget ledger and the key limiter."""

from __future__ import annotations

import enum
import multiprocessing
import os
import socket
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest

from ledgerflow.errors import DefinitionError
from ledgerflow_agents import Arg, Budget, KeyLimits, tool
from ledgerflow_agents.budget import Amount, FileBudgetLedger, Owner, Scope
from ledgerflow_agents.errors import BudgetExceeded, PathNotAllowed, RateLimited, ToolNotAllowed
from ledgerflow_agents.guard import Guard, guarded
from ledgerflow_agents.limits import KeyLimiter
from ledgerflow_agents.tools import InvalidArguments


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool(reads=["/srv/docs"])
def search(query: Annotated[str, "free text"], k: int = 3, mode: Literal["a", "b"] = "a",
           color: Color | None = None, tags: list[str] | None = None,
           doc: Path | None = None, *, index: str = "i.duckdb") -> list[dict[str, str]]:
    """Search the documents.

    Args:
        k: how many hits.
    """
    return []


def test_the_schema_comes_from_the_type_hints_and_the_docstring() -> None:
    spec = search.spec()
    assert spec["description"] == "Search the documents."
    props = spec["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "free text"}
    assert props["k"] == {"type": "integer", "description": "how many hits."}
    assert props["mode"] == {"enum": ["a", "b"], "type": "string"}
    assert props["color"] == {"anyOf": [{"enum": ["red", "blue"]}, {"type": "null"}]}
    assert props["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert "index" not in props                       # hidden: from the agent task
    assert spec["parameters"]["required"] == ["query"]
    assert spec["parameters"]["additionalProperties"] is False


def test_arguments_are_checked_and_paths_resolved_inside_the_roots(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("x")
    os.symlink(tmp_path / "secret.txt", docs / "link.txt")

    @tool(reads=[Arg("corpus")])
    def read(path: Path, *, corpus: str) -> str:
        return path.read_text()

    p = read.prepare({"path": "sub/a.md"}, {"corpus": str(docs)})
    assert p.kwargs == {"path": docs / "sub" / "a.md", "corpus": str(docs)}
    assert p.reads == (str(docs),)
    for bad in ("../secret.txt", "/etc/passwd", "link.txt", "sub/../../secret.txt"):
        with pytest.raises(PathNotAllowed):
            read.prepare({"path": bad}, {"corpus": str(docs)})
    with pytest.raises(InvalidArguments, match="unknown argument"):
        read.prepare({"path": "a", "mode": "w"}, {"corpus": str(docs)})
    with pytest.raises(InvalidArguments, match="missing argument"):
        read.prepare({}, {"corpus": str(docs)})
    with pytest.raises(InvalidArguments, match="k: Expected `int`"):
        search.prepare({"query": "q", "k": "3"}, {})
    assert search.prepare({"query": "q", "color": "red"}, {}).kwargs["color"] is Color.RED


def test_tool_declarations_that_cannot_work_are_refused() -> None:
    def no_roots(path: Path) -> str:
        return ""

    with pytest.raises(DefinitionError, match="declares no roots"):
        tool(no_roots)

    def odd(x: complex) -> str:
        return ""

    with pytest.raises(DefinitionError, match="has no JSON schema"):
        tool(odd)

    def star(*args: int) -> int:
        return 0

    with pytest.raises(DefinitionError, match="cannot be described"):
        tool(star)


def test_the_guard_refuses_reads_writes_sockets_and_programs_not_declared(
        tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.txt").write_text("a")
    g = Guard("t", reads=(str(inside),), writes=())
    with guarded(g):
        assert (inside / "a.txt").read_text() == "a"
        import json  # noqa: F401  (reading code is allowed)
        with pytest.raises(PathNotAllowed):
            (inside / "b.txt").write_text("b")         # read-only root
        with pytest.raises(PathNotAllowed):
            os.listdir(outside)
        with pytest.raises(ToolNotAllowed):
            socket.create_connection(("127.0.0.1", 9), timeout=0.1)
        with pytest.raises(ToolNotAllowed):
            os.system("true")
        try:
            os.remove(outside / "nothing")              # a tool that swallows the refusal
        except Exception:
            pass
    assert [k for k, _ in g.violations] == ["path_not_allowed"] * 2 + \
        ["tool_not_allowed"] * 2 + ["path_not_allowed"]
    (outside / "c.txt").write_text("c")                 # outside a tool call: no guard
    w = Guard("w", reads=(), writes=(str(outside),))
    with guarded(w):
        (outside / "d.txt").write_text("d")
    assert not w.violations


# -- the budget ledger ----------------------------------------------------------------------

def _reserver(folder: str, n: int, out: multiprocessing.Queue) -> None:   # type: ignore[type-arg]
    ledger = FileBudgetLedger(folder, os.path.join(folder, "run"))
    scope = [Scope("run", "r1", Budget(tokens=1000))]
    got = 0
    for i in range(n):
        rid = f"{os.getpid()}-{i}"
        try:
            ledger.reserve(rid, scope, Amount(tokens=30, model_calls=1), Owner.me())
        except BudgetExceeded:
            continue
        ledger.settle(rid, scope, Amount(tokens=25, model_calls=1))
        got += 1
    out.put(got)


def test_reservations_from_several_processes_never_overshoot(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_reserver, args=(str(tmp_path), 20, q)) for _ in range(4)]
    for p in procs:
        p.start()
    granted = sum(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    ledger = FileBudgetLedger(str(tmp_path), str(tmp_path / "run"))
    usage = ledger.usage(Scope("run", "r1", Budget(tokens=1000)))
    assert usage["spent"]["tokens"] == 25 * granted <= 1000
    assert usage["open"] == 0
    assert 30 <= granted < 80                 # most of the budget used, the rest refused


def test_a_dead_processs_reservation_counts_in_full_until_its_call_is_settled(
        tmp_path: Path) -> None:
    ledger = FileBudgetLedger(str(tmp_path), str(tmp_path / "run"))
    scope = [Scope("task", "r/t", Budget(tokens=100))]
    dead = Owner(socket.gethostname(), 2 ** 22 + 7, "123")     # no such process
    ledger.reserve("gone", scope, Amount(tokens=60), dead)
    with pytest.raises(BudgetExceeded, match="60 tokens of 100 tokens spent or reserved"):
        ledger.reserve("next", scope, Amount(tokens=50), Owner.me())
    assert ledger.usage(scope[0])["spent"]["tokens"] == 60     # reclaimed as spent
    assert ledger.settle("gone", scope, Amount(tokens=20)) == []   # its response replayed
    ledger.reserve("next", scope, Amount(tokens=50), Owner.me())
    assert ledger.usage(scope[0])["spent"]["tokens"] == 20
    assert ledger.settle("next", scope, Amount(tokens=90)) == [
        "the task r/t budget: 110 tokens spent of 100 tokens"]
    assert ledger.settle("next", scope, Amount(tokens=90)) == []   # settled once only


# -- the key limiter ------------------------------------------------------------------------

def test_requests_per_minute_and_a_retry_after_make_callers_wait(tmp_path: Path) -> None:
    waits: list[float] = []
    a = KeyLimiter("K", str(tmp_path))
    b = KeyLimiter("K", str(tmp_path))          # another process's view of the same key
    limits = KeyLimits(requests_per_minute=2, max_wait=600)
    assert a.acquire("1", 10, limits, sleep=waits.append) == pytest.approx(0, abs=0.5)
    a.release("1", 8)
    b.acquire("2", 10, limits, sleep=waits.append)
    assert waits == []

    def give_up(seconds: float) -> None:
        waits.append(seconds)
        raise TimeoutError

    with pytest.raises(TimeoutError):
        b.acquire("3", 10, limits, sleep=give_up)     # the third in a minute must wait
    assert waits[-1] == 1.0                            # (in steps of at most 1 s)
    with pytest.raises(RateLimited) as info:           # a wait past max_wait: retry later
        b.acquire("3", 10, KeyLimits(requests_per_minute=2, max_wait=30), sleep=give_up)
    assert info.value.retry_after is not None and 50 < info.value.retry_after <= 60
    assert [w[1] for w in a.snapshot()["window"]] == [8, 10]
    c = KeyLimiter("K2", str(tmp_path))
    c.block(5.0)
    with pytest.raises(RateLimited) as info:
        KeyLimiter("K2", str(tmp_path)).acquire("4", 1, KeyLimits(max_wait=2), sleep=give_up)
    assert info.value.retry_after is not None and 4 < info.value.retry_after <= 5


def test_concurrent_slots_and_tokens_per_minute(tmp_path: Path) -> None:
    lim = KeyLimiter("K", str(tmp_path))
    one = KeyLimits(concurrent=1, tokens_per_minute=100, max_wait=0.2)
    lim.acquire("a", 60, one)
    with pytest.raises(Exception, match="no turn within"):
        lim.acquire("b", 10, one)                  # the one slot is taken
    lim.release("a", 50)
    with pytest.raises(Exception, match="no turn within"):
        lim.acquire("c", 60, one)                  # 50 + 60 > 100 tokens this minute
    lim.acquire("d", 40, one)
    with pytest.raises(BudgetExceeded, match="can never fit"):
        lim.acquire("e", 101, one)
    with pytest.raises(DefinitionError):
        KeyLimits(concurrent=0)


def test_meta_constraints_reach_the_schema_and_are_checked_at_dispatch() -> None:
    @tool
    def find(query: Annotated[str, msgspec.Meta(max_length=5)],
             k: Annotated[int, msgspec.Meta(ge=1, le=3)] | None = None) -> str:
        """Find."""
        return query

    props = find.spec()["parameters"]["properties"]
    assert props["query"] == {"type": "string", "maxLength": 5}
    assert props["k"] == {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 3},
                                    {"type": "null"}]}
    assert find.prepare({"query": "abc", "k": 2}, {}).kwargs == {"query": "abc", "k": 2}
    with pytest.raises(InvalidArguments, match="query"):
        find.prepare({"query": "abcdef"}, {})
    with pytest.raises(InvalidArguments, match="k"):
        find.prepare({"query": "a", "k": 9}, {})


def test_an_arg_root_with_a_suffix_names_a_file_beside_the_argument(tmp_path: Path) -> None:
    index = tmp_path / "index.duckdb"

    @tool(reads=[Arg("index")], writes=[Arg("index", suffix=".lock")])
    def search_it(query: str, *, index: str) -> str:
        """Search."""
        return query

    p = search_it.prepare({"query": "q"}, {"index": str(index)})
    assert p.reads == (str(index),)
    assert p.writes == (str(index) + ".lock",)
    g = Guard("search_it", reads=p.reads, writes=p.writes)
    with guarded(g):
        (tmp_path / "index.duckdb.lock").write_text("")
        with pytest.raises(PathNotAllowed):
            (tmp_path / "index.duckdb.other").write_text("")


def test_the_guard_lets_libraries_read_about_the_machine_but_not_the_environment(
        tmp_path: Path) -> None:
    g = Guard("t", reads=(str(tmp_path),), writes=())
    with guarded(g):
        Path("/proc/stat").read_text()
        Path(f"/proc/{os.getpid()}/status").read_text()
        assert not Path(tmp_path / "missing.txt").exists()
        with pytest.raises(FileNotFoundError):
            open(tmp_path.parent / "never-there.txt")        # probing a missing path
        tmp_path.mkdir(parents=True, exist_ok=True)      # exists: creates nothing
        from importlib.metadata import entry_points
        assert entry_points(group="ledgerflow")             # packages' metadata
        with pytest.raises(PathNotAllowed):
            Path("/proc/self/environ").read_bytes()
        with pytest.raises(PathNotAllowed):
            (tmp_path / "new").mkdir()                   # would create: a write
    assert [k for k, _ in g.violations] == ["path_not_allowed"] * 2


def test_the_tools_own_code_reads_no_code_or_metadata_outside_its_roots(tmp_path: Path) -> None:
    """Issue 31 #8: a path the model chose cannot reach ``*.py``, ``*.pth`` or
    ``*.dist-info`` files outside the roots; the import system still can."""
    import importlib.metadata
    import sysconfig

    root, other = tmp_path / "root", tmp_path / "other"
    (other / "pkg-1.0.dist-info").mkdir(parents=True)
    root.mkdir()
    planted = [other / "settings.py", other / "evil.pth", other / "pkg-1.0.dist-info" / "RECORD"]
    for p in planted:
        p.write_text("SECRET = 'planted'\n")
    installed = [Path(sysconfig.get_paths()["purelib"]) / "distutils-precedence.pth",
                 Path(importlib.metadata.distribution("msgspec")._path) / "METADATA",  # type: ignore[attr-defined]
                 Path(os.__file__)]
    g = Guard("t", reads=(str(root),), writes=())
    with guarded(g):
        for p in planted + [p for p in installed if p.exists()]:
            with pytest.raises(PathNotAllowed, match="may not read"):
                p.read_text()
        import email.mime.text  # noqa: F401  (the import system reads code: allowed)
        assert importlib.metadata.version("msgspec")      # a library reads metadata: allowed
    assert {k for k, _ in g.violations} == {"path_not_allowed"}


def test_the_runtime_may_read_identity_files_and_make_scratch_files(tmp_path: Path) -> None:
    """Issue 30 #1: what an embedding library reads and writes while a tool runs."""
    import tempfile

    g = Guard("t", reads=(str(tmp_path),), writes=(), code=frozenset({"/nowhere/tool.py"}))
    with guarded(g):                           # this test's code stands for a library here
        for p in ("/proc/sys/kernel/random/boot_id", f"/proc/{os.getpid()}/mounts"):
            if os.path.exists(p):
                Path(p).read_text()
        with tempfile.NamedTemporaryFile() as fh:     # a new file: O_EXCL
            fh.write(b"x")
        with pytest.raises(PathNotAllowed):
            Path("/proc/self/environ").read_bytes()
    assert [k for k, _ in g.violations] == ["path_not_allowed"]
    mine = Guard("t", reads=(str(tmp_path),), writes=())      # the tool's own code: refused
    with guarded(mine):
        with pytest.raises(PathNotAllowed):
            Path("/proc/sys/kernel/random/boot_id").read_text()
        with pytest.raises(PathNotAllowed):
            tempfile.NamedTemporaryFile(dir=tempfile.gettempdir())
