"""OpenLineage names of jobs and datasets, by the naming spec (stdlib only).

https://openlineage.io/docs/spec/naming: a dataset is ``(namespace, name)``;
the namespace is the data source (``scheme://authority``), the name what is
unique within it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._runs import TaskInfo


def dataset_of(uri: str, namespace: str) -> tuple[str, str]:
    """``(namespace, name)`` of an artifact URI, by the OpenLineage naming conventions."""
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        if scheme == "file":
            return "file", rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
        authority, _, path = rest.partition("/")
        return f"{scheme}://{authority}", "/" + path
    if uri.startswith("/") or ":" not in uri:
        return "file", uri
    scheme, rest = uri.split(":", 1)
    return scheme, rest



@dataclass(slots=True)
class Namer:
    """Names of jobs and datasets of one run."""

    namespace: str
    pipeline: str

    def result(self, key: str) -> str:
        return f"{self.pipeline}/{key}"

    def job(self, info: TaskInfo) -> str:
        return f"{self.pipeline}.{info.node or info.key}"

