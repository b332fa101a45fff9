"""The doc-index drafting request, and what a draft that does it must contain.

Used by the ``local_model`` test and by ``tests/perf/bench_drafts.py``; the
recipe's tasks are found by path at run time (``recipes/doc_index/pipeline.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "doc_index" / "pipeline.py"
SEARCH = Path(__file__).resolve().parent / "fixtures" / "doc_search.py"
#: The doc-index recipe writes its index; search reads it (so a draft must order them).
POLICY = '[needs."*:update_index"]\nwrites = ["{index}"]\n'

REQUEST = "index the markdown files in {dir} into {index}, then search it for '{query}'"
CHAIN = ("discover", "read", "clean", "chunk", "embed", "update_index")


def _task(step: dict[str, Any]) -> str:
    return str(step.get("task", "")).rpartition(":")[2]


def judge(doc: dict[str, Any], folder: str, index: str, query: str) -> list[str]:
    """What the draft gets wrong about the request (empty: it does what was asked)."""
    steps = doc.get("tasks") or {}
    by_task = {_task(s): (k, s) for k, s in steps.items() if isinstance(s, dict)}
    wrong = []
    found = by_task.get("discover")
    if found is None:
        wrong.append("no discover step (nothing lists the files)")
    elif os.path.normpath(str((found[1].get("args") or {}).get("source", ""))) != \
            os.path.normpath(folder):
        wrong.append(f"discover's source is {(found[1].get('args') or {}).get('source')!r}")
    prev = "discover"
    for name in CHAIN[1:]:
        got = by_task.get(name)
        if got is None:
            wrong.append(f"no {name} step")
            break
        if by_task.get(prev) is None or got[1].get("map") != by_task[prev][0]:
            wrong.append(f"{name} does not map over {prev}")
        prev = name
    up = by_task.get("update_index")
    if up is not None and (up[1].get("args") or {}).get("index") != index:
        wrong.append(f"update_index writes {(up[1].get('args') or {}).get('index')!r}")
    s = by_task.get("search")
    if s is None:
        wrong.append("no search step")
    else:
        args = s[1].get("args") or {}
        if args.get("index") != index:
            wrong.append(f"search reads {args.get('index')!r}")
        if args.get("query") != query:
            wrong.append(f"search's query is {args.get('query')!r}")
        if up is not None and up[0] not in (s[1].get("after") or []):
            wrong.append("search is not after update_index")
    return wrong
