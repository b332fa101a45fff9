"""Import layering and room sizes of the core and the plugins.

The core (``sdk/ledgerflow``) imports no plugin package, has no import cycle,
and its kernel modules never import the driver, the CLI or the plugin manager.
The plugins have no import cycle either (imports inside functions counted), no
plugin imports another at module level, and no module of either is over
``MAX_LINES`` lines: a room that grows past it is split by concept.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SDK = ROOT / "sdk" / "ledgerflow"
PLUGIN_PACKAGES = {p.name for p in (ROOT / "plugins").iterdir() if (p / "__init__.py").exists()}
KERNEL = ("task", "graph", "states", "plan", "keys", "results", "context", "errors",
          "records", "projection", "views", "resume", "store", "executor")
DRIVER = {"ledgerflow.runner", "ledgerflow.launch", "ledgerflow.control", "ledgerflow.cli",
          "ledgerflow.plugins"}


MAX_LINES = 500
PLUGINS = ROOT / "plugins"


def _modules(top: Path, packages: list[Path]) -> dict[str, Path]:
    mods = {}
    for pkg in packages:
        for f in pkg.rglob("*.py"):
            parts = list(f.relative_to(top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules(SDK.parent, [SDK])
PLUGIN_MODULES = _modules(PLUGINS, [PLUGINS / p for p in sorted(PLUGIN_PACKAGES)])


def imports_of(name: str, modules: dict[str, Path] | None = None, *,
               top_level_only: bool = False) -> tuple[set[str], set[str]]:
    """(modules of ``modules``, other top-level packages) that module ``name`` imports
    anywhere (or only at module level), except inside ``if TYPE_CHECKING:`` blocks."""
    modules = MODULES if modules is None else modules
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    core: set[str] = set()
    other: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                for n in node.orelse:
                    self.visit(n)
                return
            self.generic_visit(node)

        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
            if not top_level_only:
                self.generic_visit(node)

        visit_AsyncFunctionDef = visit_FunctionDef

        def _add(self, target: str, names: list[str]) -> None:
            found = [c for c in [target, *(f"{target}.{n}" for n in names)] if c in modules]
            if found:
                core.update(found)
            elif target:
                other.add(target.split(".")[0])

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            names = [a.name for a in node.names]
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if not node.module:      # from . import x: the submodules only
                    core.update(f"{target}.{n}" for n in names if f"{target}.{n}" in modules)
                    return
            else:
                target = node.module or ""
            self._add(target, names)

        def visit_Import(self, node: ast.Import) -> None:
            for alias in node.names:
                self._add(alias.name, [])

    Visitor().visit(ast.parse(path.read_text()))
    core.discard(name)
    return core, other


GRAPH = {m: imports_of(m)[0] for m in MODULES}
PLUGIN_GRAPH = {m: imports_of(m, PLUGIN_MODULES)[0] for m in PLUGIN_MODULES}


def import_cycles(graph: dict[str, set[str]] = GRAPH) -> list[list[str]]:
    """Every elementary cycle of an import graph (each once, smallest node first)."""
    cycles = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append([*path, start])
                elif nxt > start and nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    return cycles


def test_the_core_has_no_import_cycle() -> None:
    cycles = import_cycles()
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_plugins_have_no_import_cycle() -> None:
    cycles = import_cycles(PLUGIN_GRAPH)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", sorted(PLUGIN_MODULES))
def test_no_plugin_imports_another_plugin_at_module_level(module: str) -> None:
    own = module.split(".")[0]
    inner, other = imports_of(module, PLUGIN_MODULES, top_level_only=True)
    foreign = {m.split(".")[0] for m in inner} | other
    assert not (foreign & PLUGIN_PACKAGES) - {own}, \
        f"{module} imports {(foreign & PLUGIN_PACKAGES) - {own}} at module level"


@pytest.mark.parametrize("path", sorted({*MODULES.values(), *PLUGIN_MODULES.values()}),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_the_room_size(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by concept"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_core_module_imports_a_plugin_package(module: str) -> None:
    _, other = imports_of(module)
    assert not other & PLUGIN_PACKAGES, f"{module} imports {other & PLUGIN_PACKAGES}"


@pytest.mark.parametrize("module", KERNEL)
def test_kernel_modules_do_not_import_the_driver(module: str) -> None:
    core, _ = imports_of(f"ledgerflow.{module}")
    assert not {c for c in core if c in DRIVER or c.startswith("ledgerflow.cli")}, core


def test_the_graph_is_what_the_code_imports() -> None:
    # a guard on the scanner itself: known edges must be seen
    assert "ledgerflow.states" in GRAPH["ledgerflow.runner"]
    assert "ledgerflow.launch" in GRAPH["ledgerflow.pipeline"]      # inside Pipeline.run
    assert "ledgerflow.specs.document" in GRAPH["ledgerflow.loading"]        # inside load_target
    assert "ledgerflow_stores.duckdb.journal" in PLUGIN_GRAPH["ledgerflow_stores.duckdb.store"]
    inner, _ = imports_of("ledgerflow_docindex.search", PLUGIN_MODULES)
    assert "ledgerflow_embed" in inner                                        # inside a function
    inner, _ = imports_of("ledgerflow_docindex.search", PLUGIN_MODULES, top_level_only=True)
    assert "ledgerflow_embed" not in inner
