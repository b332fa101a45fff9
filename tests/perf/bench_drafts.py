"""How often the local model drafts the doc-index request: valid, and doing what was asked.

Run from the repository root (not collected by pytest: no ``test_`` prefix)::

    .venv/bin/python tests/perf/bench_drafts.py [--tries 10] [--repairs 1]
        [--model local] [--out bench_drafts.json]

Ten tries of "index the markdown files in DIR into INDEX, then search it for
QUERY" with ten different folders, index files and queries (greedy decoding
repeats exactly, so the same words would give the same draft ten times), over
the doc-index recipe's tasks plus a search task
(``tests/drafts/fixtures/doc_search.py``), each drafted by ``pipeline draft``
as a ledgerflow run. For each try: does the draft validate (``pipeline
validate``, with a policy declaring that ``update_index`` writes its index),
and does it do what was asked (:func:`tests.drafts.doc_index_request.judge`:
discover the folder, the read -> clean -> chunk -> embed -> update_index fan-out
into the index, a search of it for the query after the index is written);
what it got wrong; seconds and tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.drafts.doc_index_request import POLICY, RECIPE, REQUEST, SEARCH, judge

CASES = [("docs/", "docs.duckdb", "patent grant"),
         ("notes/", "notes.duckdb", "refund policy"),
         ("manuals/", "manuals.duckdb", "warranty"),
         ("wiki/", "wiki-index.duckdb", "backups"),
         ("papers/", "papers.duckdb", "neural networks"),
         ("guides/", "guides.duckdb", "installation"),
         ("site/content/", "site.duckdb", "pricing"),
         ("handbook/", "hb.duckdb", "vacation days"),
         ("specs/", "specs.duckdb", "error codes"),
         ("blog/", "blog.duckdb", "release notes")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--repairs", type=int, default=1)
    ap.add_argument("--model", default="local")
    ap.add_argument("--out", default="bench_drafts.json")
    args = ap.parse_args(argv)
    from click.testing import CliRunner

    from ledgerflow.cli import main as cli
    work = Path(tempfile.mkdtemp(prefix="bench-drafts-"))
    (work / "POLICY.toml").write_text(POLICY)
    os.chdir(work)
    runner = CliRunner()
    rows: list[dict[str, Any]] = []
    for i, (folder, index, query) in enumerate(CASES[:args.tries]):
        (work / folder).mkdir(parents=True, exist_ok=True)
        for md in sorted((RECIPE.parent / "corpus" / "markdown").glob("*.md"))[:2]:
            shutil.copy(md, work / folder / md.name)
        request = REQUEST.format(dir=folder, index=index, query=query)
        out = f"draft-{i}.toml"
        started = time.perf_counter()
        res = runner.invoke(cli, ["draft", request, "--tasks", str(RECIPE), "--tasks",
                                  str(SEARCH), "--model", args.model, "--policy", "POLICY.toml",
                                  "--repairs", str(args.repairs), "-o", out, "--store",
                                  "ledger.duckdb", "--json"])
        seconds = time.perf_counter() - started
        try:
            result = json.loads(res.stdout)
        except ValueError:
            rows.append({"request": request, "error": res.output[-500:], "seconds": seconds})
            print(f"{i + 1:2}  error: {res.output[-200:]}", flush=True)
            continue
        if not (work / out).exists():       # the drafting run failed (exit 1): no draft
            why = (result.get("error") or result.get("reason") or res.output[-300:]) \
                if isinstance(result, dict) else res.output[-300:]
            rows.append({"request": request, "error": f"exit {res.exit_code}: {why}",
                         "seconds": round(seconds, 1)})
            print(f"{i + 1:2}  no draft (exit {res.exit_code}) {seconds:6.1f}s: "
                  f"{str(why)[:160]}", flush=True)
            continue
        check = runner.invoke(cli, ["validate", out, "--policy", "POLICY.toml", "--json"])
        report = json.loads(check.stdout)
        doc = tomllib.loads((work / out).read_text()) if (work / out).exists() else {}
        wrong = judge(doc, folder, index, query)
        usage = json.loads(runner.invoke(cli, ["usage", result["run_id"], "--store",
                                               "ledger.duckdb", "--json"]).stdout)["totals"]
        row = {"request": request, "valid": report["valid"], "does_it": not wrong,
               "wrong": wrong, "problems": [p["code"] for p in report["problems"]],
               "rounds": len(result.get("rounds") or []), "steps": sorted(doc.get("tasks", {})),
               "seconds": round(seconds, 1), "tokens": usage["tokens"],
               "output_tokens": usage["output_tokens"], "spec": doc}
        rows.append(row)
        print(f"{i + 1:2}  valid={row['valid']!s:5} does_it={row['does_it']!s:5} "
              f"rounds={row['rounds']} {row['seconds']:6.1f}s  steps={row['steps']}  "
              f"wrong: {'; '.join(wrong[:3])}", flush=True)
    ok = [r for r in rows if r.get("valid")]
    done = [r for r in rows if r.get("does_it")]
    print(f"\nmodel {args.model}, {len(rows)} tries, {args.repairs} repair(s) at most: "
          f"{len(ok)} valid, {len(done)} doing what was asked; "
          f"median {sorted(r['seconds'] for r in rows)[len(rows) // 2]:.1f}s per draft; "
          f"load average {os.getloadavg()[0]:.1f}")
    Path(args.out if os.path.isabs(args.out) else Path(__file__).resolve().parents[2]
         / args.out).write_text(json.dumps({"model": args.model, "repairs": args.repairs,
                                            "rows": rows}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
