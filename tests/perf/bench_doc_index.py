"""Benchmark: the doc_index pipeline vs a plain Python loop doing the same work.

Measures documents/s and chunks/s for

* ``loop``: a plain ``for`` loop calling the recipe's functions directly
  (discover, then per document read, clean, chunk, embed, write to the index,
  each write opening and closing the index file as the pipeline's tasks do);
* ``loop-bulk``: the same loop writing through one connection held open for
  the whole loop (``doc_index_store.bulk_writer``: what a one-off script would do);
* ``pipeline``: ``ledgerflow.run(doc_index, ...)`` — the same functions as tasks,
  with a durable ledger, threads executor, cache lookups and lineage;
* ``rerun``: the pipeline again on the unchanged corpus (everything cached);
* ``encode``: the embedder alone (``embed`` of the model) on exactly the texts the
  pipeline embeds, in the same batches (per document, ``batch_size`` texts): the
  pipeline's ``vs_encode`` is its throughput as a fraction of this one;
* ``edit``: a one-word edit of the largest document (the bundled GPL, cut into 75
  chunks with ``chunk_size=600, overlap=50``), run again: chunks embedded and seconds
  (the chunk-level embedding cache embeds only the chunks whose text changed),

on the bundled corpus and on a generated corpus (default 2,000 documents), with the
``hashing`` and ``minilm`` embedders. The model is loaded before timing starts (its
load time is reported separately). Prints a table and writes JSON.

    python tests/perf/bench_doc_index.py                        # everything (minutes)
    python tests/perf/bench_doc_index.py --embedders hashing --docs 500
    python tests/perf/bench_doc_index.py --out perf-results-doc_index.json
    python tests/perf/bench_doc_index.py --throughput 3 --embedders minilm   # pipeline vs encode

Not part of the default test run (the file name does not match ``test_*.py``);
``pytest tests/perf/bench_doc_index.py`` runs a small smoke version.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = ROOT / "recipes" / "doc_index"
PIPELINE_FILE = RECIPE_DIR / "pipeline.py"
CORPUS = RECIPE_DIR / "corpus"
if str(RECIPE_DIR) not in sys.path:
    sys.path.insert(0, str(RECIPE_DIR))


def generate_corpus(dest: Path, n_docs: int, seed: int = 0) -> Path:
    """Write ``n_docs`` documents (about 1.5 KB each; 80% text, 20% Markdown) to ``dest``.

    Sentences are drawn from the bundled corpus, so the text is real prose with
    a realistic vocabulary; the same seed gives the same files.
    """
    import doc_index_text as text

    sentences: list[str] = []
    for doc in text.discover_documents(CORPUS):
        if doc["format"] == "pdf":
            continue
        raw = text.extract_text(Path(doc["path"]).read_bytes(), doc["format"])
        cleaned = text.clean_text(raw, doc["format"])
        sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+", cleaned)
                      if 40 <= len(s.strip()) <= 300]
    rng = random.Random(seed)
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        paragraphs = [" ".join(rng.choices(sentences, k=rng.randint(2, 4)))
                      for _ in range(rng.randint(2, 4))]
        folder = dest / f"part{i // 250:02d}"
        folder.mkdir(exist_ok=True)
        if i % 5 == 4:
            body = f"# Document {i}\n\n" + "\n\n".join(f"* {p}" for p in paragraphs)
            (folder / f"doc{i:05d}.md").write_text(body + "\n", encoding="utf-8")
        else:
            (folder / f"doc{i:05d}.txt").write_text("\n\n".join(paragraphs) + "\n",
                                                    encoding="utf-8")
    return dest


def _count_chunks(index: Path) -> int:
    import duckdb

    con = duckdb.connect(str(index))
    try:
        return int(con.execute("SELECT count(*) FROM chunks").fetchall()[0][0])
    finally:
        con.close()


def plain_loop(source: Path, index: Path, embedder: str) -> dict[str, Any]:
    """The same work as the pipeline, as a plain loop over the recipe's functions."""
    from ledgerflow.control import load_module
    from ledgerflow_embed import get_embedder

    recipe = load_module(PIPELINE_FILE)
    emb = get_embedder(embedder)
    start = time.perf_counter()
    opened = recipe.open_index(str(index), emb.name, emb.version, emb.dim)
    docs = recipe.discover(str(source))
    for doc in docs:
        chunks = recipe.chunk(recipe.clean(recipe.read(doc)))
        vectors = recipe.embed(chunks, embedder=embedder, embedder_version=emb.version)
        recipe.update_index(vectors, index=str(index), opened=opened)
    recipe.prune(str(index), docs)
    return {"seconds": time.perf_counter() - start, "documents": len(docs),
            "chunks": _count_chunks(index)}


def bulk_loop(source: Path, index: Path, embedder: str) -> dict[str, Any]:
    """The plain loop, but writing through one connection held open for the whole loop."""
    from ledgerflow.control import load_module
    from ledgerflow_docindex import store
    from ledgerflow_embed import get_embedder

    recipe = load_module(PIPELINE_FILE)
    emb = get_embedder(embedder)
    start = time.perf_counter()
    docs = recipe.discover(str(source))
    with store.bulk_writer(index) as writer:
        for doc in docs:
            chunks = recipe.chunk(recipe.clean(recipe.read(doc)))
            writer.write(recipe.embed(chunks, embedder=embedder, embedder_version=emb.version))
    recipe.prune(str(index), docs)
    return {"seconds": time.perf_counter() - start, "documents": len(docs),
            "chunks": _count_chunks(index)}


def pipeline_run(source: Path, index: Path, store: Path, embedder: str,
                 workers: int | None) -> dict[str, Any]:
    """``ledgerflow.run`` of the recipe; returns time, counts and how many tasks ran."""
    import ledgerflow

    start, cpu = time.perf_counter(), time.process_time()
    run = ledgerflow.run(str(PIPELINE_FILE), source=str(source), index=str(index),
                         store=str(store), embedder=embedder, workers=workers)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if run.state != "succeeded":
        raise RuntimeError(f"run {run.run_id} ended {run.state}")
    tasks = run.tasks()
    result = run.result()
    return {"seconds": seconds, "cpu_seconds": cpu, "documents": result["documents"],
            "chunks": _count_chunks(index), "tasks": len(tasks),
            "executed": sum(1 for t in tasks if not t["cached"]), "run_id": run.run_id}


@contextmanager
def _gc_like_a_run() -> Iterator[None]:
    """The collector as a run drives tasks: older objects frozen, fewer young collections."""
    saved = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(saved[0], 20_000), saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.unfreeze()


def encode_only(source: Path, embedder: str, batch_size: int = 64, *,
                quiet_gc: bool = True) -> dict[str, Any]:
    """The embedder alone on the pipeline's texts, in the pipeline's batches (per document).

    ``quiet_gc``: with the garbage collector set as during a run (the model's own cost;
    with the default settings, a heap holding torch makes every full collection slow).
    The model is called from a thread of its own, as in the pipeline: called from the
    main thread, torch's OpenMP threads spin-wait (``OMP_WAIT_POLICY`` unset) and, on a
    busy machine, were measured 1.5-2x slower here.
    """
    import doc_index_text as text

    from ledgerflow.control import load_module
    from ledgerflow_embed import get_embedder

    recipe = load_module(PIPELINE_FILE)
    emb = get_embedder(embedder)
    docs = recipe.discover(str(source))
    batches = []
    for doc in docs:
        chunks = recipe.chunk(recipe.clean(recipe.read(doc)))["chunks"]
        title = text.document_title(doc["doc_id"])
        inputs = [f"{title}: {c['text']}" for c in chunks]
        batches += [inputs[i:i + batch_size] for i in range(0, len(inputs), batch_size)]
    timing: list[float] = []

    def work() -> None:   # in a thread of its own, as the pipeline's tasks run
        with _gc_like_a_run() if quiet_gc else nullcontext():
            start, cpu = time.perf_counter(), time.process_time()
            for batch in batches:
                emb.embed(batch)
            timing.extend((time.perf_counter() - start, time.process_time() - cpu))

    thread = threading.Thread(target=work, name="encode-alone")
    thread.start()
    thread.join()
    seconds, cpu = timing
    return {"seconds": seconds, "cpu_seconds": cpu,
            "documents": len(docs), "chunks": sum(len(b) for b in batches)}


def one_word_edit(embedder: str, workers: int | None, work: Path) -> dict[str, Any]:
    """Edit one word of a 75-chunk document and run again: chunks embedded, seconds."""
    import ledgerflow
    from ledgerflow_embed import get_embedder

    src = work / f"edit-{embedder}" / "corpus"
    shutil.copytree(CORPUS, src)
    params = {"source": str(src), "index": str(src.parent / "index.duckdb"),
              "store": str(src.parent / "ledger.duckdb"), "embedder": embedder,
              "workers": workers, "chunk_size": 600, "overlap": 50}
    assert ledgerflow.run(str(PIPELINE_FILE), **params).state == "succeeded"
    doc = src / "licenses" / "gpl-3.0.txt"
    body = doc.read_text()
    at = body.index("modify", len(body) // 2)
    doc.write_text(body[:at] + "alter" + body[at + len("modify"):])
    emb = get_embedder(embedder)
    counted: list[int] = []
    inner = emb.embed

    def counting(texts: list[str]) -> Any:
        counted.append(len(texts))
        return inner(texts)

    emb.embed = counting  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        run = ledgerflow.run(str(PIPELINE_FILE), **params)
        seconds = time.perf_counter() - start
    finally:
        emb.embed = inner  # type: ignore[method-assign]
    (write,) = [e for e in run.lineage("update_index[licenses/gpl-3.0.txt]")
                if e["direction"] == "output" and e["uri"].startswith("file:")]
    return {"corpus": "gpl-edit", "embedder": embedder, "variant": "edit", "seconds": seconds,
            "documents": 1, "chunks": int(write["attrs"]["chunks"]),
            "embedded": sum(counted), "rows_inserted": int(write["attrs"]["inserted"])}


def throughput(embedder: str, workers: int | None, work: Path, repeats: int
               ) -> dict[str, Any]:
    """The embedder alone vs full pipeline builds, folder by folder of the bundled corpus.

    On a shared machine the load changes from minute to minute, so the two are
    interleaved in slices: the corpus is split in two halves (whole folders), and
    for each half the embedder alone on its texts runs, then a pipeline build of
    that half into a new index (each build pays a run's fixed costs: conservative).
    ``repeats`` rounds; the totals per round are compared. The CPU time of the
    process (all its threads, torch's included) is reported too.
    """
    halves = (("licenses", "pdf", "datasets"), ("html", "markdown", "packages"))
    folders = []
    for i, names in enumerate(halves):
        folder = work / f"half{i}"
        if not folder.exists():
            for name in names:
                shutil.copytree(CORPUS / name, folder / name)
        folders.append(folder)
    rounds = []
    for i in range(repeats):
        enc = pipe = enc_cpu = pipe_cpu = 0.0
        chunks = 0
        for folder in folders:
            alone = encode_only(folder, embedder)
            tag = f"tp-{embedder}-{i}-{folder.name}"
            run = pipeline_run(folder, work / f"{tag}.duckdb", work / f"{tag}-ledger.duckdb",
                               embedder, workers)
            enc, pipe = enc + alone["seconds"], pipe + run["seconds"]
            enc_cpu, pipe_cpu = enc_cpu + alone["cpu_seconds"], pipe_cpu + run["cpu_seconds"]
            chunks += run["chunks"]
        rounds.append({"encode_seconds": enc, "pipeline_seconds": pipe, "chunks": chunks,
                       "encode_cpu_seconds": enc_cpu, "pipeline_cpu_seconds": pipe_cpu,
                       "ratio": enc / pipe, "cpu_ratio": enc_cpu / pipe_cpu})
        print(f"  {embedder} round {i + 1}: {chunks} chunks; encode alone {enc:.2f}s "
              f"({enc_cpu:.2f}s cpu), pipeline {pipe:.2f}s ({pipe_cpu:.2f}s cpu): ratio "
              f"{enc / pipe:.2f} (cpu {enc_cpu / pipe_cpu:.2f})")
    ratios = sorted(r["ratio"] for r in rounds)
    return {"embedder": embedder, "rounds": rounds, "median_ratio": ratios[len(ratios) // 2],
            "best_ratio": max(ratios),
            "cpu_ratio": sorted(r["cpu_ratio"] for r in rounds)[len(rounds) // 2]}


def bench(corpus_name: str, source: Path, embedder: str, workers: int | None,
          work: Path) -> list[dict[str, Any]]:
    """Loop, pipeline, cached rerun and the embedder alone on one corpus with one embedder."""
    out = []
    tag = f"{corpus_name}-{embedder}"
    alone = encode_only(source, embedder)
    loop = plain_loop(source, work / f"{tag}-loop.duckdb", embedder)
    out.append({"corpus": corpus_name, "embedder": embedder, "variant": "loop", **loop})
    bulk = bulk_loop(source, work / f"{tag}-bulk.duckdb", embedder)
    out.append({"corpus": corpus_name, "embedder": embedder, "variant": "loop-bulk", **bulk})
    store = work / f"{tag}-ledger.duckdb"
    first = pipeline_run(source, work / f"{tag}-pipeline.duckdb", store, embedder, workers)
    out.append({"corpus": corpus_name, "embedder": embedder, "variant": "pipeline", **first})
    again = pipeline_run(source, work / f"{tag}-pipeline.duckdb", store, embedder, workers)
    out.append({"corpus": corpus_name, "embedder": embedder, "variant": "rerun", **again})
    out.append({"corpus": corpus_name, "embedder": embedder, "variant": "encode", **alone})
    for row in out:
        row["docs_per_s"] = row["documents"] / row["seconds"]
        row["chunks_per_s"] = row["chunks"] / row["seconds"]
        row["vs_loop"] = row["seconds"] / loop["seconds"]
        row["vs_encode"] = alone["seconds"] / row["seconds"]
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    """A plain-text table of the results."""
    head = (f"{'corpus':<10} {'embedder':<8} {'variant':<10} {'docs':>6} {'chunks':>7} "
            f"{'seconds':>8} {'docs/s':>9} {'chunks/s':>9} {'x loop':>7} {'vs enc':>7} "
            f"{'ran':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if r["variant"] == "edit":
            print(f"{r['corpus']:<10} {r['embedder']:<8} {r['variant']:<10} {1:>6} "
                  f"{r['chunks']:>7} {r['seconds']:>8.2f}  embedded {r['embedded']} of "
                  f"{r['chunks']} chunks, {r['rows_inserted']} row(s) rewritten")
            continue
        ran = f"{r['executed']}/{r['tasks']}" if "tasks" in r else ""
        print(f"{r['corpus']:<10} {r['embedder']:<8} {r['variant']:<10} {r['documents']:>6} "
              f"{r['chunks']:>7} {r['seconds']:>8.2f} {r['docs_per_s']:>9.1f} "
              f"{r['chunks_per_s']:>9.1f} {r['vs_loop']:>7.2f} {r['vs_encode']:>7.2f} "
              f"{ran:>8}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000, help="generated corpus size")
    parser.add_argument("--embedders", default="hashing,minilm",
                        help="comma-separated embedder names (default hashing,minilm)")
    parser.add_argument("--corpora", default="bundled,generated",
                        help="which corpora: bundled, generated (default both)")
    parser.add_argument("--workers", type=int, default=None, help="pipeline workers")
    parser.add_argument("--out", default="perf-results-doc_index.json", help="JSON output")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--no-edit", action="store_true", help="skip the one-word edit")
    parser.add_argument("--throughput", type=int, default=0, metavar="N",
                        help="only compare the pipeline with the embedder alone, N times "
                             "interleaved, on the bundled corpus")
    args = parser.parse_args(argv)

    from ledgerflow_embed import encode, get_embedder

    work = Path(tempfile.mkdtemp(prefix="bench_doc_index_"))
    results: list[dict[str, Any]] = []
    loads: dict[str, float] = {}
    try:
        corpora = {}
        if "bundled" in args.corpora:
            corpora["bundled"] = CORPUS
        if "generated" in args.corpora and not args.throughput:
            start = time.perf_counter()
            corpora[f"gen{args.docs}"] = generate_corpus(work / "generated", args.docs)
            print(f"generated {args.docs} documents in {time.perf_counter() - start:.1f}s")
        for name in args.embedders.split(","):
            start = time.perf_counter()
            encode(get_embedder(name), ["warm up"])  # load the model before timing
            loads[name] = time.perf_counter() - start
            if args.throughput:
                tp = throughput(name, args.workers, work, args.throughput)
                print(f"{name}: pipeline throughput / encode alone: median {tp['median_ratio']:.2f}"
                      f", best {tp['best_ratio']:.2f}, cpu time {tp['cpu_ratio']:.2f}")
                results.append({"variant": "throughput", **tp})
                continue
            for corpus_name, source in corpora.items():
                rows = bench(corpus_name, source, name, args.workers, work)
                results += rows
                print_table(rows)
                print()
            if not args.no_edit:
                edit = one_word_edit(name, args.workers, work)
                results.append(edit)
                print_table([edit])
                print()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("all results:")
    print_table([r for r in results if r["variant"] != "throughput"])
    print("model load seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in loads.items()))
    report = {"machine": {"python": platform.python_version(), "platform": platform.platform(),
                          "cpus": os.cpu_count()},
              "model_load_seconds": loads, "results": results}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


def test_bench_doc_index_smoke(tmp_path: Path) -> None:
    """A tiny run of the benchmark (only when this file is passed to pytest explicitly)."""
    out = tmp_path / "bench.json"
    assert main(["--docs", "40", "--embedders", "hashing", "--corpora", "generated",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    variants = {r["variant"]: r for r in report["results"]}
    assert variants["loop"]["documents"] == variants["pipeline"]["documents"] == 40
    assert variants["loop"]["chunks"] == variants["pipeline"]["chunks"]
    assert variants["loop-bulk"]["chunks"] == variants["loop"]["chunks"]
    assert variants["rerun"]["executed"] == 3  # open_index, discover, prune
    assert variants["encode"]["chunks"] == variants["pipeline"]["chunks"]
    (edit,) = [r for r in report["results"] if r["variant"] == "edit"]
    assert edit["chunks"] == 75 and 1 <= edit["embedded"] <= 2


if __name__ == "__main__":
    raise SystemExit(main())
