"""Benchmark the ``local`` model provider; prints a table, writes JSON.

Run from the repository root (not collected by pytest: no ``test_`` prefix)::

    .venv/bin/python tests/perf/bench_local_model.py [--cold] [--out bench_local_model.json]

Measures (1) load time: from the model cache (a fresh process) and, with
``--cold``, converting the GGUF into a fresh cache; (2) speed: prompt
(prefill) tokens per second and generated tokens per second, plain forward
passes with 1 and 2 torch threads, and whole constrained tool calls;
(3) tool choice on nine small prompts (search vs read vs save vs answer).
The machine's load average is printed: other processes slow torch a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.agents.conftest import TOOLS

CASES = [("search the index for patents", "search_index"),
         ("read the document notes/readme.txt", "read_document"),
         ("save the answer 'yes' to the file result.txt", "save_answer"),
         ("what does the license say about patents?", "search_index"),
         ("look up warranty in the docs", "search_index"),
         ("show me the contents of docs/faq.md", "read_document"),
         ("which documents mention caching?", "search_index"),
         ("write 'no' into answer.md", "save_answer"),
         ("hello, who are you?", None)]
EXAMPLES = [("how much is 2 plus 2?", {"answer": "4"}), ("thanks!", {"answer": "You are welcome."})]

LOAD = """
import sys, time, json
t = time.perf_counter()
from ledgerflow_agents.local import LocalModel
m = LocalModel(cache_dir=sys.argv[1] if len(sys.argv) > 1 else None)
b = m.backend()
print(json.dumps({"seconds": time.perf_counter() - t, "converted": b.converted}))
"""


def load_in_subprocess(cache: str | None) -> dict[str, Any]:
    args = [sys.executable, "-c", LOAD] + ([cache] if cache else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=900)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def forward_speed(backend: Any, threads: int, prompt_len: int = 400, steps: int = 20
                  ) -> tuple[float, float]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ids = torch.randint(100, 40000, (1, prompt_len), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            t = time.perf_counter()
            out = backend.model(ids, use_cache=True)
            prefill = prompt_len / (time.perf_counter() - t)
            cache, nxt = out.past_key_values, torch.tensor([[42]])
            t = time.perf_counter()
            for _ in range(steps):
                cache = backend.model(nxt, past_key_values=cache, use_cache=True).past_key_values
            decode = steps / (time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return prefill, decode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="also time converting the GGUF")
    ap.add_argument("--out", default="bench_local_model.json")
    args = ap.parse_args()
    from ledgerflow_agents import ModelRequest
    from ledgerflow_agents.local import LocalModel

    results: dict[str, Any] = {"loadavg_start": os.getloadavg()[0]}
    if args.cold:
        with tempfile.TemporaryDirectory() as tmp:
            results["load_cold_convert_s"] = load_in_subprocess(tmp)["seconds"]
            results["load_from_fresh_cache_s"] = load_in_subprocess(tmp)["seconds"]
    results["load_from_cache_s"] = load_in_subprocess(None)["seconds"]
    model = LocalModel(examples=EXAMPLES)
    backend = model.backend()
    for threads in (1, 2):
        prefill, decode = forward_speed(backend, threads)
        results[f"prefill_tok_s_{threads}t"] = prefill
        results[f"decode_tok_s_{threads}t"] = decode
    choices, seconds, generated = [], 0.0, 0
    for prompt, want in CASES:
        req = ModelRequest([{"role": "user", "content": prompt}], tools=TOOLS,
                           max_output_tokens=48)
        t = time.perf_counter()
        resp = model.complete(req)
        seconds += time.perf_counter() - t
        generated += resp.usage.output_tokens
        got = resp.tool_calls[0]["name"] if resp.tool_calls else None
        choices.append({"prompt": prompt, "want": want, "got": got,
                        "arguments": resp.tool_calls[0]["arguments"] if resp.tool_calls else None,
                        "text": resp.text, "input_tokens": resp.usage.input_tokens,
                        "output_tokens": resp.usage.output_tokens})
    results["tool_calls_s_mean"] = seconds / len(CASES)
    results["tool_call_generated_tok_s"] = generated / seconds
    results["tool_choice_right"] = sum(c["want"] == c["got"] for c in choices)
    results["tool_choice_of"] = len(choices)
    results["loadavg_end"] = os.getloadavg()[0]
    for key, value in results.items():
        print(f"{key:32} {value:.2f}" if isinstance(value, float) else f"{key:32} {value}")
    for c in choices:
        mark = "ok " if c["want"] == c["got"] else "BAD"
        print(f"  {mark} {c['prompt']!r} -> {c['got']} {c['arguments'] or c['text']!r}")
    Path(args.out).write_text(json.dumps({**results, "choices": choices}, indent=2))


if __name__ == "__main__":
    main()
