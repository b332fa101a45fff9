"""A pipeline defined by a spec file: its graph built from the checked steps.

``pipeline run spec.toml`` loads a :class:`SpecPipeline`
(:func:`ledgerflow.specs.document.load_spec`); it refuses to build a graph
from a spec that has problems (:func:`ledgerflow.specs.check.check`), and a
machine-written draft is admitted only once its digest is approved
(:mod:`ledgerflow.specs.drafts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CycleError, DefinitionError
from ..graph import Graph, Node
from ..pipeline import Pipeline
from ..task import MapRef, TaskRef
from . import drafts
from .check import Report, check, check_draft
from .policy import Policy


class SpecPipeline(Pipeline[..., Any]):
    """A pipeline defined by a spec file instead of a function body."""

    traced = False

    def __init__(self, name: str, tasks: dict[str, Any], path: str, *,
                 doc: dict[str, Any] | None = None,
                 header: drafts.DraftHeader | None = None) -> None:
        def body() -> None:
            return None
        body.__name__ = name
        super().__init__(body, name)
        self.tasks = tasks
        self.path = path
        self.doc = doc if doc is not None else {"name": name, "tasks": tasks}
        #: The draft header when ``pipeline draft`` wrote this file (None: written by hand).
        self.draft = header

    def target(self) -> str | None:
        return self.path

    @property
    def digest(self) -> str:
        """The canonical digest of the spec's content (what an approval is bound to)."""
        return drafts.spec_digest(self.doc)

    def admit(self, store: Any) -> None:
        """Refuse a machine-written draft whose digest has not been approved."""
        if self.draft is not None:
            drafts.require_approval(self.path, self.draft, self.digest, store)

    def check(self, policy: Policy | None = None) -> Report:
        """Every problem of this spec (see :func:`~ledgerflow.specs.check.check`); a
        draft's as data, over its catalogue (:func:`~ledgerflow.specs.check.check_draft`)."""
        folder = str(Path(self.path).parent)
        if self.draft is not None:
            return check_draft(self.doc, self.draft, folder=folder, policy=policy)
        return check(self.doc, folder=folder, policy=policy)

    def build(self, *args: Any, **params: Any) -> Graph:
        report = self.check()
        if report.problems:
            problems = [str(p) for p in report.problems]
            if report.cycles:
                raise CycleError(report.cycles[0], problems=problems)
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise DefinitionError(
                problems[0] + more, problems=problems,
                hint=(report.problems[0].hint or "fix the spec")
                + (f"; check them all: pipeline validate {self.path}" if more else ""))
        graph = Graph(self.name, may_cycle=True)

        def ref(k: str) -> TaskRef | MapRef:
            return MapRef(k) if report.steps[k].map is not None else TaskRef(k)

        for key in report.order:
            s = report.steps[key]
            kwargs: dict[str, Any] = dict(s.args)
            kwargs.update({p: ref(up) for p, up in s.inputs.items()})
            deps = tuple(dict.fromkeys(s.inputs.values()))
            if s.map is not None:
                graph.nodes[key] = Node(key, s.info.task, True, (), kwargs, deps, s.after,
                                        source=ref(s.map), item_key=s.item_key,
                                        where=self.path, has_refs=bool(s.inputs))
            else:
                graph.nodes[key] = Node(key, s.info.task, False, (), kwargs, deps, s.after,
                                        where=self.path, has_refs=bool(s.inputs))
        return graph.validate()
